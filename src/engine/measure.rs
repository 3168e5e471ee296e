//! Measurements used by the benchmarks: the decode matrix products alone, and a device copy of
//! the same bytes.

use std::time::Instant;

use super::{Engine, EngineError, Head};
use crate::gpu::GpuBuffer;
use crate::kernels::{Dispatch, Step};

/// Measurements used by the benchmarks.
impl Engine {
    /// Weight bytes one decode step's matrix products read.
    pub fn matvec_weight_bytes(&self) -> u64 {
        let total: u64 = self
            .plan
            .layers
            .iter()
            .flat_map(|l| l.files.iter().map(|t| t.n_bytes))
            .sum();
        total + self.plan.head.info.n_bytes
    }

    /// Run every decode matrix product `reps` times in one submission; returns seconds.
    /// Only meaningful with everything resident.
    pub fn time_matvecs(&mut self, reps: usize) -> Result<f64, EngineError> {
        let step = Step {
            n_tokens: 1,
            pos0: 0,
            _pad: [0; 2],
        };
        self.ctx
            .write(&self.bufs.step, 0, bytemuck::bytes_of(&step));
        self.ctx.wait()?;
        let t0 = Instant::now();
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            let head: &[Dispatch] = match &self.head {
                Head::Resident { plan, .. } => plan,
                Head::Streamed { plan, .. } => plan,
            };
            for _ in 0..reps {
                for d in self
                    .decode_lists
                    .iter()
                    .flat_map(|l| l.pre.iter().chain(&l.post))
                    .chain(head)
                    .filter(|d| d.label == "matmul")
                {
                    d.record(&mut pass, 1);
                }
            }
        }
        self.ctx.queue.submit([enc.finish()]);
        self.ctx.wait()?;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// Copy every resident weight buffer the decode products read `reps` times (a plain device
    /// memcpy of the same bytes); returns seconds.
    pub fn time_weight_copies(&mut self, reps: usize) -> Result<f64, EngineError> {
        let mut parts: Vec<&GpuBuffer> = Vec::new();
        for l in &self.layers {
            if let Some(m) = &l.mats {
                for w in m.all() {
                    parts.extend(w.parts.iter().map(|p| &*p.0));
                }
            }
        }
        if let Head::Resident { w, .. } = &self.head {
            parts.extend(w.parts.iter().map(|p| &*p.0));
        }
        let max = parts.iter().map(|b| b.size).max().unwrap_or(16);
        let scratch = self.ctx.storage("copy scratch", max)?;
        self.ctx.wait()?;
        let t0 = Instant::now();
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        for _ in 0..reps {
            for b in &parts {
                enc.copy_buffer_to_buffer(b, 0, &scratch, 0, b.size);
            }
        }
        self.ctx.queue.submit([enc.finish()]);
        self.ctx.wait()?;
        Ok(t0.elapsed().as_secs_f64())
    }
}
