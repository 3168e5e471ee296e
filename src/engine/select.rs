//! The page work of a pass at decode: predictive prefetch of the previous token's selection,
//! Quest page selection, and writing filled pages out to the page file.

use crate::kernels;
use crate::kv::pages::PageList;

use super::pass::{RoundWork, plan_rounds};
use super::trace::{TID_HOST, TID_IO};
use super::{Engine, EngineError};

impl Engine {
    /// Predictive prefetch: the pages layer `l` selected for the previous token, if they are
    /// still away from the device.
    pub(super) fn prefetch_selection(&mut self, l: usize, top: u32) {
        if self.io_.store.is_none() {
            return;
        }
        let pages: Vec<u32> = self.seqs[0].prev_sel[l]
            .iter()
            .copied()
            .filter(|&p| !self.map.is_home(p, top))
            .collect();
        if pages.is_empty() {
            return;
        }
        let need = self.need_of(l, false);
        let t = self
            .io_
            .prefetch_pages(need, 0, l as u32, pages, self.plan.kv.page_bytes);
        self.pending_prefetch.push(t);
    }

    /// Page 0 and the recent window are always attended; the other pages from `lo` (outside a
    /// sliding window below it) up to `top` compete.
    fn candidates(&self, top: u32, lo: u32) -> Vec<u32> {
        let win = self.plan.kv.select_window;
        (lo..top).filter(|&p| p != 0 && p + win <= top).collect()
    }

    fn keep_of(&self, candidates: usize) -> usize {
        let sel = self.plan.kv.select.unwrap_or(crate::plan::KvSelect {
            spec: crate::plan::SelectSpec::Pages(u32::MAX),
            dense_layers: 0,
            lagged: false,
        });
        sel.keep(candidates as u32) as usize
    }

    fn logit(&self) -> crate::kv::select::Logit {
        crate::kv::select::Logit {
            scale: self.cfg.attn_scale,
            softcap: self.cfg.attn_softcap,
        }
    }

    /// Record layer `l`'s page-score kernel into `enc` (the page count in the table header).
    fn record_scores(
        &mut self,
        l: usize,
        enc: &mut wgpu::CommandEncoder,
        n_full: u32,
    ) -> Result<(), EngineError> {
        let base = l * self.plan.kv.layer_words as usize;
        self.table_write(base, &[0u32, 0, 0, n_full]);
        let Some(score) = self.decode_lists[l].score.as_ref() else {
            return Err(EngineError::Transfer("page scores are not set up".into()));
        };
        kernels::record_all_with(enc, std::slice::from_ref(score), 1, self.profiler.as_mut());
        Ok(())
    }

    /// Page selection for layer `l` at decode: score the pages (submitting `enc`, which holds
    /// the layer's pre-attention work), read the scores back, keep the best pages. Pages below
    /// `lo` (outside a sliding window) do not compete. Under lagged selection the scores are
    /// kept for the next token.
    pub(super) fn select_pages(
        &mut self,
        l: usize,
        mut enc: wgpu::CommandEncoder,
        top: u32,
        last_pos: usize,
        lo: u32,
    ) -> Result<Vec<RoundWork>, EngineError> {
        let candidates = self.candidates(top, lo);
        let keep = self.keep_of(candidates.len());
        let heads = self.cfg.n_heads;
        let chosen: Vec<u32> = if keep >= candidates.len() {
            let done = std::mem::replace(
                &mut enc,
                self.ctx.device.create_command_encoder(&Default::default()),
            );
            self.submit(done, format!("layer {l} (pre-attention)"));
            candidates.clone()
        } else {
            self.record_scores(l, &mut enc, top)?;
            let (Some(scores), Some(rb)) = (self.kvb.scores.as_ref(), self.kvb.scores_rb.as_ref())
            else {
                return Err(EngineError::Transfer("page scores are not set up".into()));
            };
            let bytes = top as u64 * heads as u64 * 4;
            enc.copy_buffer_to_buffer(scores, 0, rb, 0, bytes.max(4));
            let rb = rb.buffer.clone();
            self.submit(enc, format!("layer {l} (pre-attention, scores)"));
            let th = self.tracer.now();
            let raw = self.ctx.read_mapped(&rb, bytes.max(4))?;
            self.tracer
                .span(format!("page scores layer {l}"), "wait", TID_HOST, th);
            self.kv_stats.score_waits += 1;
            let s: Vec<f32> = bytemuck::pod_collect_to_vec(&raw);
            let chosen = crate::kv::select::keep_pages(&s, heads, &candidates, keep, self.logit());
            if self.kvb.scores_lag.is_some() {
                self.seqs[0].lag_scores[l] = s;
            }
            chosen
        };
        Ok(self.selection_rounds(l, chosen, candidates.len(), top, last_pos))
    }

    /// Lagged selection for layer `l` at decode: the pages chosen by the previous step's
    /// scores (None without them: select as plain quest does). Candidates filled since those
    /// scores were taken have none and are attended. This step's scores are recorded by
    /// [`Self::record_lagged_scores`] and read by [`Self::read_lagged_scores`].
    pub(super) fn lagged_pages(
        &mut self,
        l: usize,
        top: u32,
        last_pos: usize,
        lo: u32,
    ) -> Option<Vec<RoundWork>> {
        let heads = self.cfg.n_heads;
        let prev = &self.seqs[0].lag_scores[l];
        let full = (prev.len() / heads.max(1)) as u32;
        if full == 0 || full > top {
            return None;
        }
        let candidates = self.candidates(top, lo);
        let keep = self.keep_of(candidates.len());
        let (scored, unscored): (Vec<u32>, Vec<u32>) = candidates.iter().partition(|&&p| p < full);
        let mut chosen = crate::kv::select::keep_pages(
            prev,
            heads,
            &scored,
            keep.min(scored.len()),
            self.logit(),
        );
        chosen.extend(unscored);
        chosen.sort_unstable();
        Some(self.selection_rounds(l, chosen, candidates.len(), top, last_pos))
    }

