//! Tensor element types and their block layouts, with reference (de)quantization on the CPU.
//!
//! Block layouts (bytes, little-endian), as ggml stores them:
//! - `F32`: 4 bytes per weight. `F16`: IEEE half, 2 bytes. `BF16`: upper half of an f32, 2 bytes.
//! - `Q4_0`: 32 weights in 18 bytes: f16 `d`, 16 bytes of nibbles; w = d * (q - 8).
//!   Byte j holds weight j (low nibble) and weight j + 16 (high nibble).
//! - `Q4_1`: 32 weights in 20 bytes: f16 `d`, f16 `m`, 16 bytes of nibbles; w = d * q + m.
//!   Same nibble order as `Q4_0`.
//! - `Q8_0`: 32 weights in 34 bytes: f16 `d`, 32 signed bytes; w = d * q.
//!
//! The quantizers follow ggml's reference (`*_ref`) quantizers bit for bit, so a tensor
//! quantized here matches one quantized by the reference tools:
//! - `Q4_0`: `max` is the value of largest magnitude (sign kept), `d = max / -8`,
//!   `q = min(15, trunc(x * id + 8.5))`.
//! - `Q4_1`: `d = (max - min) / 15`, `m = min`, `q = min(15, trunc((x - min) * id + 0.5))`.
//! - `Q8_0`: `d = amax / 127`, `q = round(x * id)` (half away from zero).
//!
//! In all three `id = 1 / d` is taken from the f32 `d` (0 when `d` is 0) before `d` (and `m`)
//! are rounded to f16 for storage.
//!
//! The other formats live in submodules: `Q5_0` and `Q5_1` (`q5`, ggml's reference quantizers),
//! the K-quants `Q2_K`..`Q6_K` (`kquant`) and `IQ4_NL`/`IQ4_XS` (`iquant`); their module docs
//! give the layouts and the (simpler than ggml's) quantizers used for test models.

use half::{bf16, f16};

mod iquant;
mod kquant;
mod q5;
#[cfg(test)]
mod roundtrip_tests;
mod types;

pub use iquant::IQ4_TABLE;
pub use types::{GgmlType, QK, QK_K, ggml_type_name};

