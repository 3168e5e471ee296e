//! Round-trip error bounds and hand-built blocks for the `q5`, `kquant` and `iquant` formats.
//! (Their dequantizers are also checked bit for bit against gguf-py in `tests/quant_oracle.rs`.)

use super::*;

/// xorshift64* values in [-1, 1).
fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|i| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u =
                (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            // The magnitude changes every 16 weights, and a few sub-blocks are one-signed, so
            // sub-block scales and mins differ within a super-block.
            let scale = [1.0, 0.01, 30.0, 1e-3, 0.3, 5.0][(i / 16) % 6];
            if (i / 16) % 7 == 3 {
                u.abs() * scale
            } else {
                u * scale
            }
        })
        .collect()
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let q = quantize(ty, x);
    assert_eq!(
        q.len() as u64,
        ty.bytes_for(x.len() as u64).unwrap(),
        "{ty}"
    );
    dequantize_to_vec(ty, &q, x.len())
}

fn signed_max(g: &[f32]) -> f32 {
    g.iter()
        .copied()
        .fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m })
}

fn check(ty: GgmlType, x: &[f32], y: &[f32], group: usize, bound: impl Fn(usize, usize) -> f32) {
    for (gi, (xg, yg)) in x.chunks(group).zip(y.chunks(group)).enumerate() {
        for (k, (a, b)) in xg.iter().zip(yg).enumerate() {
            let e = bound(gi, k);
            assert!((a - b).abs() <= e, "{ty} group {gi}: {a} -> {b}, bound {e}");
        }
    }
}

#[test]
fn q5_error_bounds() {
    let x = random(1, 32 * 40);
    let y = round_trip(GgmlType::Q5_0, &x);
    check(GgmlType::Q5_0, &x, &y, 32, |g, _| {
        let xb = &x[g * 32..][..32];
        let d = xb.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 16.0;
        // Half a step, a whole one at the clipped end (code 32 -> 31), and f16 rounding of d.
        d * 1.001 + 16.0 * d / 1024.0
    });
    let y = round_trip(GgmlType::Q5_1, &x);
    check(GgmlType::Q5_1, &x, &y, 32, |g, _| {
        let xb = &x[g * 32..][..32];
        let min = xb.iter().copied().fold(f32::MAX, f32::min);
        let max = xb.iter().copied().fold(f32::MIN, f32::max);
        let d = (max - min) / 31.0;
        d * 0.501 + 31.0 * d / 1024.0 + min.abs() / 1024.0
    });
}

/// Asymmetric K-quants: half of a step that is at most one scale unit above the sub-block's
/// own need, `(range + dmin) / qmax + d`, plus slack for f16 rounding of `d` and `dmin`.
fn asym_bound(x: &[f32], group: usize, qmax: f32, lmax: f32) -> Vec<f32> {
    let mut out = Vec::new();
    for sb in x.chunks(256) {
        let groups: Vec<(f32, f32)> = sb
            .chunks(group)
            .map(|g| {
                let mn = g.iter().copied().fold(0.0f32, f32::min);
                let mx = g.iter().copied().fold(f32::MIN, f32::max);
                (mn, mx)
            })
            .collect();
        let dmin = groups.iter().fold(0.0f32, |a, g| a.max(-g.0)) / lmax;
        let steps: Vec<f32> = groups
            .iter()
            .map(|&(mn, mx)| ((mx - mn).max(0.0) + dmin) / qmax)
            .collect();
        let d = steps.iter().copied().fold(0.0, f32::max) / lmax;
        for s in steps {
            out.push((s + d) * 0.5 * 1.01 + (lmax * (d + dmin)) / 512.0);
        }
    }
    out
}

/// Symmetric K-quants and IQ4_XS: `qerr` steps of `|max| / qneg + d`.
fn sym_bound(x: &[f32], group: usize, qneg: f32, lmax: f32, qerr: f32) -> Vec<f32> {
    let mut out = Vec::new();
    for sb in x.chunks(256) {
        let steps: Vec<f32> = sb
            .chunks(group)
            .map(|g| signed_max(g).abs() / qneg)
            .collect();
        let d = steps.iter().copied().fold(0.0, f32::max) / lmax;
        for s in steps {
            out.push((s + d) * qerr * 1.01 + lmax * d / 512.0);
        }
    }
    out
}

#[test]
fn k_quant_error_bounds() {
    let x = random(2, 256 * 12);
    for (ty, group, qmax, lmax) in [
        (GgmlType::Q2_K, 16, 3.0, 15.0),
        (GgmlType::Q4_K, 32, 15.0, 63.0),
        (GgmlType::Q5_K, 32, 31.0, 63.0),
    ] {
        let y = round_trip(ty, &x);
        let b = asym_bound(&x, group, qmax, lmax);
        check(ty, &x, &y, group, |g, _| b[g]);
    }
    for (ty, group, qneg, lmax, qerr) in [
        (GgmlType::Q3_K, 16, 4.0, 31.0, 1.0),
        (GgmlType::Q6_K, 16, 32.0, 127.0, 1.0),
        // The table's widest gap is 24 and its top (113) is 14 short of -(-127).
        (GgmlType::IQ4_XS, 32, 127.0, 31.0, 14.0),
    ] {
        let y = round_trip(ty, &x);
        let b = sym_bound(&x, group, qneg, lmax, qerr);
        check(ty, &x, &y, group, |g, _| b[g]);
    }
    let y = round_trip(GgmlType::IQ4_NL, &x);
    check(GgmlType::IQ4_NL, &x, &y, 32, |g, _| {
        signed_max(&x[g * 32..][..32]).abs() / 127.0 * 14.0 * 1.002
    });
}