    /// Record layer `l`'s page scores for the next step's lagged selection into `enc`.
    pub(super) fn record_lagged_scores(
        &mut self,
        l: usize,
        enc: &mut wgpu::CommandEncoder,
        top: u32,
    ) -> Result<(), EngineError> {
        self.record_scores(l, enc, top)?;
        let (Some(scores), Some(rb)) = (self.kvb.scores.as_ref(), self.kvb.scores_lag.as_ref())
        else {
            return Err(EngineError::Transfer(
                "lagged page scores are not set up".into(),
            ));
        };
        let stride = self.plan.kv.max_pages as u64 * self.cfg.n_heads as u64 * 4;
        let bytes = top as u64 * self.cfg.n_heads as u64 * 4;
        if bytes > 0 {
            enc.copy_buffer_to_buffer(scores, 0, rb, l as u64 * stride, bytes);
        }
        Ok(())
    }

    /// After a decode step: read back the scores `layers` recorded, for the next step's
    /// lagged selection (`top`: the step's page count).
    pub(super) fn read_lagged_scores(
        &mut self,
        layers: &[usize],
        top: u32,
    ) -> Result<(), EngineError> {
        let Some(rb) = self.kvb.scores_lag.as_ref() else {
            return Ok(());
        };
        let Some(&last) = layers.iter().max() else {
            return Ok(());
        };
        let heads = self.cfg.n_heads;
        let stride = self.plan.kv.max_pages as usize * heads;
        let th = self.tracer.now();
        let raw = self
            .ctx
            .read_mapped(&rb.buffer, ((last + 1) * stride * 4) as u64)?;
        self.tracer.span("lagged page scores", "wait", TID_HOST, th);
        let all: Vec<f32> = bytemuck::pod_collect_to_vec(&raw);
        let n = top as usize * heads;
        for &l in layers {
            let s = all.get(l * stride..l * stride + n).unwrap_or_default();
            self.seqs[0].lag_scores[l] = s.to_vec();
        }
        Ok(())
    }

    /// The rounds of layer `l` attending page 0, the recent window and `chosen` (out of
    /// `n_candidates`), with the selection's statistics; the pages kept from the previous
    /// selection are transient (see [`RoundWork::transient`]).
    fn selection_rounds(
        &mut self,
        l: usize,
        chosen: Vec<u32>,
        n_candidates: usize,
        top: u32,
        last_pos: usize,
    ) -> Vec<RoundWork> {
        let prev = &self.seqs[0].prev_sel[l];
        let kept: Vec<u32> = chosen
            .iter()
            .copied()
            .filter(|p| prev.binary_search(p).is_ok())
            .collect();
        if !prev.is_empty() && !chosen.is_empty() {
            self.kv_stats.reuse_hits += kept.len() as u64;
            self.kv_stats.reuse_total += chosen.len() as u64;
        }
        self.kv_stats.selected_pages += chosen.len() as u64;
        self.kv_stats.candidate_pages += n_candidates as u64;
        self.kv_stats.selections += 1;
        let win = self.plan.kv.select_window;
        let mut pages: Vec<u32> = (0..=top)
            .filter(|&p| p == 0 || p + win > top || chosen.binary_search(&p).is_ok())
            .collect();
        pages.dedup();
        self.seqs[0].prev_sel[l] = chosen;
        let list = PageList::of_pages(&self.map, pages, last_pos);
        let mut rounds = plan_rounds(&self.map, vec![(0, list)], true);
        // Kept pages the host cache lacks are read and used, not admitted: admitting them
        // would turn the selections into a cyclic scan of the cache (`plan::hitrate`).
        for r in &mut rounds {
            r.transient = kept.clone();
        }
        rounds
    }

    /// Write the pages that filled up during positions `[a, b)` to the page file, every layer.
    pub(super) fn page_out(&mut self, seq: u32, a: usize, b: usize) -> Result<(), EngineError> {
        let Some(store) = self.io_.store.clone() else {
            return Ok(());
        };
        let si = seq as usize;
        let pages: Vec<u32> = self
            .map
            .filled(a, b)
            .filter(|&p| p >= self.seqs[si].written)
            .collect();
        if pages.is_empty() {
            return Ok(());
        }
        let th = self.tracer.now();
        let pb = self.plan.kv.page_bytes;
        let per = self.plan.kv.pageout_pages.max(1) as usize;
        let jobs: Vec<(usize, u32)> = pages
            .iter()
            .flat_map(|&p| (0..self.layers.len()).map(move |l| (l, p)))
            .collect();
        for group in jobs.chunks(per) {
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            for (j, &(l, p)) in group.iter().enumerate() {
                let slot = (self.map.home_base(seq) + self.map.home_slot(p)) as u64;
                enc.copy_buffer_to_buffer(
                    &self.layers[l].home,
                    slot * pb,
                    &self.kvb.pageout,
                    j as u64 * pb,
                    pb,
                );
            }
            self.ctx.queue.submit([enc.finish()]);
            let bytes = self
                .ctx
                .read_mapped(&self.kvb.pageout, group.len() as u64 * pb)?;
            for (j, &(l, p)) in group.iter().enumerate() {
                let page = &bytes[j * pb as usize..(j + 1) * pb as usize];
                store.write_page(seq, l as u32, p, page)?;
            }
        }
        self.seqs[si].written = pages
            .iter()
            .max()
            .map(|&p| p + 1)
            .unwrap_or(self.seqs[si].written);
        self.tracer.span("write KV pages", "io", TID_IO, th);
        Ok(())
    }
}
