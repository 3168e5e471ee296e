//! Moving KV pages by hand: rewinding a sequence (the pages that become the device window again
//! come back from the page file), and reading or placing whole pages for sessions.

use crate::flash::Admit;
use crate::flash::queue::Priority;

use super::upload::KV_KEYS;
use super::{Engine, EngineError};

/// Fills page `p` of layer `l` (the bytes of a page, K rows then V rows).
pub type PageSource<'a> = dyn FnMut(usize, u32, &mut [u8]) -> Result<(), EngineError> + 'a;

impl Engine {
    /// Drop cached positions from `n` on (to rewind a conversation).
    pub fn truncate(&mut self, n: usize) {
        if let Err(e) = self.try_truncate(n) {
            // The pages that should be back at home could not be read: forget everything
            // rather than attend stale keys.
            log::warn!("rewinding the KV cache failed ({e}); starting from an empty cache");
            let _ = self.try_truncate(0);
        }
    }

    /// Rewind to `n` tokens, restoring home pages from the page file where needed.
    pub fn try_truncate(&mut self, n: usize) -> Result<(), EngineError> {
        self.truncate_seq(0, n)
    }

    /// Rewind sequence `seq` to `n` tokens.
    pub fn truncate_seq(&mut self, seq: u32, n: usize) -> Result<(), EngineError> {
        let si = seq as usize;
        if si >= self.seqs.len() {
            return Err(EngineError::BadSequence(seq));
        }
        let n = n.min(self.seqs[si].tokens.len());
        self.seqs[si].tokens.truncate(n);
        for s in &mut self.seqs[si].prev_sel {
            s.clear();
        }
        for s in &mut self.seqs[si].lag_scores {
            s.clear();
        }
        if let Ok(mut pf) = self.io_.prefetched.lock() {
            pf.clear();
        }
        let Some(store) = self.io_.store.clone() else {
            return Ok(());
        };
        let p = self.map.page_of(n);
        // The pages at home for the next write (top = the page of position n - 1) must hold
        // their own data: bring back from the page file those whose slot holds another page.
        let mut restore = Vec::new();
        if n > 0 {
            let top = self.map.page_of(n - 1);
            for q in 0..=top {
                if !self.map.is_home(q, top) {
                    continue;
                }
                let slot = self.map.home_slot(q);
                if self.seqs[si].slot_owner.get(slot as usize) == Some(&q) {
                    continue;
                }
                // Every full page is in the page file.
                if q >= self.seqs[si].written {
                    return Err(EngineError::Transfer(format!(
                        "KV page {q} is neither at home nor in the page file"
                    )));
                }
                restore.push((q, slot));
            }
        }
        let restored = self.restore_pages(seq, &restore);
        // Pages from `p` on change from here: forget their copies.
        store.drop_pages(seq, p);
        self.io_
            .cache
            .remove_where(KV_KEYS, |a, b| (a >> 32) == seq as u64 && b >= p as u64);
        self.seqs[si].written = self.seqs[si].written.min(p);
        restored
    }

    /// Read pages (page, home slot) of every layer of sequence `seq` from the page file into
    /// their home slots.
    fn restore_pages(&mut self, seq: u32, restore: &[(u32, u32)]) -> Result<(), EngineError> {
        if restore.is_empty() {
            return Ok(());
        }
        for l in 0..self.layers.len() {
            let base = self.map.home_base(seq);
            // Waited for at once: needed before anything queued.
            let tk = self.io_.kv_pages(
                0,
                Priority::HotKv,
                seq,
                l as u32,
                restore.iter().map(|&(q, s)| (q, base + s)).collect(),
                self.plan.kv.page_bytes,
                self.layers[l].home.buffer.clone(),
                Admit::Pinned,
                Vec::new(),
            );
            tk.wait()
                .map_err(|e| EngineError::Transfer(e.to_string()))?
                .map_err(EngineError::Transfer)?;
        }
        for &(q, slot) in restore {
            if let Some(o) = self.seqs[seq as usize].slot_owner.get_mut(slot as usize) {
                *o = q;
            }
        }
        Ok(())
    }

    /// Bytes of page `page` of layer `l` (K rows then V rows): from the page file when it is
    /// there, else read back from its home slot.
    pub fn read_page(&mut self, l: usize, page: u32) -> Result<Vec<u8>, EngineError> {
        self.read_seq_page(0, l, page)
    }