#[test]
fn quantizers_are_not_trivial() {
    // The bounds above would also pass for a quantizer that kept only the largest values;
    // the mean error must be a small fraction of a step: Q6_K and Q5_K well below Q2_K.
    let x = random(3, 256 * 8);
    let rms = |ty| {
        let y = round_trip(ty, &x);
        let e: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
        let s: f32 = x.iter().map(|a| a * a).sum();
        (e / s).sqrt()
    };
    let (q2, q3, q4, q5, q6) = (
        rms(GgmlType::Q2_K),
        rms(GgmlType::Q3_K),
        rms(GgmlType::Q4_K),
        rms(GgmlType::Q5_K),
        rms(GgmlType::Q6_K),
    );
    assert!(
        q6 < q5 && q5 < q4 && q4 < q3 && q3 < q2,
        "{q2} {q3} {q4} {q5} {q6}"
    );
    assert!(q6 < 0.02 && q4 < 0.1 && q2 < 0.4, "{q2} {q4} {q6}");
    assert!(rms(GgmlType::IQ4_XS) < 0.1 && rms(GgmlType::IQ4_NL) < 0.1);
}

#[test]
fn q6_k_known_block() {
    // d = 0.5; scale of sub-block g is g + 1 (signed bytes); codes: weight e has code
    // (e % 64) - 32, written through the ql/qh layout by hand.
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for e in 0..256 {
        let u = (e % 64) as u8;
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        ql[64 * h + 32 * (s % 2) + l] |= (u & 15) << (4 * (s / 2));
        qh[32 * h + l] |= (u >> 4) << (2 * s);
    }
    let mut b = ql.to_vec();
    b.extend_from_slice(&qh);
    b.extend(1..=16u8);
    b.extend_from_slice(&[0x00, 0x38]);
    let y = dequantize_to_vec(GgmlType::Q6_K, &b, 256);
    for (e, v) in y.iter().enumerate() {
        assert_eq!(
            *v,
            0.5 * (e / 16 + 1) as f32 * ((e % 64) as f32 - 32.0),
            "weight {e}"
        );
    }
}

#[test]
fn q4_k_known_block() {
    // d = 1, dmin = 0.5; sub-block j: scale j + 1, min 2j + 40 (above 15: both layouts of the
    // 12 scale bytes are used); codes e % 16.
    let sc: Vec<u8> = (0..8).map(|j| j + 1).collect();
    let mn: Vec<u8> = (0..8).map(|j| 2 * j + 40).collect();
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4);
    }
    let mut b = vec![0x00, 0x3C, 0x00, 0x38];
    b.extend_from_slice(&s);
    let mut qs = [0u8; 128];
    for e in 0..256 {
        let (j, l) = (e / 32, e % 32);
        qs[32 * (j / 2) + l] |= ((e % 16) as u8) << (4 * (j % 2));
    }
    b.extend_from_slice(&qs);
    let y = dequantize_to_vec(GgmlType::Q4_K, &b, 256);
    for (e, v) in y.iter().enumerate() {
        let j = e / 32;
        let want = f32::from(sc[j]) * (e % 16) as f32 - 0.5 * f32::from(mn[j]);
        assert_eq!(*v, want, "weight {e}");
    }
}

#[test]
fn iq4_nl_known_block() {
    // d = 2; byte j: code j (weight j) and 15 - j (weight j + 16).
    let mut b = vec![0x00, 0x40];
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let y = dequantize_to_vec(GgmlType::IQ4_NL, &b, 32);
    for j in 0..16 {
        assert_eq!(y[j], 2.0 * f32::from(IQ4_TABLE[j]));
        assert_eq!(y[j + 16], 2.0 * f32::from(IQ4_TABLE[15 - j]));
    }
}

#[test]
fn super_block_sizes() {
    for (ty, bytes) in [
        (GgmlType::Q2_K, 84),
        (GgmlType::Q3_K, 110),
        (GgmlType::Q4_K, 144),
        (GgmlType::Q5_K, 176),
        (GgmlType::Q6_K, 210),
        (GgmlType::IQ4_XS, 136),
    ] {
        assert_eq!(ty.bytes_for(512), Some(2 * bytes), "{ty}");
        assert_eq!(ty.bytes_for(32), None, "{ty}");
    }
    assert_eq!(GgmlType::Q5_0.bytes_for(64), Some(44));
    assert_eq!(GgmlType::Q5_1.bytes_for(64), Some(48));
    assert_eq!(GgmlType::IQ4_NL.bytes_for(64), Some(36));
}
