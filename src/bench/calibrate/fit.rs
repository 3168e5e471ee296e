//! What `calibrate` fits from its engine runs: the in-pass compute factors, β, the unhidden
//! share of host copies and the wait for page scores, each against the model's prediction of
//! the same run.

use crate::engine::Engine;
use crate::plan::perf::{Calibration, Prediction, PrefillPoint, TokenWork};

/// The in-pass compute scale: a resident run's measured ms/token over what `cal`'s kernel
/// rates add up to for its work `w`, attention taken off both (1 when either is missing), and
/// that sum (attention included) in ms.
pub(super) fn fitted_scale(cal: &Calibration, w: &TokenWork, measured_ms: f64) -> (f64, f64) {
    let mut at_rates = cal.clone();
    at_rates.compute_scale = 1.0;
    at_rates.compute_points.clear();
    let kernels_ms = crate::plan::perf::predict_token(&at_rates, w).compute_ms;
    // The factor is not put on attention: the run's attention at its rate comes off both.
    let attn_ms = crate::plan::perf::attention_s(cal, w) * 1e3;
    if kernels_ms > attn_ms && measured_ms > attn_ms {
        ((measured_ms - attn_ms) / (kernels_ms - attn_ms), kernels_ms)
    } else {
        (1.0, kernels_ms)
    }
}

/// The prefill's in-pass factor on a resident engine's model: its measured time to first token
/// for a prompt of `prompt` tokens over what `cal`'s prefill rates add up to for it, attention
/// taken off both (1 when either is missing), at the weight bytes of the model's decode step.
pub(super) fn fitted_prefill_point(
    cal: &Calibration,
    resident: &Engine,
    prompt: usize,
    measured_ms: f64,
) -> PrefillPoint {
    let mut at_rates = cal.clone();
    at_rates.prefill_scale = 1.0;
    at_rates.prefill_points.clear();
    let kernels_ms = resident.predict(&at_rates, 0, prompt, 0.0).1;
    let attn_ms =
        crate::plan::perf::prefill_attention_ms(cal, &resident.token_work(0.0), 0, prompt);
    let scale = if kernels_ms > attn_ms && measured_ms > attn_ms {
        (measured_ms - attn_ms) / (kernels_ms - attn_ms)
    } else {
        1.0
    };
    let pass_bytes = resident
        .token_work(0.0)
        .matrices
        .iter()
        .map(|m| m.bytes)
        .sum();
    eprintln!(
        "prefill, {:.0} MB decode step: resident time to first token {measured_ms:.1} ms ({prompt} tokens), kernels at their rates {kernels_ms:.1} ms: x{scale:.2}",
        pass_bytes as f64 / 1e6
    );
    PrefillPoint { pass_bytes, scale }
}

/// Seconds of one wait for page scores in a pass: the bare round trip `bare_s` plus what a
/// selecting run measured beyond its prediction with bare waits (both as gaps to its dense
/// pair: `predicted_ms`, `measured_ms`), shared over its `syncs` waits; never below the bare
/// round trip (`bare_s` without waits).
pub(super) fn fitted_sync_s(bare_s: f64, predicted_ms: f64, measured_ms: f64, syncs: u64) -> f64 {
    if syncs == 0 {
        return bare_s;
    }
    (bare_s + (measured_ms - predicted_ms) / 1e3 / syncs as f64).max(bare_s)
}

/// The unhidden share of `copy_ms` of host copies: what a run measured beyond its prediction
/// with the copies hidden, over them (0 to 1; 0 without copies).
pub(super) fn fitted_copy_beta(hidden_ms: f64, measured_ms: f64, copy_ms: f64) -> f64 {
    if copy_ms > 0.0 {
        ((measured_ms - hidden_ms) / copy_ms).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// β: the share of the time the pipeline simulation hides (perfect overlap) that a measured
/// token of `measured_ms` did not hide.
pub(super) fn fitted_beta(pred: &Prediction, measured_ms: f64) -> f64 {
    if pred.overlapped_ms > 0.0 {
        ((measured_ms - pred.pipelined_ms) / pred.overlapped_ms).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_of_the_waits_and_the_copies() {
        // 28 waits; a run 14 ms over its prediction with 50 µs waits: 550 µs a wait.
        assert!((fitted_sync_s(50e-6, 100.0, 114.0, 28) - 550e-6).abs() < 1e-12);
        // The same as gaps to a dense pair (predicted 2 ms apart, measured 16).
        assert!((fitted_sync_s(50e-6, 2.0, 16.0, 28) - 550e-6).abs() < 1e-12);
        // Faster than predicted: never below the bare round trip; no waits: the bare one.
        assert_eq!(fitted_sync_s(50e-6, 100.0, 90.0, 28), 50e-6);
        assert_eq!(fitted_sync_s(50e-6, 100.0, 114.0, 0), 50e-6);
        // 4 ms over with 8 ms of copies: half unhidden; held to 0..1; no copies: 0.
        assert!((fitted_copy_beta(40.0, 44.0, 8.0) - 0.5).abs() < 1e-12);
        assert_eq!(fitted_copy_beta(40.0, 60.0, 8.0), 1.0);
        assert_eq!(fitted_copy_beta(40.0, 30.0, 8.0), 0.0);
        assert_eq!(fitted_copy_beta(40.0, 60.0, 0.0), 0.0);
    }
}
