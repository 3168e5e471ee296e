//! Several sequences in one pass: every weight read serves all their rows; attention stays per
//! sequence (each has its own pages and page table). A pass where every sequence appends one
//! token runs the decode-form kernels, so each sequence gets exactly the logits it gets alone.

use super::{Engine, EngineError};
use crate::sampling::Sampler;

impl Engine {
    /// Sequences the engine can hold at once.
    pub fn max_seqs(&self) -> usize {
        self.seqs.len()
    }

    /// Open a new, empty sequence; None when all are in use. (The single-sequence calls —
    /// `forward`, `generate`, `truncate`, sessions — work on sequence 0: do not mix them with
    /// batches that open sequence 0.)
    pub fn new_seq(&mut self) -> Option<u32> {
        let s = self.live.iter().position(|l| !l)?;
        self.live[s] = true;
        Some(s as u32)
    }

    /// Close a sequence and forget its keys and values.
    pub fn free_seq(&mut self, seq: u32) -> Result<(), EngineError> {
        self.truncate_seq(seq, 0)?;
        self.live[seq as usize] = false;
        Ok(())
    }

    /// The tokens cached for `seq`.
    pub fn seq_tokens(&self, seq: u32) -> &[u32] {
        self.seqs
            .get(seq as usize)
            .map(|s| s.tokens.as_slice())
            .unwrap_or(&[])
    }

    /// Append each item's tokens to its sequence and return the logits after each item's last
    /// token. Items whose rows fit one pass together (at most the batch size) share it.
    pub fn forward_batch(&mut self, items: &[(u32, &[u32])]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.check_items(items)?;
        let total: usize = items.iter().map(|i| i.1.len()).sum();
        let mut out = vec![Vec::new(); items.len()];
        if total <= self.ubatch {
            let last = vec![1; items.len()];
            let rows = self.forward_batch_rows(items, &last, false)?;
            for (o, mut r) in out.iter_mut().zip(rows) {
                *o = r.pop().unwrap_or_default();
            }
            return Ok(out);
        }
        // Too many rows for one pass: each item on its own, in batch-sized chunks.
        for (k, &(seq, toks)) in items.iter().enumerate() {
            let mut done = 0;
            for chunk in toks.chunks(self.ubatch) {
                let last = chunk.len() - 1;
                let want = if done + chunk.len() == toks.len() {
                    vec![last]
                } else {
                    Vec::new()
                };
                let mut got = Vec::new();
                self.run_batch(&[(seq, chunk)], &want, &mut |_, l| got = l.to_vec())?;
                done += chunk.len();
                if !got.is_empty() {
                    out[k] = got;
                }
            }
        }
        Ok(out)
    }

    /// Tokens one pass carries at most.
    pub fn pass_tokens(&self) -> usize {
        self.ubatch
    }

