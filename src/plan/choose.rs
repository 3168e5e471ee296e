//! The planner: among the knobs left open — placement, prefetch depth, staging-ring size and
//! I/O mode — the combination the performance model predicts fastest for this machine.
//!
//! Placements tried: the default rule (whole layers resident first to last, then the output
//! head) and, head first, the output head resident with as many leading layers as fit. Ring
//! sizes are bytes per staging slot: a read through the ring fills one slot at a time, so a
//! larger slot reads in larger pieces over more threads but costs device memory that could hold
//! weights. Only combinations that plan within the budget count.

use super::perf::{Calibration, RunIo, predict_token, token_work};
use super::placement::Placement;
use super::{ExecPlan, PlanOptions, ResidentSpec};
use crate::flash::IoMode;
use crate::gguf::GgufFile;
use crate::model::config::ModelConfig;

/// Staging-ring bytes per slot the planner tries when no flag fixes it.
pub const RING_CHUNKS: [u64; 5] = [256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20];

/// The values each knob may take (a knob a flag fixed has one).
#[derive(Debug, Clone)]
pub struct Space {
    pub prefetches: Vec<usize>,
    pub modes: Vec<IoMode>,
    /// Staging-ring bytes per slot.
    pub ring_chunks: Vec<u64>,
    /// Try placements (default rule and head first); false: the plan options' `resident`.
    pub placements: bool,
}

impl Space {
    /// Every knob fixed at the values of `po` (and `mode`).
    pub fn fixed(po: &PlanOptions, mode: IoMode) -> Self {
        Self {
            prefetches: vec![po.prefetch],
            modes: vec![mode],
            ring_chunks: vec![po.ring_chunk],
            placements: false,
        }
    }
}

/// What the planner picked.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub prefetch: usize,
    pub io: IoMode,
    /// Staging ring: bytes per slot (chosen) and slots (as the plan sizes them; 0 when the
    /// plan allocates no ring: everything resident, every KV page on the device).
    pub ring_chunk: u64,
    pub ring_slots: usize,
    /// What stays resident.
    pub resident: ResidentSpec,
    /// The placement in short ([`placement_summary`]).
    pub placement: String,
    /// Device bytes the plan allocates.
    pub total: u64,
    /// The predicted decode ms per token.
    pub ms_per_token: f64,
}

impl Choice {
    /// Set the chosen knobs in `po`.
    pub fn apply(&self, po: &mut PlanOptions) {
        po.prefetch = self.prefetch;
        po.ring_chunk = self.ring_chunk;
        po.resident = self.resident.clone();
    }

    /// Every knob as chosen, on one line.
    pub fn describe(&self) -> String {
        let ring = if self.ring_slots == 0 {
            "no staging ring".to_string()
        } else {
            format!(
                "staging ring {} x {} KiB",
                self.ring_slots,
                self.ring_chunk >> 10
            )
        };
        format!(
            "placement {}, prefetch {}, I/O {}, {ring} (predicted {:.1} ms/token)",
            self.placement, self.prefetch, self.io, self.ms_per_token
        )
    }
}

/// A placement in a few words: the resident layers and where the output head is.
pub fn placement_summary(p: &Placement) -> String {
    let n = p.resident_layers.len();
    if !p.streaming {
        return format!("all {n} layers and the head resident");
    }
    let res: Vec<usize> = (0..n).filter(|&l| p.resident_layers[l]).collect();
    let layers = match (res.first(), res.last()) {
        (Some(a), Some(b)) if b - a + 1 == res.len() && a == b => format!(" ({a})"),
        (Some(a), Some(b)) if b - a + 1 == res.len() => format!(" ({a}-{b})"),
        (Some(_), Some(_)) => " (not contiguous)".into(),
        _ => String::new(),
    };
    format!(
        "{} of {n} layers resident{layers}, head {}",
        res.len(),
        if p.head_resident {
            "resident"
        } else {
            "streamed"
        }
    )
}

/// Plan `o` if it fits the budget.
fn plan_within(
    gguf: &GgufFile,
    cfg: &ModelConfig,
    max_binding: u64,
    o: &PlanOptions,
) -> Option<ExecPlan> {
    let plan = ExecPlan::new(gguf, cfg, max_binding, o).ok()?;
    (plan.total <= o.budget.unwrap_or(u64::MAX)).then_some(plan)
}

/// The head-first placement of `o`: the output head resident with the most leading layers
/// that plan within the budget (fewer than all: with every layer, it is the default rule's
/// everything-resident). None when the head does not fit beside the streaming machinery.
pub fn head_first(
    gguf: &GgufFile,
    cfg: &ModelConfig,
    max_binding: u64,
    o: &PlanOptions,
) -> Option<(ResidentSpec, ExecPlan)> {
    let with = |k: usize| {
        let spec = ResidentSpec::List {
            layers: (0..k).collect(),
            head: true,
        };
        let mut t = o.clone();
        t.resident = spec.clone();
        plan_within(gguf, cfg, max_binding, &t).map(|p| (spec, p))
    };
    let mut best = with(0)?;
    // Fewer resident layers never need more memory: search for the largest count that plans.
    let (mut lo, mut hi) = (0usize, cfg.n_layers.saturating_sub(1));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        match with(mid) {
            Some(b) => {
                best = b;
                lo = mid;
            }
            None => hi = mid - 1,
        }
    }
    Some(best)
}

/// The fastest combination in `space` at a context of `n_past` tokens under `po` (its budget
/// included); `io` gives the other read settings. None when no combination plans.
#[allow(clippy::too_many_arguments)]
pub fn choose(
    gguf: &GgufFile,
    cfg: &ModelConfig,
    po: &PlanOptions,
    max_binding: u64,
    cal: &Calibration,
    n_past: usize,
    space: &Space,
    io: &RunIo,
) -> Option<Choice> {
    let mut best: Option<Choice> = None;
    for &p in &space.prefetches {
        for &chunk in &space.ring_chunks {
            let mut o = po.clone();
            o.prefetch = p;
            o.ring_chunk = chunk;
            let mut candidates: Vec<(ResidentSpec, ExecPlan)> = Vec::new();
            if space.placements {
                o.resident = ResidentSpec::Auto;
            }
            if let Some(plan) = plan_within(gguf, cfg, max_binding, &o) {
                let everything = !plan.placement.streaming;
                candidates.push((o.resident.clone(), plan));
                if space.placements
                    && !everything
                    && let Some(h) = head_first(gguf, cfg, max_binding, &o)
                {
                    candidates.push(h);
                }
            } else if space.placements
                && let Some(h) = head_first(gguf, cfg, max_binding, &o)
            {
                candidates.push(h);
            }
            for (spec, plan) in candidates {
                for &mode in &space.modes {
                    let run = RunIo {
                        mode: mode.to_string(),
                        ..io.clone()
                    };
                    let t = predict_token(cal, &token_work(&plan, n_past, &run, 0.5)).ms_per_token;
                    if best.as_ref().is_none_or(|b| t < b.ms_per_token) {
                        best = Some(Choice {
                            prefetch: p,
                            io: mode,
                            ring_chunk: plan.ring_chunk,
                            ring_slots: if plan.placement.streaming || plan.kv.streams {
                                plan.ring_slots
                            } else {
                                0
                            },
                            resident: spec.clone(),
                            placement: placement_summary(&plan.placement),
                            total: plan.total,
                            ms_per_token: t,
                        });
                    }
                }
            }
        }
    }
    best
}
