//! The forward pass's building blocks, on plain slices.

use super::RopeStyle;

/// `y = W x` for a row-major `rows × cols` matrix `w`: `y[r] = Σ_c w[r*cols + c] · x[c]`.
///
/// Panics if `w.len() != rows * cols` or `x.len() != cols`.
pub fn matvec(w: &[f32], rows: usize, cols: usize, x: &[f32]) -> Vec<f32> {
    assert_eq!(w.len(), rows * cols, "matvec: matrix size");
    assert_eq!(x.len(), cols, "matvec: vector size");
    if cols == 0 {
        return vec![0.0; rows];
    }
    w.chunks_exact(cols).map(|row| dot(row, x)).collect()
}

/// Dot product with eight independent accumulators (keeps the loop fast without SIMD code).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (a8, ra) = a.as_chunks::<8>();
    let (b8, rb) = b.as_chunks::<8>();
    for (x, y) in a8.iter().zip(b8) {
        acc[0] += x[0] * y[0];
        acc[1] += x[1] * y[1];
        acc[2] += x[2] * y[2];
        acc[3] += x[3] * y[3];
        acc[4] += x[4] * y[4];
        acc[5] += x[5] * y[5];
        acc[6] += x[6] * y[6];
        acc[7] += x[7] * y[7];
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `x / sqrt(mean(x²) + eps) * w` (the mean is accumulated in f64).
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    assert_eq!(x.len(), w.len(), "rmsnorm: weight size");
    if x.is_empty() {
        return Vec::new();
    }
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    let scale = (1.0 / (ss + eps as f64).sqrt()) as f32;
    x.iter().zip(w).map(|(&v, &w)| v * scale * w).collect()
}

/// Rotary position embedding, in place, on `n_heads` consecutive heads of `head_dim`.
///
/// Pair `i` (for `i < rope_dim/2`) rotates by angle `pos · base^(-2i/rope_dim)`; the pair is
/// `(2i, 2i+1)` for [`RopeStyle::Normal`] and `(i, i + rope_dim/2)` for [`RopeStyle::Neox`].
/// Dimensions from `rope_dim` to `head_dim` are left alone.
pub fn rope_inplace(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    rope_dim: usize,
    pos: usize,
    base: f32,
    style: RopeStyle,
) {
    assert!(
        rope_dim <= head_dim && rope_dim.is_multiple_of(2),
        "rope: rope_dim must be even and <= head_dim"
    );
    let freqs: Vec<f64> = (0..rope_dim / 2)
        .map(|i| (base as f64).powf(-2.0 * i as f64 / rope_dim as f64))
        .collect();
    rope_freqs_inplace(x, n_heads, head_dim, &freqs, 1.0, pos, style);
}

/// Rotary position embedding with explicit per-pair frequencies (radians per position; their
/// count is `rope_dim / 2`), the rotated pair scaled by `mscale`.
pub fn rope_freqs_inplace(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    freqs: &[f64],
    mscale: f32,
    pos: usize,
    style: RopeStyle,
) {
    assert_eq!(x.len(), n_heads * head_dim, "rope: vector size");
    let half = freqs.len();
    assert!(2 * half <= head_dim, "rope: rope_dim must be <= head_dim");
    for (i, &freq) in freqs.iter().enumerate() {
        let theta = pos as f64 * freq;
        let (sin, cos) = (theta.sin() as f32 * mscale, theta.cos() as f32 * mscale);
        let (a, b) = match style {
            RopeStyle::Normal => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        for head in x.chunks_exact_mut(head_dim) {
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}

/// Causal attention of one query over `n_kv` cached positions.
///
/// `q` holds `n_heads` heads of `head_dim`; each cache holds `n_kv` rows of
/// `n_kv_heads * head_dim`. Query head `h` reads kv head `h / (n_heads / n_kv_heads)`.
/// Scores are scaled by `1/sqrt(head_dim)` and softmaxed over the positions.
pub fn attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    n_kv: usize,
) -> Vec<f32> {
    let shape = AttnShape {
        n_heads,
        n_kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        softcap: None,
    };
    attention_range(q, k_cache, v_cache, &shape, 0, n_kv)
}

/// Heads and score transform of [`attention_range`].
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Scores are `q·k × scale`...
    pub scale: f32,
    /// ...then `cap · tanh(score / cap)` when a cap is given.
    pub softcap: Option<f32>,
}

/// Attention of one query over the cached positions `[first, n_kv)` (a sliding window starts
/// past 0).
pub fn attention_range(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    s: &AttnShape,
    first: usize,
    n_kv: usize,
) -> Vec<f32> {
    let (n_heads, n_kv_heads, head_dim) = (s.n_heads, s.n_kv_heads, s.head_dim);
    assert!(
        n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
        "attention: n_kv_heads must divide n_heads"
    );
    assert!(first < n_kv, "attention: empty key range");
    let kv_dim = n_kv_heads * head_dim;
    assert_eq!(q.len(), n_heads * head_dim, "attention: query size");
    assert!(
        k_cache.len() >= n_kv * kv_dim && v_cache.len() >= n_kv * kv_dim,
        "attention: cache smaller than n_kv rows"
    );
    let group = n_heads / n_kv_heads;
    let mut out = vec![0.0f32; n_heads * head_dim];
    let mut scores = vec![0.0f32; n_kv - first];
    for h in 0..n_heads {
        let kvh = h / group;
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        for (j, sc) in scores.iter_mut().enumerate() {
            let off = (first + j) * kv_dim + kvh * head_dim;
            let mut v = dot(qh, &k_cache[off..off + head_dim]) * s.scale;
            if let Some(cap) = s.softcap {
                v = cap * (v / cap).tanh();
            }
            *sc = v;
        }
        softmax_inplace(&mut scores);
        let oh = &mut out[h * head_dim..(h + 1) * head_dim];
        for (j, &p) in scores.iter().enumerate() {
            let off = (first + j) * kv_dim + kvh * head_dim;
            for (o, &v) in oh.iter_mut().zip(&v_cache[off..off + head_dim]) {
                *o += p * v;
            }
        }
    }
    out
}

/// `silu(gate) * up`, elementwise, with `silu(g) = g / (1 + e^-g)`.
pub fn swiglu(gate: &[f32], up: &[f32]) -> Vec<f32> {
    assert_eq!(gate.len(), up.len(), "swiglu: sizes differ");
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
        .collect()
}

/// `gelu(gate) * up`, elementwise, with the tanh approximation of GELU
/// `0.5 g (1 + tanh(√(2/π) (g + 0.044715 g³)))`.
pub fn geglu(gate: &[f32], up: &[f32]) -> Vec<f32> {
    assert_eq!(gate.len(), up.len(), "geglu: sizes differ");
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| gelu_tanh(g) * u)
        .collect()
}

/// GELU, tanh approximation.
pub fn gelu_tanh(g: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * g * (1.0 + (SQRT_2_OVER_PI * g * (1.0 + 0.044715 * g * g)).tanh())
}

/// `cap · tanh(x / cap)` in place (soft-capping).
pub fn softcap_inplace(x: &mut [f32], cap: f32) {
    x.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
}

/// Numerically stable softmax, in place (max subtracted first).
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        // All -inf (or empty): nothing sensible to normalise; spread uniformly.
        let n = x.len() as f32;
        x.iter_mut().for_each(|v| *v = 1.0 / n);
        return;
    }
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}