    /// [`Engine::read_page`] of sequence `seq`.
    pub fn read_seq_page(&mut self, seq: u32, l: usize, page: u32) -> Result<Vec<u8>, EngineError> {
        let si = seq as usize;
        if si >= self.seqs.len() {
            return Err(EngineError::BadSequence(seq));
        }
        let pb = self.plan.kv.page_bytes;
        let mut out = vec![0u8; pb as usize];
        if let Some(store) = &self.io_.store
            && page < self.seqs[si].written
        {
            store.read_pages(seq, l as u32, page, 1, &mut out)?;
            return Ok(out);
        }
        let slot = self.map.home_slot(page) as u64;
        if self.seqs[si].slot_owner.get(slot as usize) != Some(&page) {
            return Err(EngineError::Transfer(format!(
                "KV page {page} of layer {l} is not on the device"
            )));
        }
        let home = (self.map.home_base(seq) as u64 + slot) * pb;
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&self.layers[l].home, home, &self.kvb.pageout, 0, pb);
        self.ctx.queue.submit([enc.finish()]);
        let bytes = self.ctx.read_mapped(&self.kvb.pageout, pb)?;
        out.copy_from_slice(&bytes[..pb as usize]);
        Ok(out)
    }

    /// Place restored pages: `tokens` become the cached sequence and `page(l, p, dst)` fills page
    /// `p` of layer `l` for every page the tokens touch. Full pages go to the page file (when
    /// pages leave the device); the pages at home are written into their slots; page summaries
    /// for page selection are recomputed from the keys.
    pub fn place_pages(
        &mut self,
        tokens: &[u32],
        page: &mut PageSource<'_>,
    ) -> Result<(), EngineError> {
        self.place_seq_pages(0, tokens, page)
    }

    /// Make the first `n` tokens of sequence `dst` those of sequence `src`, copying their KV
    /// pages instead of computing them (a shared prompt prefix). `n` must be a whole number of
    /// pages (a partly filled page would be overwritten by `src`'s later rows).
    pub fn copy_prefix(&mut self, src: u32, dst: u32, n: usize) -> Result<(), EngineError> {
        let (si, di) = (src as usize, dst as usize);
        if si >= self.seqs.len() || src == dst {
            return Err(EngineError::BadSequence(src));
        }
        if di >= self.seqs.len() {
            return Err(EngineError::BadSequence(dst));
        }
        let p_tok = self.map.page_tokens as usize;
        if n > self.seqs[si].tokens.len() || !n.is_multiple_of(p_tok) {
            return Err(EngineError::Transfer(format!(
                "a copied prefix is whole pages of the source: {n} tokens of {}",
                self.seqs[si].tokens.len()
            )));
        }
        let tokens = self.seqs[si].tokens[..n].to_vec();
        let n_pages = (n / p_tok) as u32;
        let mut pages = Vec::with_capacity(self.layers.len() * n_pages as usize);
        for l in 0..self.layers.len() {
            for q in 0..n_pages {
                pages.push(self.read_seq_page(src, l, q)?);
            }
        }
        self.place_seq_pages(dst, &tokens, &mut |l, q, buf| {
            let i = l * n_pages as usize + q as usize;
            buf.copy_from_slice(&pages[i]);
            Ok(())
        })
    }

    /// [`Engine::place_pages`] into sequence `seq`.
    pub fn place_seq_pages(
        &mut self,
        seq: u32,
        tokens: &[u32],
        page: &mut PageSource<'_>,
    ) -> Result<(), EngineError> {
        let si = seq as usize;
        self.truncate_seq(seq, 0)?;
        if tokens.is_empty() {
            return Ok(());
        }
        if tokens.len() > self.max_ctx {
            return Err(EngineError::ContextFull {
                needed: tokens.len(),
                max: self.max_ctx,
                model_max: self.cfg.context_length,
            });
        }
        let n = tokens.len();
        let pb = self.plan.kv.page_bytes as usize;
        let p_tok = self.map.page_tokens as usize;
        let top = self.map.page_of(n - 1);
        let full = (n / p_tok) as u32;
        let store = self.io_.store.clone();
        let mut buf = vec![0u8; pb];
        for l in 0..self.layers.len() {
            for q in 0..=top {
                page(l, q, &mut buf)?;
                if let Some(s) = &store
                    && q < full
                {
                    s.write_page(seq, l as u32, q, &buf)?;
                }
                if self.map.is_home(q, top) {
                    let slot = (self.map.home_base(seq) + self.map.home_slot(q)) as u64;
                    self.ctx.write(&self.layers[l].home, slot * pb as u64, &buf);
                }
                if let Some(meta) = &self.layers[l].meta
                    && q < full
                {
                    let mm = self.page_summary(&buf);
                    let off = q as u64 * 2 * self.plan.kv.kv_dim as u64 * 4;
                    self.ctx.write(meta, off, bytemuck::cast_slice(&mm));
                }
            }
        }
        self.ctx.flush()?;
        for q in 0..=top {
            if self.map.is_home(q, top) {
                let slot = self.map.home_slot(q) as usize;
                if let Some(o) = self.seqs[si].slot_owner.get_mut(slot) {
                    *o = q;
                }
            }
        }
        if store.is_some() {
            self.seqs[si].written = full;
        }
        self.seqs[si].tokens = tokens.to_vec();
        Ok(())
    }

    /// Per-channel minimum then maximum of a full page's keys (page selection's summary).
    fn page_summary(&self, page: &[u8]) -> Vec<f32> {
        let kv_dim = self.plan.kv.kv_dim as usize;
        let rows = self.map.page_tokens as usize;
        let mut lo = vec![f32::INFINITY; kv_dim];
        let mut hi = vec![f32::NEG_INFINITY; kv_dim];
        for r in 0..rows {
            for c in 0..kv_dim {
                let i = r * kv_dim + c;
                let v = if self.plan.kv.f16 {
                    half::f16::from_le_bytes([page[2 * i], page[2 * i + 1]]).to_f32()
                } else {
                    f32::from_le_bytes([
                        page[4 * i],
                        page[4 * i + 1],
                        page[4 * i + 2],
                        page[4 * i + 3],
                    ])
                };
                lo[c] = lo[c].min(v);
                hi[c] = hi[c].max(v);
            }
        }
        lo.extend(hi);
        lo
    }
}
