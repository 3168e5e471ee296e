//! The planner: among the prefetch depths and I/O modes left open, the one the performance
//! model predicts fastest for this machine.

use super::perf::{Calibration, RunIo, predict_token, token_work};
use super::{ExecPlan, PlanOptions};
use crate::flash::IoMode;
use crate::gguf::GgufFile;
use crate::model::config::ModelConfig;

/// What the planner picked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub prefetch: usize,
    pub io: IoMode,
    /// The predicted decode ms per token.
    pub ms_per_token: f64,
}

/// The fastest of `prefetches` × `modes` at a context of `n_past` tokens under `po` (its
/// budget included); `io` gives the other read settings. None when no combination plans.
#[allow(clippy::too_many_arguments)]
pub fn choose(
    gguf: &GgufFile,
    cfg: &ModelConfig,
    po: &PlanOptions,
    max_binding: u64,
    cal: &Calibration,
    n_past: usize,
    prefetches: &[usize],
    modes: &[IoMode],
    io: &RunIo,
) -> Option<Choice> {
    let mut best: Option<Choice> = None;
    for &p in prefetches {
        let mut o = po.clone();
        o.prefetch = p;
        let Ok(plan) = ExecPlan::new(gguf, cfg, max_binding, &o) else {
            continue;
        };
        for &mode in modes {
            let run = RunIo {
                mode: mode.to_string(),
                ..io.clone()
            };
            let t = predict_token(cal, &token_work(&plan, n_past, &run, 0.5)).ms_per_token;
            if best.is_none_or(|b| t < b.ms_per_token) {
                best = Some(Choice {
                    prefetch: p,
                    io: mode,
                    ms_per_token: t,
                });
            }
        }
    }
    best
}
