//! Drawing, quantizing and writing the synthetic weights, a block of rows at a time.
//!
//! Row `r` of tensor `t` is drawn from its own SplitMix64, seeded from the model seed, `t` and
//! `r`, so blocks can be computed on several threads in any grouping and the file stays the
//! same. Normal values come from Marsaglia's polar method (bounded by about 8.3 standard
//! deviations, as 24-bit uniforms cannot get closer to the centre).

use std::io::Write;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::gguf::GgmlType;
use crate::gguf::quant::quantize;
use crate::gguf::writer::{GgufStreamWriter, LaidOutTensor};
use crate::sampling::SplitMix64;

use super::SynthError;

/// Values drawn per block of rows (at least one row): 1 MiB of f32 per thread.
const BLOCK_VALUES: usize = 1 << 18;

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy)]
pub(super) enum Init {
    Normal { mean: f32, std: f32 },
}

/// The generator of one row.
fn row_rng(seed: u64, tensor: usize, row: u64) -> SplitMix64 {
    let mut a = SplitMix64(seed);
    let mut b = SplitMix64(a.next_u64() ^ ((tensor as u64) << 40) ^ row);
    SplitMix64(b.next_u64())
}

/// Two independent standard normal values.
fn normal_pair(rng: &mut SplitMix64) -> (f32, f32) {
    const UNIT: f32 = 2.0 / (1u32 << 24) as f32;
    loop {
        let r = rng.next_u64();
        let u = (r >> 40) as f32 * UNIT - 1.0;
        let v = ((r >> 16) & 0xFF_FFFF) as f32 * UNIT - 1.0;
        let s = u * u + v * v;
        if s > 0.0 && s < 1.0 {
            let m = (-2.0 * s.ln() / s).sqrt();
            return (u * m, v * m);
        }
    }
}

fn fill(init: Init, rng: &mut SplitMix64, out: &mut [f32]) {
    let Init::Normal { mean, std } = init;
    for pair in out.chunks_mut(2) {
        let (a, b) = normal_pair(rng);
        pair[0] = mean + std * a;
        if let Some(x) = pair.get_mut(1) {
            *x = mean + std * b;
        }
    }
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "the quantizer failed".to_string()
    }
}

/// `quantize`, with a panic or a wrong output size turned into an error.
fn quantize_checked(ty: GgmlType, values: &[f32]) -> Result<Vec<u8>, SynthError> {
    let err = |reason: String| SynthError::Quantize {
        ty: ty.name(),
        reason,
    };
    let out = catch_unwind(AssertUnwindSafe(|| quantize(ty, values)))
        .map_err(|p| err(format!("the quantizer is not available: {}", panic_text(p))))?;
    let want = ty.bytes_for(values.len() as u64);
    if want != Some(out.len() as u64) {
        return Err(err(format!(
            "the quantizer gave {} bytes for {} values, expected {want:?}",
            out.len(),
            values.len()
        )));
    }
    Ok(out)
}

/// Fail early, before any file is created, when `ty` has no quantizer.
pub(super) fn check_quantizer(ty: GgmlType) -> Result<(), SynthError> {
    let n = usize::try_from(ty.block_len())
        .unwrap_or(usize::MAX)
        .min(1 << 16);
    let probe: Vec<f32> = (0..2 * n).map(|i| (i % 7) as f32 - 3.0).collect();
    quantize_checked(ty, &probe).map(|_| ())
}

/// Rows `rows` of tensor `index` (rows of `cols` values), quantized.
fn block_bytes(
    t: &LaidOutTensor,
    index: usize,
    init: Init,
    seed: u64,
    rows: Range<u64>,
) -> Result<Vec<u8>, SynthError> {
    let cols = usize::try_from(t.entry.dims[0]).map_err(|_| too_big(t))?;
    let n_rows = usize::try_from(rows.end - rows.start).map_err(|_| too_big(t))?;
    let n = cols.checked_mul(n_rows).ok_or_else(|| too_big(t))?;
    let mut values = vec![0f32; n];
    for (r, row) in rows.zip(values.chunks_mut(cols)) {
        fill(init, &mut row_rng(seed, index, r), row);
    }
    quantize_checked(t.entry.ty, &values)
}

