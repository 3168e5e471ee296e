//! The output head: the last rows normed and multiplied by the head (resident, or streamed in
//! row chunks through two slots or the layer slots), the logits read back (and soft-capped when
//! the model says so). The head's first chunks are queued during the layers, each once the last
//! streamed layer through its slot is submitted (`prequeue_head`), so that their reads follow
//! the last layers' at once; once the head's last use of the layer slots is submitted, the next
//! pass's first streamed layers are queued, so that they read while the logits come back.

use crate::flash::queue::Ticket;
use crate::kernels;

use super::trace::TID_HOST;
use super::upload::{JobResult, OwnedReq};
use super::{Engine, EngineError, Head};

impl Engine {
    /// The output head over the rows in `want`.
    pub(super) fn head_pass(
        &mut self,
        t: usize,
        want: &[usize],
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        if want.is_empty() {
            self.queue_next_pass();
            self.ctx.wait()?;
            return Ok(());
        }
        let vocab = self.cfg.vocab_size;
        let row = (self.cfg.n_embd * 4) as u64;
        let group = if want.len() == 1 {
            1
        } else {
            self.plan.logit_rows
        };
        let groups = want.len().div_ceil(group.max(1));
        for (gi, rows) in want.chunks(group.max(1)).enumerate() {
            let multi = group > 1;
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            for (j, &r) in rows.iter().enumerate() {
                debug_assert!(r < t);
                enc.copy_buffer_to_buffer(
                    &self.bufs.x,
                    r as u64 * row,
                    &self.bufs.last,
                    j as u64 * row,
                    row,
                );
            }
            let norm = if multi {
                self.head_norm_rows.as_ref().unwrap_or(&self.head_norm)
            } else {
                &self.head_norm
            };
            kernels::record_all_with(
                &mut enc,
                std::slice::from_ref(norm),
                1,
                self.profiler.as_mut(),
            );
            let streamed = matches!(self.head, Head::Streamed { .. });
            if let Head::Resident {
                plan, rows_plan, ..
            } = &self.head
            {
                let p = if multi { rows_plan } else { plan };
                kernels::record_all_with(&mut enc, p, 1, self.profiler.as_mut());
            }
            if self.tracer.keeps() {
                // Where the head begins on the host: a zero-length span.
                let t = self.tracer.now();
                self.tracer
                    .span_at("submit output norm", "submit", TID_HOST, t, t);
            }
            self.submit(enc, "output norm".into());
            if streamed {
                self.stream_head(multi)?;
            }
            if gi + 1 == groups {
                // Every use of the layer slots in this pass is submitted now.
                self.queue_next_pass();
            }
            let n = if multi { group } else { 1 };
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(
                &self.bufs.logits,
                0,
                &self.bufs.readback,
                0,
                (n * vocab * 4) as u64,
            );
            self.ctx.queue.submit([enc.finish()]);
            let th = self.tracer.now();
            let bytes = self
                .ctx
                .read_mapped(&self.bufs.readback, (n * vocab * 4) as u64)?;
            self.tracer.span("wait for logits", "wait", TID_HOST, th);
            let mut logits: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
            if let Some(cap) = self.cfg.final_softcap {
                logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
            }
            for (j, &r) in rows.iter().enumerate() {
                on_logits(r, &logits[j * vocab..(j + 1) * vocab]);
            }
        }
        self.tracer.collect_gpu();
        Ok(())
    }

