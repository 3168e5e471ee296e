//! The sized points a calibration keeps (overlap β and in-pass factors by layer or pass size,
//! matrix rates by shape, flash rates by piece) and how a value is read between them.

use serde::{Deserialize, Serialize};

/// The overlap share β measured on a model whose streamed layers are `layer_bytes` each.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct OverlapPoint {
    pub layer_bytes: u64,
    pub beta: f64,
}

/// An in-pass factor (the decode's or the prefill's) measured on a model whose decode step
/// reads `pass_bytes` of matrix weights.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct PrefillPoint {
    pub pass_bytes: u64,
    pub scale: f64,
}

/// The value at `x` of points (size, value) on a log scale of size: linear between the two
/// nearest, the nearest end's outside them; None without points.
pub(super) fn log_interp(points: &[(u64, f64)], x: u64) -> Option<f64> {
    let mut pts: Vec<(u64, f64)> = points
        .iter()
        .copied()
        .filter(|&(at, v)| at > 0 && v.is_finite())
        .collect();
    pts.sort_by_key(|p| p.0);
    let (first, last) = (*pts.first()?, *pts.last()?);
    let ln = |at: u64| (at.max(1) as f64).ln();
    let lx = ln(x);
    if x == 0 || lx <= ln(first.0) {
        return Some(first.1);
    }
    if lx >= ln(last.0) {
        return Some(last.1);
    }
    pts.windows(2)
        .find(|w| lx <= ln(w[1].0))
        .map(|w| {
            let f = (lx - ln(w[0].0)) / (ln(w[1].0) - ln(w[0].0)).max(1e-12);
            w[0].1 + f * (w[1].1 - w[0].1)
        })
        .or(Some(last.1))
}

/// The measured rates of one matrix shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MatmulPoint {
    pub ty: String,
    pub rows: u32,
    pub cols: u32,
    pub bytes: u64,
    /// Decode GB/s of weights, and prefill GB/s of weights × tokens.
    pub decode_gb_s: f64,
    pub prefill_gb_s: f64,
    /// Measured on a matrix of the calibrated model (else a synthetic one).
    pub model: bool,
}

/// Rows of a matrix at most that calibration measures (larger ones are measured on this many).
pub const MAX_MEASURED_ROWS: u64 = 4096;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FlashRate {
    pub mode: String,
    pub piece: u64,
    pub threads: usize,
    pub gb_s: f64,
}

/// In-pass factors by model size for the calibration table (`single` where none are sized).
pub(super) fn factors(points: &[PrefillPoint], single: f64) -> String {
    if points.is_empty() {
        return format!("{single:.2}×");
    }
    let mut pts = points.to_vec();
    pts.sort_by_key(|p| p.pass_bytes);
    pts.iter()
        .map(|p| {
            format!(
                "{:.2}× (a model whose decode step reads {:.0} MB of matrices)",
                bounded_factor(p.scale),
                p.pass_bytes as f64 / 1e6
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The factor of `points` at `pass_bytes` (`fallback` without points), bounded.
pub(super) fn sized_factor(points: &[PrefillPoint], pass_bytes: u64, fallback: f64) -> f64 {
    let pts: Vec<(u64, f64)> = points.iter().map(|p| (p.pass_bytes, p.scale)).collect();
    bounded_factor(log_interp(&pts, pass_bytes).unwrap_or(fallback))
}

/// An in-pass factor as used: within 0.25-4, and 1 where it is not a positive number.
pub(super) fn bounded_factor(k: f64) -> f64 {
    if k.is_finite() && k > 0.0 {
        k.clamp(0.25, 4.0)
    } else {
        1.0
    }
}
