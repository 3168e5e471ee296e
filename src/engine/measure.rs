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
        self.time_matvecs_where(reps, |_| true).map(|(t, _)| t)
    }

    /// [`Self::time_matvecs`] over the products whose kernel label `keep` accepts; returns
    /// seconds and the weight bytes one repetition reads.
    pub fn time_matvecs_where(
        &mut self,
        reps: usize,
        keep: impl Fn(&str) -> bool,
    ) -> Result<(f64, u64), EngineError> {
        let step = Step {
            n_tokens: 1,
            pos0: 0,
            _pad: [0; 2],
        };
        self.ctx
            .write(&self.bufs.step, 0, bytemuck::bytes_of(&step));
        self.ctx.wait()?;
        let t0 = Instant::now();
        let mut bytes = 0u64;
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
                    .filter(|d| d.label.starts_with("matmul") && keep(d.label))
                {
                    d.record(&mut pass, 1);
                    bytes += d.bytes;
                }
            }
        }
        self.ctx.queue.submit([enc.finish()]);
        self.ctx.wait()?;
        Ok((t0.elapsed().as_secs_f64(), bytes / reps.max(1) as u64))
    }

    /// The resident weights' device buffers, each once (a resident layer's matrices may share
    /// one buffer: streaming it once per matrix would count its bytes that many times).
    fn resident_weight_buffers(&self) -> Vec<&GpuBuffer> {
        let mut weights: Vec<&crate::kernels::GpuWeight> = Vec::new();
        for l in &self.layers {
            if let Some(m) = &l.mats {
                weights.extend(m.all());
            }
        }
        if let Head::Resident { w, .. } = &self.head {
            weights.push(w);
        }
        let mut bufs: Vec<&GpuBuffer> = Vec::new();
        for p in weights.iter().flat_map(|w| &w.parts) {
            if !bufs.iter().any(|b| std::ptr::eq(*b, &*p.buf)) {
                bufs.push(&*p.buf);
            }
        }
        bufs
    }

    /// Bytes of the buffers [`Self::time_roofline`] and [`Self::time_weight_copies`] stream
    /// each time: the resident weights' (what the decode products read, and any padding).
    pub fn resident_weight_bytes(&self) -> u64 {
        self.resident_weight_buffers().iter().map(|b| b.size).sum()
    }

    /// Copy every resident weight buffer the decode products read `reps` times (a plain device
    /// memcpy of the same bytes); returns seconds.
    pub fn time_weight_copies(&mut self, reps: usize) -> Result<f64, EngineError> {
        let parts = self.resident_weight_buffers();
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

    /// Stream every resident weight buffer `reps` times with the roofline kernel (one XOR per
    /// load of 16 bytes, or with `wide` of 32: see [`crate::kernels::roofline`]); returns
    /// seconds.
    pub fn time_roofline(&mut self, reps: usize, wide: bool) -> Result<f64, EngineError> {
        let parts = self.resident_weight_buffers();
        // About 16 words per thread: enough workgroups to fill a device, few enough that
        // starting them costs little; each writes one word.
        let groups = |bytes: u64| (bytes / 16).div_ceil(256 * 16).clamp(1, 65_535) as u32;
        let max_groups = parts.iter().map(|b| groups(b.size)).max().unwrap_or(1);
        let out = self.ctx.storage("roofline out", max_groups as u64 * 4)?;
        let list: Vec<Dispatch> = parts
            .iter()
            .map(|b| {
                let n = b.size / 16 * 16;
                crate::kernels::roofline(&self.ctx, &self.bufs.step, b, n, &out, groups(n), wide)
            })
            .collect::<Result<_, _>>()?;
        self.ctx.wait()?;
        let t0 = Instant::now();
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for _ in 0..reps {
                for d in &list {
                    d.record(&mut pass, 1);
                }
            }
        }
        self.ctx.queue.submit([enc.finish()]);
        self.ctx.wait()?;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// Seconds per dispatch of an empty kernel, `n` of them in one submission.
    pub fn time_empty_dispatch(&mut self, n: usize) -> Result<f64, EngineError> {
        let src = self.ctx.storage("empty src", 16)?;
        let dst = self.ctx.storage("empty dst", 16)?;
        let d = crate::kernels::empty_dispatch(&self.ctx, &self.bufs.step, &src, &dst)?;
        self.ctx.wait()?;
        let t0 = Instant::now();
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for _ in 0..n {
                d.record(&mut pass, 1);
            }
        }
        self.ctx.queue.submit([enc.finish()]);
        self.ctx.wait()?;
        Ok(t0.elapsed().as_secs_f64() / n.max(1) as f64)
    }
}