    /// Output head in row chunks, chunk c + S read while c computes (S slots: the layer slots,
    /// or two chunk slots of the head's own).
    fn stream_head(&mut self, multi: bool) -> Result<(), EngineError> {
        let Head::Streamed {
            slots,
            plan,
            rows_plan,
            ..
        } = &self.head
        else {
            return Ok(());
        };
        let n_chunks = self.plan.head.n_chunks as usize;
        let n_slots = slots.len().max(1);
        let dispatches: Vec<&kernels::Dispatch> = if multi {
            rows_plan.iter().collect()
        } else {
            plan.iter().collect()
        };
        // The first chunks may have been queued during the layers (`prequeue_head`).
        let mut tickets = std::mem::take(&mut self.head_early);
        let mut jobs = tickets.len()..n_chunks;
        for c in jobs
            .by_ref()
            .take(n_slots.min(n_chunks).saturating_sub(tickets.len()))
        {
            tickets.extend(self.queue_head_chunk(c));
        }
        let mut encs = Vec::with_capacity(n_chunks);
        for d in &dispatches {
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            kernels::record_all_with(
                &mut enc,
                std::slice::from_ref(*d),
                1,
                self.profiler.as_mut(),
            );
            encs.push(enc);
        }
        for (c, enc) in encs.into_iter().enumerate() {
            if let Some(tk) = tickets.pop_front() {
                self.finish_job(tk, format!("read+upload output head chunk {c}"))?;
            }
            self.submit(enc, format!("output head chunk {c}"));
            let u = jobs_use(&self.head, c);
            self.slot_use[u] = self.last_submission.clone();
            if let Some(next) = jobs.next() {
                tickets.extend(self.queue_head_chunk(next));
            }
        }
        Ok(())
    }

    /// Queue output-head chunk `c` into its slot (after the submission that last read the
    /// slot), for after the pass's last layer (None: the head does not stream).
    fn queue_head_chunk(&self, c: usize) -> Option<Ticket<JobResult>> {
        let Head::Streamed {
            slots,
            offsets,
            slot_use,
            ..
        } = &self.head
        else {
            return None;
        };
        let hp = &self.plan.head;
        let rb = hp.layout.row_bytes as u64;
        let r0 = c as u64 * hp.chunk_rows as u64;
        let n = (hp.chunk_rows as u64).min(hp.layout.rows as u64 - r0);
        let k = c % slots.len().max(1);
        let req = OwnedReq {
            src_offset: hp.info.offset + r0 * rb,
            len: n * rb,
            dst: slots[k].buffer.clone(),
            dst_offset: offsets[c],
        };
        let after = self.slot_use[slot_use[k]].clone();
        // The head's chunks are needed after the pass's last layer.
        let need = self.need_of(self.layers.len(), false);
        Some(if self.in_place {
            self.io_
                .weights_in_place(need, vec![req], Vec::new(), after)
        } else {
            self.io_.weights(need, vec![req], Vec::new())
        })
    }

    /// Called once streamed layer `si` (index into `streamed`), past which no streamed layer
    /// is left to queue, is submitted: queue the output head's first chunks (one a slot) whose
    /// slots no streamed layer of this pass still has to read, so that the flash reads run on
    /// from the last layers' into the head's instead of waiting for the head's turn.
    pub(super) fn prequeue_head(&mut self, si: usize) {
        let Head::Streamed { slot_use, .. } = &self.head else {
            return;
        };
        let n_head_slots = slot_use.len().max(1);
        let first = n_head_slots.min(self.plan.head.n_chunks as usize);
        let n_s = self.streamed.len();
        let n_slots = self.n_slots.max(1);
        while self.head_early.len() < first {
            let c = self.head_early.len();
            let u = slot_use[c % n_head_slots];
            // A layer slot is free for the head once the last streamed layer through it is
            // submitted (the head's own slots: once the previous pass's head was).
            if u < n_slots
                && (0..n_s)
                    .rev()
                    .find(|&k| k % n_slots == u)
                    .is_some_and(|k| k > si)
            {
                break;
            }
            let Some(ticket) = self.queue_head_chunk(c) else {
                return;
            };
            self.head_early.push_back(ticket);
        }
    }
}

/// The `slot_use` entry of the slot output-head chunk `c` streams through.
fn jobs_use(head: &Head, c: usize) -> usize {
    match head {
        Head::Streamed { slot_use, .. } => slot_use[c % slot_use.len().max(1)],
        Head::Resident { .. } => 0,
    }
}
