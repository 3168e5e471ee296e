//! One forward pass: the layer loop with its uploads, attention rounds and page selection, then
//! the output head.

use crate::flash::Admit;
use crate::flash::queue::{Priority, Ticket};
use crate::kernels::{self, Step};
use crate::kv::pages::{PageList, Round};

use super::trace::{TID_HOST, TID_IO};
use super::upload::{JobResult, OwnedReq};
use super::{Engine, EngineError};
use crate::gguf::quant;

fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// A layer's attention work for one round: each sequence's page list (with this round's stream
/// slots) and, per sequence, the pages the round brings in as (page, slot).
#[derive(Clone)]
pub(super) struct RoundWork {
    pub(super) lists: Vec<(u32, PageList)>,
    pub(super) loads: Vec<(u32, Vec<(u32, u32)>)>,
    pub(super) round: Round,
    /// Pages read from flash but not admitted to the host cache (sorted): a selection's kept
    /// pages that the cache lacks (see `plan::hitrate`, lagged selection).
    pub(super) transient: Vec<u32>,
}

impl RoundWork {
    pub(super) fn has_loads(&self) -> bool {
        self.loads.iter().any(|l| !l.1.is_empty())
    }
}

/// The rounds over the sequences' lists (by the longest): the sequences' streamed pages of a
/// round share the stream pool's part for that round, one after another. A pass of one row
/// (`one_row`) takes the longer decode rounds.
pub(super) fn plan_rounds(
    map: &crate::kv::pages::PageMap,
    mut lists: Vec<(u32, PageList)>,
    one_row: bool,
) -> Vec<RoundWork> {
    let keys = lists.iter().map(|l| l.1.keys).max().unwrap_or(0);
    let rounds = if one_row {
        map.decode_rounds(keys)
    } else {
        map.rounds(keys)
    };
    rounds
        .into_iter()
        .enumerate()
        .map(|(r, round)| {
            let mut next = map.round_base(r);
            let mut loads = Vec::with_capacity(lists.len());
            for (seq, list) in lists.iter_mut() {
                let l = list.assign_round(&round, next);
                next += l.len() as u32;
                loads.push((*seq, l));
            }
            RoundWork {
                lists: lists.clone(),
                loads,
                round,
                transient: Vec::new(),
            }
        })
        .collect()
}

/// `reqs` as one request, when they are one run of the file into one buffer, each at the same
/// distance from the first as in the file.
fn one_read(reqs: &[OwnedReq]) -> Option<OwnedReq> {
    let first = reqs.iter().min_by_key(|r| r.src_offset)?;
    let mut end = first.src_offset;
    for r in reqs {
        let d = r.src_offset - first.src_offset;
        if r.dst != first.dst || r.dst_offset.checked_sub(first.dst_offset)? != d {
            return None;
        }
        end = end.max(r.src_offset + r.len);
    }
    Some(OwnedReq {
        src_offset: first.src_offset,
        len: end - first.src_offset,
        dst: first.dst.clone(),
        dst_offset: first.dst_offset,
    })
}

impl Engine {
    /// The need stamp of layer `l`'s bytes in this pass (`next`: in the pass after it): layers
    /// count on across passes, the output head after the last layer.
    pub(super) fn need_of(&self, l: usize, next: bool) -> u64 {
        (self.pass_no + next as u64) * (self.layers.len() as u64 + 1) + l as u64
    }

    /// Queue streamed layer `si` (index into `streamed`) into slot `si % slots`, for this pass
    /// or (`next`) the next one.
    pub(super) fn queue_weights(&mut self, si: usize, next: bool) {
        let l = self.streamed[si];
        let need = self.need_of(l, next);
        // Ask for the streamed layer after this one ahead of its read.
        if let Some(&after) = self.streamed.get((si + 1) % self.streamed.len()) {
            for t in &self.plan.layers[after].files {
                self.io_.source().prefetch(t.offset, t.n_bytes);
            }
        }
        let mut reqs = Vec::new();
        let mut hints = Vec::new();
        for (t, w) in self.plan.layers[l]
            .files
            .iter()
            .zip(self.stream_mats[si].all())
        {
            for p in &w.parts {
                reqs.push(OwnedReq {
                    src_offset: t.offset + p.r0 as u64 * w.row_bytes as u64,
                    len: p.n as u64 * w.row_bytes as u64,
                    dst: p.buf.buffer.clone(),
                    dst_offset: p.offset,
                });
            }
            hints.push((t.offset, t.n_bytes));
        }
        if self.plan.slot.span
            && let Some(one) = one_read(&reqs)
        {
            // The layer lies in its slot as in the file: one read.
            reqs = vec![one];
        }
        let after = self.slot_use[si % self.n_slots.max(1)].clone();
        self.weight_tickets[si] = Some(if self.in_place {
            self.io_.weights_in_place(need, reqs, hints, after)
        } else {
            self.io_.weights(need, reqs, hints)
        });
    }