    /// One pass over every item's tokens (together at most [`Engine::pass_tokens`]): returns,
    /// per item, the logits after each of its last `last_rows[k]` tokens. With `exact`, every
    /// row is computed with the decode-form kernels, so a sequence's logits are exactly what
    /// token-by-token decoding computes, whatever else shares the pass (prefill chunks of one
    /// request, decode rows and verified drafts of others).
    pub fn forward_batch_rows(
        &mut self,
        items: &[(u32, &[u32])],
        last_rows: &[usize],
        exact: bool,
    ) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        self.check_items(items)?;
        let total: usize = items.iter().map(|i| i.1.len()).sum();
        if total > self.ubatch || last_rows.len() != items.len() {
            return Err(EngineError::Transfer(format!(
                "one pass carries at most {} tokens, with one row count per item ({total} tokens, {} items, {} counts)",
                self.ubatch,
                items.len(),
                last_rows.len()
            )));
        }
        let mut want = Vec::new();
        let mut owner = std::collections::HashMap::new();
        let mut row = 0;
        for (k, (i, &n)) in items.iter().zip(last_rows).enumerate() {
            let n = n.min(i.1.len());
            for r in row + i.1.len() - n..row + i.1.len() {
                want.push(r);
                owner.insert(r, k);
            }
            row += i.1.len();
        }
        let mut out: Vec<Vec<Vec<f32>>> = vec![Vec::new(); items.len()];
        let keep = self.decode_form;
        self.decode_form = exact || keep;
        let r = self.run_batch(items, &want, &mut |r, l| {
            if let Some(&k) = owner.get(&r) {
                out[k].push(l.to_vec());
            }
        });
        self.decode_form = keep;
        r?;
        Ok(out)
    }

    fn check_items(&self, items: &[(u32, &[u32])]) -> Result<(), EngineError> {
        for &(seq, toks) in items {
            let si = seq as usize;
            if si >= self.seqs.len() || !self.live[si] {
                return Err(EngineError::BadSequence(seq));
            }
            if toks.is_empty() {
                return Err(EngineError::EmptyPrompt);
            }
            let needed = self.seqs[si].tokens.len() + toks.len();
            if needed > self.max_ctx {
                return Err(EngineError::ContextFull {
                    needed,
                    max: self.max_ctx,
                    model_max: self.cfg.context_length,
                });
            }
            for &id in toks {
                if id as usize >= self.cfg.vocab_size || id as u64 >= self.embd.n_rows() {
                    return Err(EngineError::BadToken {
                        id,
                        vocab: self.cfg.vocab_size,
                    });
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        if !items.iter().all(|i| seen.insert(i.0)) {
            return Err(EngineError::Transfer(
                "a sequence appears twice in one batch".into(),
            ));
        }
        self.io_.source().check().map_err(EngineError::Flash)
    }

    /// Prefill each prompt in its own new sequence, then decode all of them together, one token
    /// per sequence per pass, up to `n` tokens each (greedy or sampled with one sampler per
    /// sequence). Returns each sequence's tokens; the sequences are closed at the end.
    pub fn generate_batch(
        &mut self,
        prompts: &[Vec<u32>],
        n: usize,
        samplers: &mut [Sampler],
        is_end: impl Fn(u32) -> bool,
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        let mut seqs = Vec::with_capacity(prompts.len());
        for _ in prompts {
            match self.new_seq() {
                Some(s) => seqs.push(s),
                None => {
                    for &s in &seqs {
                        let _ = self.free_seq(s);
                    }
                    return Err(EngineError::NoFreeSequence(self.seqs.len()));
                }
            }
        }
        let res = self.decode_together(&seqs, prompts, n, samplers, &is_end);
        for &s in &seqs {
            let _ = self.free_seq(s);
        }
        res
    }

    fn decode_together(
        &mut self,
        seqs: &[u32],
        prompts: &[Vec<u32>],
        n: usize,
        samplers: &mut [Sampler],
        is_end: &impl Fn(u32) -> bool,
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        let mut outs: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
        let mut hist: Vec<Vec<u32>> = prompts.to_vec();
        let mut logits = Vec::with_capacity(prompts.len());
        // Prefill one sequence at a time (prefill rows are many; decode rows share passes).
        for (k, p) in prompts.iter().enumerate() {
            logits.push(self.forward_batch(&[(seqs[k], p.as_slice())])?.remove(0));
        }
        let mut active: Vec<usize> = (0..prompts.len()).collect();
        while !active.is_empty() {
            let mut next = Vec::new();
            let mut items_tok = Vec::new();
            for &k in &active {
                let id = samplers[k].sample(&logits[k], &hist[k]);
                outs[k].push(id);
                hist[k].push(id);
                if outs[k].len() < n && !is_end(id) {
                    next.push(k);
                    items_tok.push((seqs[k], [id]));
                }
            }
            if next.is_empty() {
                break;
            }
            let items: Vec<(u32, &[u32])> =
                items_tok.iter().map(|(s, t)| (*s, t.as_slice())).collect();
            let got = self.forward_batch(&items)?;
            for (j, &k) in next.iter().enumerate() {
                logits[k] = got[j].clone();
            }
            active = next;
        }
        Ok(outs)
    }
}
