//! `Q5_0` and `Q5_1`: 32 weights per block, 5-bit codes.
//!
//! - `Q5_0`: 22 bytes: f16 `d`, 4 bytes `qh` (a little-endian u32), 16 bytes `qs`;
//!   w = d * (q - 16).
//! - `Q5_1`: 24 bytes: f16 `d`, f16 `m`, `qh`, `qs`; w = d * q + m.
//!
//! Code j's low four bits are the low nibble of `qs[j]` (j < 16) or the high nibble of
//! `qs[j - 16]`; its fifth bit is bit j of `qh`.
//!
//! The quantizers follow ggml's reference quantizers bit for bit: `Q5_0` takes `max`, the value
//! of largest magnitude (sign kept), `d = max / -16`, `q = min(31, trunc(x * id + 16.5))`;
//! `Q5_1` takes `d = (max - min) / 31`, `m = min`, `q = min(31, trunc((x - min) * id + 0.5))`;
//! `id = 1 / d` from the f32 `d` (0 when `d` is 0) before `d` and `m` are stored as f16.

use half::f16;

use super::{QK, f16_at, reciprocal};

/// The 32 5-bit codes of a block from its `qh` word and 16 `qs` bytes.
fn codes(qh: u32, qs: &[u8]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for (j, &b) in qs.iter().enumerate().take(QK / 2) {
        q[j] = (b & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[j + QK / 2] = (b >> 4) | ((((qh >> (j + QK / 2)) & 1) as u8) << 4);
    }
    q
}

/// Packs 32 5-bit codes into `qh` (4 bytes) then `qs` (16 bytes).
fn pack(codes: &[u8; QK], out: &mut Vec<u8>) {
    let qh = codes
        .iter()
        .enumerate()
        .fold(0u32, |acc, (j, &q)| acc | (u32::from(q >> 4) & 1) << j);
    out.extend_from_slice(&qh.to_le_bytes());
    let (lo, hi) = codes.split_at(QK / 2);
    out.extend(lo.iter().zip(hi).map(|(&l, &h)| (l & 0x0F) | (h << 4)));
}

pub(super) fn dequantize_q5_0(src: &[u8], out: &mut [f32]) {
    let (blocks, _) = src.as_chunks::<22>();
    let (outs, _) = out.as_chunks_mut::<QK>();
    for (b, o) in blocks.iter().zip(outs) {
        let d = f16_at([b[0], b[1]]);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for (w, q) in o.iter_mut().zip(codes(qh, &b[6..])) {
            *w = d * (i32::from(q) - 16) as f32;
        }
    }
}

pub(super) fn dequantize_q5_1(src: &[u8], out: &mut [f32]) {
    let (blocks, _) = src.as_chunks::<24>();
    let (outs, _) = out.as_chunks_mut::<QK>();
    for (b, o) in blocks.iter().zip(outs) {
        let d = f16_at([b[0], b[1]]);
        let m = f16_at([b[2], b[3]]);
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for (w, q) in o.iter_mut().zip(codes(qh, &b[8..])) {
            *w = d * f32::from(q) + m;
        }
    }
}

pub(super) fn quantize_block_q5_0(x: &[f32; QK], out: &mut Vec<u8>) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -16.0;
    let id = reciprocal(d);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    pack(&x.map(|v| ((v * id + 16.5) as i8).clamp(0, 31) as u8), out);
}

pub(super) fn quantize_block_q5_1(x: &[f32; QK], out: &mut Vec<u8>) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / 31.0;
    let id = reciprocal(d);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
    pack(
        &x.map(|v| (((v - min) * id + 0.5) as i8).clamp(0, 31) as u8),
        out,
    );
}