    /// Queue the next pass's first streamed layers (as many as there are layer slots), once
    /// this pass has submitted the last compute that reads their slots (its output head, which
    /// may stream through them): their reads then run while the device finishes the head and
    /// the host reads the logits back and samples, rather than after.
    pub(super) fn queue_next_pass(&mut self) {
        let window = self.n_slots.min(self.streamed.len());
        while self.prefetched < window {
            let k = self.prefetched;
            self.queue_weights(k, true);
            self.prefetched += 1;
        }
    }

    /// Wait for a job and account for it.
    pub(super) fn finish_job(
        &mut self,
        ticket: Ticket<JobResult>,
        name: impl Into<String>,
    ) -> Result<(), EngineError> {
        let t = self.tracer.now();
        let r = ticket
            .wait()
            .map_err(|e| EngineError::Transfer(e.to_string()))?
            .map_err(EngineError::Transfer)?;
        self.io.upload.add(&r.upload);
        self.io.upload_s += r.end - r.start;
        self.io.wait_s += self.tracer.now() - t;
        self.kv_stats.fetch.add(&r.kv);
        let name = name.into();
        if self.tracer.keeps() {
            // When the engine queued it: a zero-length span on the host's row.
            let q = format!("queue {name}");
            self.tracer
                .span_at(q, "queue", TID_HOST, r.queued, r.queued);
        }
        self.tracer.span_at(name, "io", TID_IO, r.start, r.end);
        Ok(())
    }

    pub(super) fn submit(&mut self, enc: wgpu::CommandEncoder, name: String) {
        self.flush_table();
        self.last_submission = Some(self.ctx.queue.submit([enc.finish()]));
        self.tracer.gpu_submitted(&self.ctx.queue, name);
    }

    /// Queue the KV pages of round `w` of layer `l` into the stream pool (a job per sequence).
    fn queue_round(&self, prio: Priority, l: usize, w: &RoundWork) -> Vec<Ticket<JobResult>> {
        w.loads
            .iter()
            .filter(|(_, ld)| !ld.is_empty())
            .map(|(seq, ld)| self.queue_kv(prio, l, *seq, ld, &w.transient))
            .collect()
    }

    /// Queue pages (page, slot) of sequence `seq`, layer `l`, into the stream pool.
    fn queue_kv(
        &self,
        prio: Priority,
        l: usize,
        seq: u32,
        loads: &[(u32, u32)],
        transient: &[u32],
    ) -> Ticket<JobResult> {
        let admit = if self.plan.kv.selects_layer(l) {
            Admit::Lru
        } else {
            Admit::Pinned
        };
        self.io_.kv_pages(
            self.need_of(l, false),
            prio,
            seq,
            l as u32,
            loads.to_vec(),
            self.plan.kv.page_bytes,
            self.kvb.stream.buffer.clone(),
            admit,
            transient.to_vec(),
        )
    }

