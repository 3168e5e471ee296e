//! The engine's plan as work for the performance model: what one decoded token reads and runs.

use super::Engine;
use crate::plan::perf::{
    Calibration, Prediction, RunIo, TokenWork, predict_prefill, predict_token, token_work,
};

impl Engine {
    /// How this engine reads.
    pub fn run_io(&self) -> RunIo {
        let reader = self.io_.source().reader_options().unwrap_or_default();
        RunIo {
            mode: self
                .io_
                .source()
                .io_mode()
                .map(|m| m.to_string())
                .unwrap_or_else(|| "mmap".into()),
            piece: reader.chunk as u64,
            threads: reader.threads,
            dram: self.io_.cache.budget(),
            in_place: self.in_place,
        }
    }

    /// What one decode step reads and runs at the current context (`reuse`: the selection
    /// reuse page selection is expected to have).
    pub fn token_work(&self, reuse: f64) -> TokenWork {
        token_work(&self.plan, self.n_past(), &self.run_io(), reuse)
    }

    /// Predicted ms per decoded token (at the current context) and time to first token for a
    /// prompt of `prompt` tokens prefilled after `past` cached ones (a resumed session's).
    pub fn predict(
        &self,
        cal: &Calibration,
        past: usize,
        prompt: usize,
        reuse: f64,
    ) -> (Prediction, f64) {
        let w = self.token_work(reuse);
        let tok = predict_token(cal, &w);
        let ttft = predict_prefill(cal, &w, past, prompt, self.ubatch);
        (tok, ttft)
    }
}
