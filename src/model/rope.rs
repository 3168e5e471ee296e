//! Rotary position embedding frequencies, as llama.cpp computes them.
//!
//! Pair `i` of a head (for `i < rope_dim / 2`) rotates by `pos · θ_i` with
//!
//! ```text
//! θ_i = freq_scale · base^(-2i / rope_dim) / factor_i
//! ```
//!
//! where `freq_scale` is `1 / rope.scaling.factor` (linear scaling) and `factor_i` the per-pair
//! divisors of a `rope_freqs` tensor (Llama 3.x files), of Llama 3 scaling given in metadata, or
//! of Phi-3's LongRoPE factors (the long set when the context exceeds the original one). The
//! rotated pair is multiplied by `attn_factor` (`rope.scaling.attn_factor`, 1 by default). The
//! host computes the table of (cos, sin) from these frequencies; the GPU kernel and the CPU
//! reference only rotate.

/// Per-pair frequency divisors.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeFactors {
    None,
    /// The same divisors for every context (a `rope_freqs` tensor, or Llama 3 scaling).
    Fixed(Vec<f32>),
    /// Phi-3 LongRoPE: `long` when the context exceeds `orig_ctx` tokens, else `short`.
    LongShort {
        long: Vec<f32>,
        short: Vec<f32>,
        orig_ctx: usize,
    },
}

/// Everything that sets the rotation angles of one kind of layer.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub base: f32,
    /// `1 / factor` of linear scaling (1: none).
    pub freq_scale: f32,
    /// Magnitude applied to cos and sin (1: none).
    pub attn_factor: f32,
    pub factors: RopeFactors,
}

impl RopeConfig {
    /// Plain rotary embedding with `base`.
    pub fn plain(base: f32) -> Self {
        Self {
            base,
            freq_scale: 1.0,
            attn_factor: 1.0,
            factors: RopeFactors::None,
        }
    }

    /// The divisors in use for a context of `n_ctx` tokens.
    pub fn factors_for(&self, n_ctx: usize) -> Option<&[f32]> {
        match &self.factors {
            RopeFactors::None => None,
            RopeFactors::Fixed(f) => Some(f),
            RopeFactors::LongShort {
                long,
                short,
                orig_ctx,
            } => Some(if n_ctx > *orig_ctx { long } else { short }),
        }
    }

    /// `θ_i` for each pair `i < rope_dim / 2` (radians per position), for a context of `n_ctx`.
    pub fn freqs(&self, rope_dim: usize, n_ctx: usize) -> Vec<f64> {
        let ff = self.factors_for(n_ctx);
        (0..rope_dim / 2)
            .map(|i| {
                let f = (self.base as f64).powf(-((2 * i) as f64) / rope_dim as f64)
                    * self.freq_scale as f64;
                match ff.and_then(|v| v.get(i)) {
                    Some(&d) => f / d as f64,
                    None => f,
                }
            })
            .collect()
    }

    /// A short description for `flashlm info`.
    pub fn describe(&self) -> String {
        let mut s = format!("base {}", self.base);
        if self.freq_scale != 1.0 {
            s += &format!(", linear scale 1/{}", 1.0 / self.freq_scale);
        }
        match &self.factors {
            RopeFactors::None => {}
            RopeFactors::Fixed(_) => s += ", per-pair frequency factors",
            RopeFactors::LongShort { orig_ctx, .. } => {
                s += &format!(", LongRoPE factors (long above {orig_ctx} tokens)")
            }
        }
        if self.attn_factor != 1.0 {
            s += &format!(", magnitude {}", self.attn_factor);
        }
        s
    }
}

/// Llama 3 scaling as per-pair divisors, the way llama.cpp's converter writes `rope_freqs`:
/// high-frequency pairs (wavelength below `orig_ctx / high`) keep their frequency, low-frequency
/// pairs (wavelength above `orig_ctx / low`) are divided by `factor`, and the pairs between blend
/// the two smoothly.
pub fn llama3_factors(
    base: f32,
    rope_dim: usize,
    factor: f32,
    low: f32,
    high: f32,
    orig_ctx: usize,
) -> Vec<f32> {
    let (factor, low, high, old) = (factor as f64, low as f64, high as f64, orig_ctx as f64);
    let low_wavelen = old / low;
    let high_wavelen = old / high;
    (0..rope_dim / 2)
        .map(|i| {
            // The converter computes the base frequencies in f32.
            let freq = (1.0 / (base as f64).powf((2 * i) as f64 / rope_dim as f64)) as f32 as f64;
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let d = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            d as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_frequencies() {
        let r = RopeConfig::plain(10000.0);
        let f = r.freqs(8, 100);
        assert_eq!(f.len(), 4);
        assert!((f[0] - 1.0).abs() < 1e-12);
        assert!((f[2] - 0.01).abs() < 1e-12);
    }

    #[test]
    fn scale_and_factors_divide() {
        let mut r = RopeConfig::plain(10000.0);
        r.freq_scale = 0.25;
        r.factors = RopeFactors::Fixed(vec![1.0, 2.0]);
        let f = r.freqs(4, 10);
        assert!((f[0] - 0.25).abs() < 1e-12);
        assert!((f[1] - 0.01 * 0.25 / 2.0).abs() < 1e-12);
        r.factors = RopeFactors::LongShort {
            long: vec![4.0, 4.0],
            short: vec![1.0, 1.0],
            orig_ctx: 64,
        };
        assert!((r.freqs(4, 64)[0] - 0.25).abs() < 1e-12);
        assert!((r.freqs(4, 65)[0] - 0.0625).abs() < 1e-12);
    }

    #[test]
    fn llama3_factor_bands() {
        // Base 500000, head 128: the published Llama 3.1 setting.
        let f = llama3_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192);
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0, "the highest frequency is kept");
        assert_eq!(f[63], 8.0, "the lowest frequency is divided by the factor");
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
        assert!(
            f.iter().any(|&x| x > 1.0 && x < 8.0),
            "a smooth band exists"
        );
    }
}