fn f16_at(b: [u8; 2]) -> f32 {
    f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// Splits a block's 16 nibble bytes into weights `0..16` (low nibbles) and `16..32` (high).
fn unpack_nibbles(qs: &[u8; 16], out: &mut [f32; QK], f: impl Fn(u8) -> f32) {
    let (lo, hi) = out.split_at_mut(QK / 2);
    for ((&q, l), h) in qs.iter().zip(lo.iter_mut()).zip(hi.iter_mut()) {
        *l = f(q & 0x0F);
        *h = f(q >> 4);
    }
}

/// Decode `out.len()` elements from `src` (which holds exactly their blocks).
///
/// # Panics
/// If `out.len()` is not a whole number of blocks or `src` does not hold exactly
/// `ty.bytes_for(out.len())` bytes. Tensor data returned by
/// [`GgufFile::tensor_data`](super::GgufFile::tensor_data) always fits its tensor.
pub fn dequantize(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    let expected = ty.bytes_for(out.len() as u64);
    assert!(
        expected == Some(src.len() as u64),
        "dequantize {ty}: {} bytes cannot hold exactly {} elements",
        src.len(),
        out.len()
    );
    match ty {
        GgmlType::F32 => {
            let (chunks, _) = src.as_chunks::<4>();
            for (o, c) in out.iter_mut().zip(chunks) {
                *o = f32::from_le_bytes(*c);
            }
        }
        GgmlType::F16 => {
            let (chunks, _) = src.as_chunks::<2>();
            for (o, c) in out.iter_mut().zip(chunks) {
                *o = f16_at(*c);
            }
        }
        GgmlType::BF16 => {
            let (chunks, _) = src.as_chunks::<2>();
            for (o, c) in out.iter_mut().zip(chunks) {
                *o = bf16::from_bits(u16::from_le_bytes(*c)).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            let (blocks, _) = src.as_chunks::<18>();
            let (outs, _) = out.as_chunks_mut::<QK>();
            for (b, o) in blocks.iter().zip(outs) {
                let [d0, d1, qs @ ..] = *b;
                let d = f16_at([d0, d1]);
                unpack_nibbles(&qs, o, |q| d * (i32::from(q) - 8) as f32);
            }
        }
        GgmlType::Q4_1 => {
            let (blocks, _) = src.as_chunks::<20>();
            let (outs, _) = out.as_chunks_mut::<QK>();
            for (b, o) in blocks.iter().zip(outs) {
                let [d0, d1, m0, m1, qs @ ..] = *b;
                let d = f16_at([d0, d1]);
                let m = f16_at([m0, m1]);
                unpack_nibbles(&qs, o, |q| d * f32::from(q) + m);
            }
        }
        GgmlType::Q8_0 => {
            let (blocks, _) = src.as_chunks::<34>();
            let (outs, _) = out.as_chunks_mut::<QK>();
            for (b, o) in blocks.iter().zip(outs) {
                let [d0, d1, qs @ ..] = *b;
                let d = f16_at([d0, d1]);
                for (w, &q) in o.iter_mut().zip(qs.iter()) {
                    *w = d * f32::from(q as i8);
                }
            }
        }
        GgmlType::Q5_0 => q5::dequantize_q5_0(src, out),
        GgmlType::Q5_1 => q5::dequantize_q5_1(src, out),
        GgmlType::Q2_K => kquant::dequantize_q2_k(src, out),
        GgmlType::Q3_K => kquant::dequantize_q3_k(src, out),
        GgmlType::Q4_K => kquant::dequantize_q4_k(src, out),
        GgmlType::Q5_K => kquant::dequantize_q5_k(src, out),
        GgmlType::Q6_K => kquant::dequantize_q6_k(src, out),
        GgmlType::IQ4_NL => iquant::dequantize_iq4_nl(src, out),
        GgmlType::IQ4_XS => iquant::dequantize_iq4_xs(src, out),
    }
}

/// Decode `n` elements into a new vector (see [`dequantize`] for the panics).
pub fn dequantize_to_vec(ty: GgmlType, src: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    dequantize(ty, src, &mut out);
    out
}

fn reciprocal(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// Packs 32 nibble codes: code j in the low nibble of byte j, code j + 16 in its high nibble.
fn pack_nibbles(codes: &[u8; QK], out: &mut Vec<u8>) {
    let (lo, hi) = codes.split_at(QK / 2);
    out.extend(lo.iter().zip(hi).map(|(&l, &h)| (l & 0x0F) | (h << 4)));
}

fn quantize_block_q4_0(x: &[f32; QK], out: &mut Vec<u8>) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = reciprocal(d);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    let codes = x.map(|v| ((v * id + 8.5) as i8).clamp(0, 15) as u8);
    pack_nibbles(&codes, out);
}

fn quantize_block_q4_1(x: &[f32; QK], out: &mut Vec<u8>) {
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
    let d = (max - min) / 15.0;
    let id = reciprocal(d);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
    let codes = x.map(|v| (((v - min) * id + 0.5) as i8).clamp(0, 15) as u8);
    pack_nibbles(&codes, out);
}

fn quantize_block_q8_0(x: &[f32; QK], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = reciprocal(d);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
}

/// Quantize `src` block by block with `f` (`src` holds whole blocks).
fn blocks<const N: usize>(src: &[f32], out: &mut Vec<u8>, f: impl Fn(&[f32; N], &mut Vec<u8>)) {
    let (chunks, _) = src.as_chunks::<N>();
    for b in chunks {
        f(b, out);
    }
}

/// Encode values into `ty`'s blocks (used by tests and tiny test models). `src.len()` must be
/// a multiple of the block length. `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1` and `Q8_0` follow ggml's
/// reference quantizers bit for bit; the K-quants and IQ4 types use the simpler covering-scale
/// quantizers described in their modules (valid blocks, but not the bytes ggml would write).
///
/// # Panics
/// If `src.len()` is not a whole number of blocks.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Vec<u8> {
    let n = src.len() as u64;
    let Some(n_bytes) = ty.bytes_for(n) else {
        panic!(
            "quantize {ty}: {n} elements are not a whole number of {}-element blocks",
            ty.block_len()
        );
    };
    let mut out = Vec::with_capacity(usize::try_from(n_bytes).unwrap_or(0));
    match ty {
        GgmlType::F32 => src
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        GgmlType::F16 => src
            .iter()
            .for_each(|&v| out.extend_from_slice(&f16::from_f32(v).to_le_bytes())),
        GgmlType::BF16 => src
            .iter()
            .for_each(|&v| out.extend_from_slice(&bf16::from_f32(v).to_le_bytes())),
        GgmlType::Q4_0 => blocks(src, &mut out, quantize_block_q4_0),
        GgmlType::Q4_1 => blocks(src, &mut out, quantize_block_q4_1),
        GgmlType::Q5_0 => blocks(src, &mut out, q5::quantize_block_q5_0),
        GgmlType::Q5_1 => blocks(src, &mut out, q5::quantize_block_q5_1),
        GgmlType::Q8_0 => blocks(src, &mut out, quantize_block_q8_0),
        GgmlType::IQ4_NL => blocks(src, &mut out, iquant::quantize_block_iq4_nl),
        GgmlType::Q2_K => blocks(src, &mut out, kquant::quantize_block_q2_k),
        GgmlType::Q3_K => blocks(src, &mut out, kquant::quantize_block_q3_k),
        GgmlType::Q4_K => blocks(src, &mut out, kquant::quantize_block_q4_k),
        GgmlType::Q5_K => blocks(src, &mut out, kquant::quantize_block_q5_k),
        GgmlType::Q6_K => blocks(src, &mut out, kquant::quantize_block_q6_k),
        GgmlType::IQ4_XS => blocks(src, &mut out, iquant::quantize_block_iq4_xs),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic generator (xorshift64*), enough for test data.
    struct Rng(u64);
    impl Rng {
        fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        /// Uniform in [-1, 1).
        fn unit(&mut self) -> f32 {
            ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    fn random_data(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = Rng(seed);
        (0..n)
            .map(|i| {
                // Vary the scale per block so small and large blocks are both exercised.
                let scale = match (i / QK) % 4 {
                    0 => 1.0,
                    1 => 0.01,
                    2 => 30.0,
                    _ => 1e-4,
                };
                rng.unit() * scale
            })
            .collect()
    }

    /// The most that storing `x` as f16 can change it (relative for normals, absolute for
    /// subnormals), with a little slack for f32 arithmetic.
    fn f16_err(x: f32) -> f32 {
        (x.abs() / 2048.0).max(2f32.powi(-25)) * 1.001
    }

    fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
        let q = quantize(ty, x);
        assert_eq!(q.len() as u64, ty.bytes_for(x.len() as u64).unwrap());
        dequantize_to_vec(ty, &q, x.len())
    }

    #[test]
    fn type_ids_and_names() {
        for ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(ty.id()), Ok(ty));
            assert_eq!(ggml_type_name(ty.id()), Some(ty.name()));
        }
        assert_eq!(GgmlType::from_id(14), Ok(GgmlType::Q6_K));
        assert_eq!(GgmlType::from_id(9), Err(Some("Q8_1")));
        assert_eq!(GgmlType::from_id(39), Err(Some("MXFP4")));
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 40, u32::MAX] {
            assert_eq!(GgmlType::from_id(removed), Err(None), "id {removed}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(GgmlType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(GgmlType::Q4_1.bytes_for(32), Some(20));
        assert_eq!(GgmlType::Q8_0.bytes_for(96), Some(102));
        assert_eq!(GgmlType::F16.bytes_for(3), Some(6));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
        assert_eq!(GgmlType::Q8_0.bytes_for(u64::MAX / 32 * 32), None);
        assert_eq!(
            GgmlType::Q4_0.bytes_for(u64::MAX / 32 * 32),
            Some((u64::MAX / 32) * 18)
        );
    }

    #[test]
    fn f32_is_exact() {
        let x = random_data(1, 256);
        assert_eq!(round_trip(GgmlType::F32, &x), x);
    }

    #[test]
    fn f16_and_bf16_error_bounds() {
        let x = random_data(2, 1024);
        for (ty, rel) in [(GgmlType::F16, 1.0 / 2048.0), (GgmlType::BF16, 1.0 / 256.0)] {
            let y = round_trip(ty, &x);
            for (a, b) in x.iter().zip(&y) {
                // Half-precision subnormals add an absolute error of at most 2^-25.
                assert!((a - b).abs() <= a.abs() * rel + 3e-8, "{ty}: {a} -> {b}");
            }
        }
    }

    #[test]
    fn q8_0_error_bound() {
        let x = random_data(3, 32 * 64);
        let y = round_trip(GgmlType::Q8_0, &x);
        for (xb, yb) in x.chunks(QK).zip(y.chunks(QK)) {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let bound = d * 0.5 * 1.001 + 127.0 * f16_err(d);
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= bound, "{a} -> {b}, bound {bound}");
            }
        }
    }

    #[test]
    fn q4_0_error_bound() {
        let x = random_data(4, 32 * 64);
        let y = round_trip(GgmlType::Q4_0, &x);
        for (xb, yb) in x.chunks(QK).zip(y.chunks(QK)) {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let d = amax / 8.0;
            // Half a step inside the range; a whole step at the clipped end (q = 16 -> 15).
            let bound = d * 1.001 + 8.0 * f16_err(d);
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= bound, "{a} -> {b}, bound {bound}");
            }
            // The largest-magnitude value is reproduced up to f16 rounding of d.
            let imax = xb.iter().position(|v| v.abs() == amax).unwrap();
            assert!((xb[imax] - yb[imax]).abs() <= 8.0 * f16_err(d));
        }
    }

    #[test]
    fn q4_1_error_bound() {
        let x = random_data(5, 32 * 64);
        let y = round_trip(GgmlType::Q4_1, &x);
        for (xb, yb) in x.chunks(QK).zip(y.chunks(QK)) {
            let min = xb.iter().copied().fold(f32::MAX, f32::min);
            let max = xb.iter().copied().fold(-f32::MAX, f32::max);
            let d = (max - min) / 15.0;
            let bound = d * 0.5 * 1.001 + 15.0 * f16_err(d) + f16_err(min);
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= bound, "{a} -> {b}, bound {bound}");
            }
        }
    }

    #[test]
    fn constant_and_zero_blocks() {
        let zeros = [0.0f32; 512];
        for ty in GgmlType::ALL {
            assert!(round_trip(ty, &zeros).iter().all(|&v| v == 0.0), "{ty}");
        }
        // A constant block: Q4_1 has d = 0 and reproduces the value through m; Q4_0 has
        // d = 0.75 / -8, exact in f16, and code 0.
        let c = [0.75f32; 32];
        assert_eq!(round_trip(GgmlType::Q4_1, &c), c.to_vec());
        assert_eq!(round_trip(GgmlType::Q4_0, &c), c.to_vec());
        assert_eq!(round_trip(GgmlType::Q5_1, &c), c.to_vec());
        assert_eq!(round_trip(GgmlType::Q5_0, &c), c.to_vec());
    }

    #[test]
    fn q4_0_known_block() {
        // d = 1.0; byte j: low nibble j (weight j), high nibble 15 - j (weight j + 16).
        let mut block = vec![0x00, 0x3C];
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = dequantize_to_vec(GgmlType::Q4_0, &block, 32);
        for j in 0..16 {
            assert_eq!(y[j], j as f32 - 8.0);
            assert_eq!(y[j + 16], (15 - j) as f32 - 8.0);
        }
    }

    #[test]
    fn q4_1_known_block() {
        // d = 0.5, m = -1.0.
        let mut block = vec![0x00, 0x38, 0x00, 0xBC];
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = dequantize_to_vec(GgmlType::Q4_1, &block, 32);
        for j in 0..16 {
            assert_eq!(y[j], 0.5 * j as f32 - 1.0);
            assert_eq!(y[j + 16], 0.5 * (15 - j) as f32 - 1.0);
        }
    }

    #[test]
    fn q8_0_known_block() {
        // d = 0.25, q = -128..=-97 as signed bytes.
        let mut block = vec![0x00, 0x34];
        block.extend((0..32i32).map(|j| (-128 + j) as i8 as u8));
        let y = dequantize_to_vec(GgmlType::Q8_0, &block, 32);
        for (j, v) in y.iter().enumerate() {
            assert_eq!(*v, 0.25 * (-128 + j as i32) as f32);
        }
    }

    #[test]
    fn f16_and_bf16_known_values() {
        let f16_bytes = [0x00, 0x3C, 0x00, 0xC0, 0x00, 0x7C];
        assert_eq!(
            dequantize_to_vec(GgmlType::F16, &f16_bytes, 3),
            vec![1.0, -2.0, f32::INFINITY]
        );
        // bf16 1.5 = 0x3FC0, -0.5 = 0xBF00.
        let bf16_bytes = [0xC0, 0x3F, 0x00, 0xBF];
        assert_eq!(
            dequantize_to_vec(GgmlType::BF16, &bf16_bytes, 2),
            vec![1.5, -0.5]
        );
    }

    #[test]
    fn q4_0_quantizer_matches_reference_rule() {
        // Largest magnitude is -8 (negative): d = -8 / -8 = 1, code = trunc(x + 8.5).
        let x: Vec<f32> = (0..32).map(|i| (i % 16) as f32 - 8.0).collect();
        let q = quantize(GgmlType::Q4_0, &x);
        assert_eq!(&q[..2], &[0x00, 0x3C]);
        for j in 0..16 {
            assert_eq!(q[2 + j], (j as u8) | ((j as u8) << 4));
        }
        assert_eq!(dequantize_to_vec(GgmlType::Q4_0, &q, 32), x);

        // Largest magnitude +8 (positive): d = -1, and -8 clips from code 16 to 15 -> -7.
        let mut x = vec![0.0f32; 32];
        x[0] = 8.0;
        x[1] = -8.0;
        x[2] = 2.0;
        let y = round_trip(GgmlType::Q4_0, &x);
        assert_eq!(&y[..3], &[8.0, -7.0, 2.0]);
    }

    #[test]
    fn q4_1_quantizer_codes() {
        // min -1, max 14: d = 1, codes = trunc(x + 1 + 0.5).
        let x: Vec<f32> = (0..32).map(|i| (i % 16) as f32 - 1.0).collect();
        let q = quantize(GgmlType::Q4_1, &x);
        assert_eq!(&q[..4], &[0x00, 0x3C, 0x00, 0xBC]);
        assert_eq!(dequantize_to_vec(GgmlType::Q4_1, &q, 32), x);
    }

    #[test]
    fn q8_0_rounds_half_away_from_zero() {
        // amax 127 -> d = 1; 2.5 -> 3, -2.5 -> -3.
        let mut x = vec![0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        let q = quantize(GgmlType::Q8_0, &x);
        assert_eq!(&q[..5], &[0x00, 0x3C, 127, 3, (-3i8) as u8]);
    }

    #[test]
    #[should_panic(expected = "cannot hold exactly")]
    fn dequantize_rejects_wrong_length() {
        let mut out = [0.0f32; 32];
        dequantize(GgmlType::Q8_0, &[0u8; 33], &mut out);
    }
}