    /// One pass through all layers over the rows of `items` (each a sequence and the tokens it
    /// appends, rows in item order); logits for the rows in `want` go to `on_logits`.
    pub(super) fn run_batch(
        &mut self,
        items: &[(u32, &[u32])],
        want: &[usize],
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        self.pass_no += 1;
        // Head chunks a failed pass left queued are not this pass's.
        self.head_early.clear();
        let t: usize = items.iter().map(|i| i.1.len()).sum();
        // (sequence, first position, end position) of each item.
        let spans: Vec<(u32, usize, usize)> = items
            .iter()
            .map(|&(s, toks)| {
                let a = self.seqs[s as usize].tokens.len();
                (s, a, a + toks.len())
            })
            .collect();
        let n_embd = self.cfg.n_embd;
        let th = self.tracer.now();
        // Embedding rows, gathered from the file (around the host cache: see `read_uncached`).
        let mut x = vec![0f32; t * n_embd];
        let row_bytes = self.embd.row_bytes() as usize;
        let mut row = vec![0u8; row_bytes];
        for (i, &id) in items.iter().flat_map(|i| i.1.iter()).enumerate() {
            let off = self.embd.offset + id as u64 * row_bytes as u64;
            self.io_
                .source()
                .read_uncached(off, &mut row)
                .map_err(|e| EngineError::Flash(e.to_string()))?;
            quant::dequantize(self.embd.ty, &row, &mut x[i * n_embd..(i + 1) * n_embd]);
            self.io.embd_bytes += row_bytes as u64;
        }
        if let Some(s) = self.cfg.embd_scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
        let mut positions: Vec<u32> = Vec::with_capacity(t);
        let mut rows = Vec::with_capacity(4 * t);
        for &(seq, a, b) in &spans {
            for p in a..b {
                positions.push(p as u32);
                rows.extend_from_slice(&[seq, p as u32, self.map.row_elem_of(seq, p), 0]);
            }
        }
        let step = Step {
            n_tokens: t as u32,
            pos0: spans.first().map_or(0, |s| s.1) as u32,
            _pad: [0; 2],
        };
        self.ctx
            .write(&self.bufs.step, 0, bytemuck::bytes_of(&step));
        self.ctx.write(&self.bufs.x, 0, f32_bytes(&x));
        self.ctx
            .write(&self.bufs.rows, 0, bytemuck::cast_slice(&rows));
        let table = |r: &crate::model::rope::RopeConfig| {
            let freqs = r.freqs(self.cfg.rope_dim, self.max_ctx);
            kernels::rope_table_freqs(&positions, &freqs, r.attn_factor)
        };
        self.ctx
            .write(&self.bufs.rope_cs, 0, f32_bytes(&table(&self.cfg.rope)));
        if let Some(buf) = &self.bufs.rope_cs_swa {
            self.ctx
                .write(buf, 0, f32_bytes(&table(&self.cfg.rope_swa)));
        }
        // Page selection, its page summaries and its prefetches serve a single sequence
        // (the plan refuses selection with several).
        let (seq0, a0, b0) = spans[0];
        let top = self.map.page_of(b0 - 1);
        if let Some(jobs) = &self.kvb.jobs {
            let filled = self.map.filled(a0, b0);
            let mut w = vec![filled.len() as u32, 0, 0, 0];
            for p in filled {
                w.extend_from_slice(&[p, self.map.home_slot(p), self.map.page_tokens, 0]);
            }
            self.ctx.write(jobs, 0, bytemuck::cast_slice(&w));
        }
        for &(seq, a, b) in &spans {
            for p in self.map.page_of(a)..=self.map.page_of(b - 1) {
                let s = self.map.home_slot(p) as usize;
                if let Some(o) = self.seqs[seq as usize].slot_owner.get_mut(s) {
                    *o = p;
                }
            }
        }
        self.tracer.span("embed", "host", TID_HOST, th);

        let n_s = self.streamed.len();
        let window = self.n_slots.min(n_s);
        while self.prefetched < window {
            let k = self.prefetched;
            self.queue_weights(k, false);
            self.prefetched += 1;
        }
        self.prefetched = 0;
        let single = spans.len() == 1;
        let decode = single && t == 1;
        // Decode-form kernels (one token per weight read) for every row when each sequence
        // appends one token (a batched decode step gives each sequence exactly what it gets
        // alone) or when verifying drafted tokens.
        let dl = decode || self.decode_form || items.iter().all(|i| i.1.len() == 1);
        let exact = plan_rounds(
            &self.map,
            spans
                .iter()
                .map(|&(s, _, b)| (s, PageList::exact(&self.map, b - 1).for_seq(&self.map, s)))
                .collect(),
            decode,
        );
        // Local layers attend only the pages some row's window reaches.
        let local_lists: Vec<(u32, PageList)> = spans
            .iter()
            .map(|&(s, a, b)| {
                let first = self
                    .cfg
                    .swa_window
                    .map_or(0, |w| (a + 1).saturating_sub(w as usize));
                (
                    s,
                    PageList::exact_from(&self.map, first, b - 1).for_seq(&self.map, s),
                )
            })
            .collect();
        let local_page = self.map.page_of(
            self.cfg
                .swa_window
                .map_or(0, |w| (a0 + 1).saturating_sub(w as usize)),
        );
        let exact_local = plan_rounds(&self.map, local_lists, decode);
        let per_layer = self.placement.streaming
            || self.plan.kv.streams
            || exact.len() > 1
            || exact_local.len() > 1
            || (decode && self.plan.kv.select.is_some());
        let local: Vec<bool> = (0..self.layers.len()).map(|l| self.cfg.is_swa(l)).collect();
        let exact_of = |l: usize| {
            if local[l] { &exact_local } else { &exact }
        };
        // Lagged selection: each selecting layer's pages from the previous step's scores,
        // known now (None: that layer waits for its own scores this step).
        let lagging = decode && self.kvb.scores_lag.is_some();
        let mut lagged: Vec<Option<Vec<RoundWork>>> = (0..self.layers.len())
            .map(|l| {
                if lagging && self.plan.kv.selects_layer(l) {
                    let lo = if local[l] { local_page } else { 0 };
                    self.lagged_pages(l, top, b0 - 1, lo)
                } else {
                    None
                }
            })
            .collect();
        // Layers that wait for their page scores at this step.
        let selecting: Vec<bool> = (0..self.layers.len())
            .map(|l| decode && self.plan.kv.selects_layer(l))
            .collect();
        let waits =
            |l: usize, lagged: &[Option<Vec<RoundWork>>]| selecting[l] && lagged[l].is_none();
        // The page table of every layer whose pages are known now and fit one round, written
        // with the first submission: the layers' own writes then change nothing, and the pass
        // makes one staging write instead of one a submission (each a staging allocation).
        for l in 0..self.layers.len() {
            if waits(l, &lagged) {
                continue;
            }
            let work = lagged[l].as_ref().unwrap_or_else(|| exact_of(l));
            if let [w] = work.as_slice() {
                self.write_table(l, w, true, top);
            }
        }
        let mut scored: Vec<usize> = Vec::new();
        // A streamed layer's weights held back until the next layer, which waits for its page
        // scores, has queued the pages it chose: read earlier, they would be the I/O job in
        // flight when the scores come back, and the chosen pages (needed at once, while the
        // device idles) would wait behind them.
        let mut deferred: Option<usize> = None;
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        // KV pages of the first layer's first round.
        let mut next_kv: Vec<Ticket<JobResult>> = Vec::new();
        if let Some(w) = &lagged[0] {
            next_kv = self.queue_round(Priority::HotKv, 0, &w[0]);
        } else if !waits(0, &lagged) {
            next_kv = self.queue_round(Priority::HotKv, 0, &exact_of(0)[0]);
        } else {
            self.prefetch_selection(0, top);
        }
        for (l, &is_local) in local.iter().enumerate() {
            if self.layers[l].mats.is_none() {
                let si = self.streamed.iter().position(|&x| x == l).unwrap_or(0);
                if let Some(tk) = self.weight_tickets[si].take() {
                    self.finish_job(tk, format!("read+upload layer {l}"))?;
                }
            }
            let select = waits(l, &lagged);
            {
                let lists = if dl {
                    &self.decode_lists[l]
                } else {
                    &self.prefill_lists[l]
                };
                let (pre, _) = lists.before_attention(t);
                kernels::record_all_with(&mut enc, pre, t as u32, self.profiler.as_mut());
            }
            let work = if select {
                let lo = if is_local { local_page } else { 0 };
                let w = self.select_pages(l, enc, top, b0 - 1, lo)?;
                enc = self.ctx.device.create_command_encoder(&Default::default());
                w
            } else if let Some(w) = lagged[l].take() {
                self.record_lagged_scores(l, &mut enc, top)?;
                scored.push(l);
                w
            } else {
                exact_of(l).clone()
            };
            let n_rounds = work.len();
            let mut tickets: Vec<Vec<Ticket<JobResult>>> =
                (0..n_rounds).map(|_| Vec::new()).collect();
            if !select && work[0].has_loads() {
                tickets[0] = std::mem::take(&mut next_kv);
            }
            if select {
                if work[0].has_loads() {
                    tickets[0] = self.queue_round(Priority::HotKv, l, &work[0]);
                }
                if let Some(si) = deferred.take() {
                    self.queue_weights(si, false);
                }
            }
            let halves = self.map.halves;
            for (ri, w) in work.iter().enumerate() {
                if w.has_loads() && tickets[ri].is_empty() {
                    tickets[ri] = self.queue_round(Priority::HotKv, l, w);
                }
                // The next round fills the other half of the pool while this one attends.
                if halves == 2
                    && ri + 1 < n_rounds
                    && tickets[ri + 1].is_empty()
                    && work[ri + 1].has_loads()
                {
                    tickets[ri + 1] = self.queue_round(Priority::HotKv, l, &work[ri + 1]);
                }
                if w.has_loads() {
                    // Submit what is recorded before blocking on the pages.
                    let ready = std::mem::replace(
                        &mut enc,
                        self.ctx.device.create_command_encoder(&Default::default()),
                    );
                    self.submit(ready, format!("layer {l} (before round {ri})"));
                    for tk in std::mem::take(&mut tickets[ri]) {
                        self.finish_job(tk, format!("read+upload KV layer {l} round {ri}"))?;
                    }
                }
                self.write_table(l, w, ri + 1 == n_rounds, top);
                let lists = if dl {
                    &self.decode_lists[l]
                } else {
                    &self.prefill_lists[l]
                };
                // Prefill of one sequence: the row-tiled attention (its rows are in
                // position order).
                let attn = if let (_, Some(fused)) = lists.before_attention(t) {
                    fused
                } else if !dl && single && !lists.attn_tiled.is_empty() {
                    &lists.attn_tiled
                } else {
                    &lists.attn
                };
                // A lone round of one split writes the output itself: no merge.
                let splits = w.round.splits.max(1);
                let attn = if n_rounds == 1 && splits == 1 {
                    &attn[..1]
                } else {
                    attn
                };
                kernels::record_round_with(
                    &mut enc,
                    attn,
                    t as u32,
                    Some(splits),
                    self.profiler.as_mut(),
                );
                if ri + 1 == n_rounds {
                    kernels::record_all_with(
                        &mut enc,
                        &lists.post,
                        t as u32,
                        self.profiler.as_mut(),
                    );
                }
                if ri + 1 < n_rounds || per_layer {
                    let done = std::mem::replace(
                        &mut enc,
                        self.ctx.device.create_command_encoder(&Default::default()),
                    );
                    self.submit(done, format!("layer {l}"));
                }
            }
            // Queue what the next layers need behind this layer's compute.
            if self.layers[l].mats.is_none() {
                let si = self.streamed.iter().position(|&x| x == l).unwrap_or(0);
                // The layer's last submission is the last to read its slot.
                self.slot_use[si % self.n_slots.max(1)] = self.last_submission.clone();
                let next = si + self.n_slots;
                let next_waits = l + 1 < self.layers.len() && waits(l + 1, &lagged);
                if next < n_s {
                    if next_waits {
                        deferred = Some(next);
                    } else {
                        self.queue_weights(next, false);
                    }
                } else if !want.is_empty() && !next_waits {
                    // Past the last streamed layer: the output head's chunks take the slots
                    // the layers leave.
                    self.prequeue_head(si);
                }
            }
            if l + 1 < self.layers.len() && next_kv.is_empty() {
                if let Some(w) = &lagged[l + 1] {
                    next_kv = self.queue_round(Priority::HotKv, l + 1, &w[0]);
                } else if waits(l + 1, &lagged) {
                    self.prefetch_selection(l + 1, top);
                } else {
                    next_kv = self.queue_round(Priority::HotKv, l + 1, &exact_of(l + 1)[0]);
                }
            }
        }
        if let Some(si) = deferred.take() {
            self.queue_weights(si, false);
        }
        if !per_layer {
            self.submit(enc, "layers".into());
        } else {
            drop(enc);
        }
        // The head queues the next pass's first streamed layers once it has submitted its
        // last use of their slots (see `queue_next_pass`).
        self.head_pass(t, want, on_logits)?;
        if lagging {
            self.read_lagged_scores(&scored, top)?;
        }
        for tk in std::mem::take(&mut self.pending_prefetch) {
            self.finish_job(tk, "prefetch KV")?;
        }
        for &(seq, toks) in items {
            self.seqs[seq as usize].tokens.extend_from_slice(toks);
        }
        for &(seq, a, b) in &spans {
            self.page_out(seq, a, b)?;
        }
        let _ = seq0;
        if let Some(p) = self.profiler.as_mut() {
            p.collect(&self.ctx)?;
        }
        Ok(())
    }
}
