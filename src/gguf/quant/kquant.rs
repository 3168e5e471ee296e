//! The K-quants: 256-weight super-blocks made of 16- or 32-weight sub-blocks, each with its own
//! small integer scale (and, for `Q2_K`, `Q4_K` and `Q5_K`, a min) relative to f16 super-block
//! factors. Layouts (bytes, little-endian; e is the weight's index in the super-block):
//!
//! - `Q2_K` (84): `scales[16]`, `qs[64]`, f16 `d`, f16 `dmin`. Sub-block g = e / 16 has
//!   `sc = scales[g] & 15`, `m = scales[g] >> 4`. With h = e / 128, s = (e % 128) / 32 and
//!   l = e % 32 the code is `(qs[32h + l] >> 2s) & 3`; w = (d * sc) * q - dmin * m.
//! - `Q3_K` (110): `hmask[32]`, `qs[64]`, `scales[12]`, f16 `d`. Sub-block g = e / 16 has a
//!   6-bit scale: low four bits from `scales[g % 8]` (low nibble for g < 8, high nibble after),
//!   top two bits `(scales[8 + g % 4] >> 2 * (g / 4)) & 3`; its value is that minus 32. The
//!   code is `(qs[32h + l] >> 2s) & 3` (h, s, l as in `Q2_K`) minus 4 unless bit `4h + s` of
//!   `hmask[l]` is set; w = (d * scale) * q.
//! - `Q4_K` (144): f16 `d`, f16 `dmin`, `scales[12]`, `qs[128]`. Sub-block j = e / 32 has a
//!   6-bit scale and min ([`scale_min_k4`]); its codes are the low (j even) or high (j odd)
//!   nibbles of `qs[32 (j / 2) ..][..32]`; w = (d * sc) * q - dmin * m.
//! - `Q5_K` (176): f16 `d`, f16 `dmin`, `scales[12]`, `qh[32]`, `qs[128]`: `Q4_K` codes plus a
//!   fifth bit, bit j of `qh[e % 32]`.
//! - `Q6_K` (210): `ql[128]`, `qh[64]`, `scales[16]` (signed bytes), f16 `d`. With h = e / 128,
//!   s = (e % 128) / 32 and l = e % 32 the low four bits are the low (s < 2) or high nibble of
//!   `ql[64h + 32 (s % 2) + l]`, the top two `(qh[32h + l] >> 2s) & 3`; the code is that
//!   minus 32 and w = (d * scales[e / 16]) * q.

use half::f16;

use super::{QK_K, f16_at};

/// The 6-bit scale and min of sub-block `j` (0..8) of a `Q4_K` or `Q5_K` super-block: for j < 4
/// the low six bits of bytes j and j + 4; otherwise the nibbles of byte j + 4 topped by the two
/// high bits of bytes j - 4 and j.
pub(super) fn scale_min_k4(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The 16 signed 6-bit scales of a `Q3_K` super-block (already less 32).
pub(super) fn scales_q3_k(s: &[u8; 12]) -> [i32; 16] {
    std::array::from_fn(|g| {
        let low = (s[g % 8] >> (4 * (g / 8))) & 0x0F;
        let high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        i32::from(low | (high << 4)) - 32
    })
}

fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    std::array::from_fn(|i| b[i])
}

pub(super) fn dequantize_q2_k(src: &[u8], out: &mut [f32]) {
    let (blocks, _) = src.as_chunks::<84>();
    let (outs, _) = out.as_chunks_mut::<QK_K>();
    for (b, o) in blocks.iter().zip(outs) {
        let (scales, rest) = b.split_at(16);
        let (qs, rest) = rest.split_at(64);
        let d = f16_at([rest[0], rest[1]]);
        let dmin = f16_at([rest[2], rest[3]]);
        for (e, w) in o.iter_mut().enumerate() {
            let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
            let q = (qs[32 * h + l] >> (2 * s)) & 3;
            let sc = scales[e / 16];
            let dl = d * f32::from(sc & 0x0F);
            let ml = dmin * f32::from(sc >> 4);
            *w = dl * f32::from(q) - ml;
        }
    }
}

pub(super) fn dequantize_q3_k(src: &[u8], out: &mut [f32]) {
    let (blocks, _) = src.as_chunks::<110>();
    let (outs, _) = out.as_chunks_mut::<QK_K>();
    for (b, o) in blocks.iter().zip(outs) {
        let (hmask, rest) = b.split_at(32);
        let (qs, rest) = rest.split_at(64);
        let scales = scales_q3_k(&array(rest));
        let d = f16_at([rest[12], rest[13]]);
        for (e, w) in o.iter_mut().enumerate() {
            let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
            let low = i32::from((qs[32 * h + l] >> (2 * s)) & 3);
            let high = (hmask[l] >> (4 * h + s)) & 1;
            let q = if high != 0 { low } else { low - 4 };
            let dl = d * scales[e / 16] as f32;
            *w = dl * q as f32;
        }
    }
}