fn too_big(t: &LaidOutTensor) -> SynthError {
    SynthError::InvalidSpec(format!(
        "tensor {} {:?}: a row does not fit in memory",
        t.entry.name, t.entry.dims
    ))
}

/// Draw, quantize and write every tensor, `threads` blocks of rows at a time; `progress` gets
/// the bytes written so far after each block.
pub(super) fn write_tensors<W: Write>(
    tensors: &[LaidOutTensor],
    inits: &[Init],
    seed: u64,
    threads: usize,
    w: &mut GgufStreamWriter<'_, W>,
    progress: &mut dyn FnMut(u64),
) -> Result<(), SynthError> {
    let threads = threads.max(1) as u64;
    for (index, (t, &init)) in tensors.iter().zip(inits).enumerate() {
        let cols = t.entry.dims[0];
        let rows: u64 = t.entry.dims[1..].iter().product();
        let per_block = (BLOCK_VALUES as u64 / cols).max(1);
        let n_blocks = rows.div_ceil(per_block);
        let block_rows = |k: u64| k * per_block..((k + 1) * per_block).min(rows);
        let mut k = 0;
        while k < n_blocks {
            let wave = k..(k + threads).min(n_blocks);
            let results: Vec<Result<Vec<u8>, SynthError>> = if wave.end - wave.start == 1 {
                vec![block_bytes(t, index, init, seed, block_rows(k))]
            } else {
                std::thread::scope(|s| {
                    let handles: Vec<_> = wave
                        .clone()
                        .map(|j| s.spawn(move || block_bytes(t, index, init, seed, block_rows(j))))
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| {
                            h.join().unwrap_or_else(|p| {
                                Err(SynthError::Quantize {
                                    ty: t.entry.ty.name(),
                                    reason: panic_text(p),
                                })
                            })
                        })
                        .collect()
                })
            };
            for bytes in results {
                w.write(&bytes?)?;
                progress(w.position());
            }
            k = wave.end;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_have_the_asked_moments() {
        let mut v = vec![0f32; 200_001];
        fill(
            Init::Normal {
                mean: 1.0,
                std: 0.5,
            },
            &mut row_rng(7, 3, 11),
            &mut v,
        );
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        // Standard errors: 0.5 / sqrt(n) ≈ 0.0011 for the mean, ≈ 0.0008 for the variance.
        assert!((mean - 1.0).abs() < 0.006, "mean {mean}");
        assert!((var - 0.25).abs() < 0.005, "variance {var}");
        // Normal tails: about 4.6% beyond 2 std, 0.27% beyond 3.
        let beyond = |k: f64| {
            v.iter()
                .filter(|&&x| (f64::from(x) - 1.0).abs() > k * 0.5)
                .count()
        };
        let p2 = beyond(2.0) as f64 / n;
        let p3 = beyond(3.0) as f64 / n;
        assert!((p2 - 0.0455).abs() < 0.003, "P(|z| > 2) = {p2}");
        assert!((p3 - 0.0027).abs() < 0.0007, "P(|z| > 3) = {p3}");
    }

    #[test]
    fn rows_differ_and_repeat() {
        let row = |seed, t, r| {
            let mut v = vec![0f32; 64];
            fill(
                Init::Normal {
                    mean: 0.0,
                    std: 1.0,
                },
                &mut row_rng(seed, t, r),
                &mut v,
            );
            v
        };
        assert_eq!(row(1, 2, 3), row(1, 2, 3));
        assert_ne!(row(1, 2, 3), row(1, 2, 4));
        assert_ne!(row(1, 2, 3), row(1, 3, 3));
        assert_ne!(row(1, 2, 3), row(2, 2, 3));
    }

    #[test]
    fn quantizer_probe_accepts_every_type() {
        for ty in GgmlType::ALL {
            check_quantizer(ty).unwrap();
        }
    }
}
