//! `IQ4_NL` and `IQ4_XS`: 4-bit codes that index a fixed non-uniform table of 16 values.
//!
//! - `IQ4_NL` (18 bytes, 32 weights): f16 `d`, `qs[16]` in `Q4_0`'s nibble order (byte j holds
//!   weight j in its low nibble and weight j + 16 in its high nibble); w = d * TABLE[q].
//! - `IQ4_XS` (136 bytes, 256 weights): f16 `d`, u16 `scales_h`, `scales_l[4]`, `qs[128]`.
//!   Sub-block j (32 weights, `qs[16 j ..][..16]` in `IQ4_NL`'s order) has the 6-bit scale
//!   `ls = ((scales_l[j / 2] >> 4 (j % 2)) & 15) | (((scales_h >> 2 j) & 3) << 4)`;
//!   w = (d * (ls - 32)) * TABLE[q].
//!
//! Quantizers (not ggml's, which searches for the best scale): `IQ4_NL` maps a block's value
//! of largest magnitude (sign kept) to -127, `d = max / -127`; `IQ4_XS` does the same per
//! sub-block and stores each sub-block's step as a signed 6-bit multiple of
//! `d = max |step| / 31`, rounded away from zero. Each weight gets the table entry nearest to
//! `x / step` (the lower one on a tie).

use half::f16;

use super::kquant::sym;
use super::{QK, QK_K, f16_at, reciprocal};

/// The non-uniform code book shared by both types.
pub const IQ4_TABLE: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Decodes 16 nibble bytes into 32 weights `scale * TABLE[q]` in `Q4_0`'s order.
fn unpack(qs: &[u8], scale: f32, out: &mut [f32]) {
    let (lo, hi) = out.split_at_mut(QK / 2);
    for ((&q, l), h) in qs.iter().zip(lo.iter_mut()).zip(hi.iter_mut()) {
        *l = scale * f32::from(IQ4_TABLE[usize::from(q & 0x0F)]);
        *h = scale * f32::from(IQ4_TABLE[usize::from(q >> 4)]);
    }
}

pub(super) fn dequantize_iq4_nl(src: &[u8], out: &mut [f32]) {
    let (blocks, _) = src.as_chunks::<18>();
    let (outs, _) = out.as_chunks_mut::<QK>();
    for (b, o) in blocks.iter().zip(outs) {
        unpack(&b[2..], f16_at([b[0], b[1]]), o);
    }
}

pub(super) fn dequantize_iq4_xs(src: &[u8], out: &mut [f32]) {
    let (blocks, _) = src.as_chunks::<136>();
    let (outs, _) = out.as_chunks_mut::<QK_K>();
    for (b, o) in blocks.iter().zip(outs) {
        let d = f16_at([b[0], b[1]]);
        let scales_h = u16::from_le_bytes([b[2], b[3]]);
        for (j, sub) in o.chunks_exact_mut(QK).enumerate() {
            let low = (b[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
            let high = ((scales_h >> (2 * j)) & 3) as u8;
            let dl = d * (i32::from(low | (high << 4)) - 32) as f32;
            unpack(&b[8 + 16 * j..8 + 16 * (j + 1)], dl, sub);
        }
    }
}

/// The index of the table entry nearest to `v` (the lower one on a tie).
fn nearest(v: f32) -> u8 {
    let mut best = 0u8;
    let mut err = f32::INFINITY;
    for (i, &t) in IQ4_TABLE.iter().enumerate() {
        let e = (v - f32::from(t)).abs();
        if e < err {
            err = e;
            best = i as u8;
        }
    }
    best
}

/// Packs 32 codes in `Q4_0`'s nibble order.
fn pack(codes: &[u8], out: &mut Vec<u8>) {
    let (lo, hi) = codes.split_at(QK / 2);
    out.extend(lo.iter().zip(hi).map(|(&l, &h)| l | (h << 4)));
}

pub(super) fn quantize_block_iq4_nl(x: &[f32; QK], out: &mut Vec<u8>) {
    let max = x
        .iter()
        .copied()
        .fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m });
    let d = f16::from_f32(max / -127.0);
    let id = reciprocal(d.to_f32());
    out.extend_from_slice(&d.to_le_bytes());
    pack(&x.map(|v| nearest(v * id)), out);
}

pub(super) fn quantize_block_iq4_xs(x: &[f32; QK_K], out: &mut Vec<u8>) {
    let (d, ls, codes) = sym::<QK>(x, 127, 31, nearest);
    out.extend_from_slice(&d.to_le_bytes());
    let mut scales_h = 0u16;
    let mut scales_l = [0u8; 4];
    for (j, &s) in ls.iter().enumerate() {
        let u = (s + 32) as u8;
        scales_l[j / 2] |= (u & 0x0F) << (4 * (j % 2));
        scales_h |= u16::from(u >> 4) << (2 * j);
    }
    out.extend_from_slice(&scales_h.to_le_bytes());
    out.extend_from_slice(&scales_l);
    for sub in codes.chunks_exact(QK) {
        pack(sub, out);
    }
}