/// `Q4_K` (`qh` empty) or `Q5_K` blocks of `BYTES` bytes.
fn dequantize_q45_k<const BYTES: usize>(src: &[u8], out: &mut [f32]) {
    let (blocks, _) = src.as_chunks::<BYTES>();
    let (outs, _) = out.as_chunks_mut::<QK_K>();
    let qh_len = BYTES - 144;
    for (b, o) in blocks.iter().zip(outs) {
        let d = f16_at([b[0], b[1]]);
        let dmin = f16_at([b[2], b[3]]);
        let scales: [u8; 12] = array(&b[4..]);
        let qh = &b[16..16 + qh_len];
        let qs = &b[16 + qh_len..];
        for (j, sub) in o.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(j, &scales);
            let d1 = d * f32::from(sc);
            let m1 = dmin * f32::from(m);
            for (l, w) in sub.iter_mut().enumerate() {
                let mut q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
                if qh_len > 0 {
                    q |= ((qh[l] >> j) & 1) << 4;
                }
                *w = d1 * f32::from(q) - m1;
            }
        }
    }
}

pub(super) fn dequantize_q4_k(src: &[u8], out: &mut [f32]) {
    dequantize_q45_k::<144>(src, out);
}

pub(super) fn dequantize_q5_k(src: &[u8], out: &mut [f32]) {
    dequantize_q45_k::<176>(src, out);
}

pub(super) fn dequantize_q6_k(src: &[u8], out: &mut [f32]) {
    let (blocks, _) = src.as_chunks::<210>();
    let (outs, _) = out.as_chunks_mut::<QK_K>();
    for (b, o) in blocks.iter().zip(outs) {
        let (ql, rest) = b.split_at(128);
        let (qh, rest) = rest.split_at(64);
        let (scales, rest) = rest.split_at(16);
        let d = f16_at([rest[0], rest[1]]);
        for (e, w) in o.iter_mut().enumerate() {
            let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
            let low = (ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
            let high = (qh[32 * h + l] >> (2 * s)) & 3;
            let q = i32::from(low | (high << 4)) - 32;
            let dl = d * f32::from(scales[e / 16] as i8);
            *w = dl * q as f32;
        }
    }
}

// Quantizers. Not ggml's (whose search for the best scales these do not attempt): each
// sub-block gets the smallest integer scale that covers its values, so no code clips except
// where f16 rounding of the super-block factors costs a fraction of a step.
//
// Asymmetric types (`Q2_K`, `Q4_K`, `Q5_K`): a sub-block's min is `min(0, min x)` and is stored
// as `m = ceil(-min / dmin)` with `dmin = max(-min) / lmax` over the super-block; its scale is
// `sc = ceil(step / d)` where `step = (max x + dmin * m) / qmax` and `d = max(step) / lmax`.
// Codes are `round((x + dmin * m) / (d * sc))`, clamped to `0..=qmax`.
//
// Symmetric types (`Q3_K`, `Q6_K`, and `IQ4_XS` in the `iquant` module): a sub-block's step is
// `max / -qneg` with `max` its value of largest magnitude (sign kept), so that value gets the
// code `-qneg`; the signed scale is `step / d` rounded away from zero, `d = max |step| / lmax`.

/// Ceiling of `v / d` clamped to `0..=lmax` (0 when `d` is 0).
fn ceil_scale(v: f32, d: f32, lmax: u8) -> u8 {
    if d > 0.0 {
        (v / d).ceil().clamp(0.0, f32::from(lmax)) as u8
    } else {
        0
    }
}

/// Asymmetric sub-block quantization of one super-block: (d, dmin, scales, mins, codes).
fn asym<const G: usize>(
    x: &[f32; QK_K],
    qmax: u8,
    lmax: u8,
) -> (f16, f16, Vec<u8>, Vec<u8>, [u8; QK_K]) {
    let groups: Vec<&[f32]> = x.chunks_exact(G).collect();
    let mins: Vec<f32> = groups
        .iter()
        .map(|g| -g.iter().copied().fold(0.0f32, f32::min))
        .collect();
    let dmin = f16::from_f32(mins.iter().copied().fold(0.0, f32::max) / f32::from(lmax));
    let lm: Vec<u8> = mins
        .iter()
        .map(|&m| ceil_scale(m, dmin.to_f32(), lmax))
        .collect();
    let offsets: Vec<f32> = lm.iter().map(|&m| dmin.to_f32() * f32::from(m)).collect();
    let steps: Vec<f32> = groups
        .iter()
        .zip(&offsets)
        .map(|(g, &o)| (g.iter().copied().fold(f32::MIN, f32::max) + o).max(0.0) / f32::from(qmax))
        .collect();
    let d = f16::from_f32(steps.iter().copied().fold(0.0, f32::max) / f32::from(lmax));
    let ls: Vec<u8> = steps
        .iter()
        .map(|&s| ceil_scale(s, d.to_f32(), lmax))
        .collect();
    let mut codes = [0u8; QK_K];
    for (e, (c, &v)) in codes.iter_mut().zip(x).enumerate() {
        let step = d.to_f32() * f32::from(ls[e / G]);
        if step > 0.0 {
            *c = ((v + offsets[e / G]) / step)
                .round()
                .clamp(0.0, f32::from(qmax)) as u8;
        }
    }
    (d, dmin, ls, lm, codes)
}

/// Symmetric sub-block quantization of one super-block: (d, signed scales, codes + qneg).
pub(super) fn sym<const G: usize>(
    x: &[f32; QK_K],
    qneg: i32,
    lmax: i32,
    encode: impl Fn(f32) -> u8,
) -> (f16, Vec<i32>, [u8; QK_K]) {
    let steps: Vec<f32> = x
        .chunks_exact(G)
        .map(|g| {
            let max = g
                .iter()
                .copied()
                .fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m });
            max / -(qneg as f32)
        })
        .collect();
    let d = f16::from_f32(steps.iter().fold(0.0f32, |a, s| a.max(s.abs())) / lmax as f32);
    let ls: Vec<i32> = steps
        .iter()
        .map(|&s| {
            let mag = i32::from(ceil_scale(s.abs(), d.to_f32(), lmax as u8));
            if s < 0.0 { -mag } else { mag }
        })
        .collect();
    let mut codes = [0u8; QK_K];
    for (e, (c, &v)) in codes.iter_mut().zip(x).enumerate() {
        let step = d.to_f32() * ls[e / G] as f32;
        *c = encode(if step != 0.0 { v / step } else { 0.0 });
    }
    (d, ls, codes)
}

