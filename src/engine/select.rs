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

    /// Page selection for layer `l` at decode: score the pages (submitting `enc`, which holds
    /// the layer's pre-attention work), read the scores back, keep the best pages. Pages below
    /// `lo` (outside a sliding window) do not compete.
    pub(super) fn select_pages(
        &mut self,
        l: usize,
        mut enc: wgpu::CommandEncoder,
        top: u32,
        last_pos: usize,
        lo: u32,
    ) -> Result<Vec<RoundWork>, EngineError> {
        let n_full = top;
        // Page 0 and the recent window are always attended; the rest compete.
        let win = self.plan.kv.select_window;
        let always = |p: u32| p == 0 || p + win > top;
        let candidates: Vec<u32> = (lo..n_full).filter(|&p| !always(p)).collect();
        let sel = self.plan.kv.select.unwrap_or(crate::plan::KvSelect {
            spec: crate::plan::SelectSpec::Pages(u32::MAX),
            dense_layers: 0,
        });
        let keep = sel.keep(candidates.len() as u32) as usize;
        let heads = self.cfg.n_heads;
        let chosen: Vec<u32> = if keep >= candidates.len() {
            let done = std::mem::replace(
                &mut enc,
                self.ctx.device.create_command_encoder(&Default::default()),
            );
            self.submit(done, format!("layer {l} (pre-attention)"));
            candidates.clone()
        } else {
            // Header only: the score kernel reads the page count.
            let base = l as u64 * self.plan.kv.layer_words as u64 * 4;
            self.ctx.write(
                &self.kvb.table,
                base,
                bytemuck::cast_slice(&[0u32, 0, 0, n_full]),
            );
            let (Some(score), Some(scores), Some(rb)) = (
                self.decode_lists[l].score.as_ref(),
                self.kvb.scores.as_ref(),
                self.kvb.scores_rb.as_ref(),
            ) else {
                return Err(EngineError::Transfer("page scores are not set up".into()));
            };
            kernels::record_all_with(
                &mut enc,
                std::slice::from_ref(score),
                1,
                self.profiler.as_mut(),
            );
            let bytes = n_full as u64 * heads as u64 * 4;
            enc.copy_buffer_to_buffer(scores, 0, rb, 0, bytes.max(4));
            let rb = rb.buffer.clone();
            self.submit(enc, format!("layer {l} (pre-attention, scores)"));
            let th = self.tracer.now();
            let raw = self.ctx.read_mapped(&rb, bytes.max(4))?;
            self.tracer
                .span(format!("page scores layer {l}"), "wait", TID_HOST, th);
            let s: Vec<f32> = bytemuck::pod_collect_to_vec(&raw);
            let logit = crate::kv::select::Logit {
                scale: self.cfg.attn_scale,
                softcap: self.cfg.attn_softcap,
            };
            crate::kv::select::keep_pages(&s, heads, &candidates, keep, logit)
        };
        let prev = &self.seqs[0].prev_sel[l];
        if !prev.is_empty() && !chosen.is_empty() {
            let again = chosen
                .iter()
                .filter(|p| prev.binary_search(p).is_ok())
                .count();
            self.kv_stats.reuse_hits += again as u64;
            self.kv_stats.reuse_total += chosen.len() as u64;
        }
        self.kv_stats.selected_pages += chosen.len() as u64;
        self.kv_stats.candidate_pages += candidates.len() as u64;
        self.kv_stats.selections += 1;
        self.seqs[0].prev_sel[l] = chosen.clone();
        let mut pages: Vec<u32> = (0..=top)
            .filter(|&p| always(p) || chosen.binary_search(&p).is_ok())
            .collect();
        pages.dedup();
        let list = PageList::of_pages(&self.map, pages, last_pos);
        Ok(plan_rounds(&self.map, vec![(0, list)], true))
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