/// Signed code of `v` (a multiple of the step) in `-qneg..qneg`, stored plus `qneg`.
fn sym_code(v: f32, qneg: i32) -> u8 {
    (v.round().clamp(-(qneg as f32), (qneg - 1) as f32) as i32 + qneg) as u8
}

pub(super) fn quantize_block_q2_k(x: &[f32; QK_K], out: &mut Vec<u8>) {
    let (d, dmin, ls, lm, codes) = asym::<16>(x, 3, 15);
    out.extend(ls.iter().zip(&lm).map(|(&s, &m)| s | (m << 4)));
    let mut qs = [0u8; 64];
    for (e, &q) in codes.iter().enumerate() {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        qs[32 * h + l] |= q << (2 * s);
    }
    out.extend_from_slice(&qs);
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
}

pub(super) fn quantize_block_q3_k(x: &[f32; QK_K], out: &mut Vec<u8>) {
    let (d, ls, codes) = sym::<16>(x, 4, 31, |v| sym_code(v, 4));
    let mut hmask = [0u8; 32];
    let mut qs = [0u8; 64];
    for (e, &u) in codes.iter().enumerate() {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        qs[32 * h + l] |= (u & 3) << (2 * s);
        hmask[l] |= (u >> 2) << (4 * h + s);
    }
    let mut scales = [0u8; 12];
    for (g, &s) in ls.iter().enumerate() {
        let u = (s + 32) as u8;
        scales[g % 8] |= (u & 0x0F) << (4 * (g / 8));
        scales[8 + g % 4] |= (u >> 4) << (2 * (g / 4));
    }
    out.extend_from_slice(&hmask);
    out.extend_from_slice(&qs);
    out.extend_from_slice(&scales);
    out.extend_from_slice(&d.to_le_bytes());
}

/// `Q4_K` (`five` false) or `Q5_K`.
fn quantize_block_q45_k(x: &[f32; QK_K], five: bool, out: &mut Vec<u8>) {
    let (d, dmin, ls, lm, codes) = asym::<32>(x, if five { 31 } else { 15 }, 63);
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = ls[j] | ((ls[j + 4] >> 4) << 6);
        s[j + 4] = lm[j] | ((lm[j + 4] >> 4) << 6);
        s[j + 8] = (ls[j + 4] & 0x0F) | ((lm[j + 4] & 0x0F) << 4);
    }
    out.extend_from_slice(&s);
    let mut qh = [0u8; 32];
    let mut qs = [0u8; 128];
    for (e, &q) in codes.iter().enumerate() {
        let (j, l) = (e / 32, e % 32);
        qs[32 * (j / 2) + l] |= (q & 0x0F) << (4 * (j % 2));
        qh[l] |= (q >> 4) << j;
    }
    if five {
        out.extend_from_slice(&qh);
    }
    out.extend_from_slice(&qs);
}

pub(super) fn quantize_block_q4_k(x: &[f32; QK_K], out: &mut Vec<u8>) {
    quantize_block_q45_k(x, false, out);
}

pub(super) fn quantize_block_q5_k(x: &[f32; QK_K], out: &mut Vec<u8>) {
    quantize_block_q45_k(x, true, out);
}

pub(super) fn quantize_block_q6_k(x: &[f32; QK_K], out: &mut Vec<u8>) {
    let (d, ls, codes) = sym::<16>(x, 32, 127, |v| sym_code(v, 32));
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for (e, &u) in codes.iter().enumerate() {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        ql[64 * h + 32 * (s % 2) + l] |= (u & 0x0F) << (4 * (s / 2));
        qh[32 * h + l] |= (u >> 4) << (2 * s);
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(ls.iter().map(|&s| s as i8 as u8));
    out.extend_from_slice(&d.to_le_bytes());
}
