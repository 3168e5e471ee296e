//! The CPU reference forward pass, in plain f32 Rust.
//!
//! This is the tests' oracle, not a product path: every weight is dequantized to f32 up front and
//! each token runs the textbook pre-norm transformer, one position at a time:
//!
//! ```text
//! x = token_embd[token] (× √n_embd: Gemma)
//! for each layer:
//!     h = rmsnorm(x) * attn_norm
//!     q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv)      (Phi-3: rows of one Wqkv)
//!     per head: q = rmsnorm(q) * q_norm, k = rmsnorm(k) * k_norm   (Qwen3, Gemma 3)
//!     rope(q), rope(k) (the layer's frequencies); append k, v to the layer's cache
//!     o = Wo · attention(q, k_cache, v_cache)   (scale, soft-cap, sliding window)
//!     x += o                                    (Gemma: x += rmsnorm(o) * post_attention_norm)
//!     h = rmsnorm(x) * ffn_norm
//!     d = Wdown · (act(Wgate h) * (Wup h))      (act: silu, or tanh-GELU for Gemma)
//!     x += d                                    (Gemma: x += rmsnorm(d) * post_ffw_norm)
//! logits = Wout · (rmsnorm(x) * output_norm)     (Wout = token_embd when tied; soft-capped: Gemma 2)
//! ```
//!
//! The building blocks live in [`ops`] so that kernel tests can compare against them one by one.

use crate::gguf::GgufFile;
use crate::gguf::quant::dequantize;

use super::config::{FfnAct, LayerNames, ModelConfig, ModelError, OUTPUT, OUTPUT_NORM, TOKEN_EMBD};

pub use super::config::RopeStyle;

pub mod ops;

/// One layer's weights, dequantized. Matrices are row-major `[out, in]` (GGUF `dims = [in, out]`).
/// Fused matrices (Phi-3) are split into their parts by rows.
struct CpuLayer {
    attn_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    bias: Option<[Vec<f32>; 3]>,
    /// Per-head norms of Q and K.
    qk_norm: Option<[Vec<f32>; 2]>,
    wo: Vec<f32>,
    ffn_norm: Vec<f32>,
    w_gate: Vec<f32>,
    w_up: Vec<f32>,
    w_down: Vec<f32>,
    /// Post-attention and post-FFN norms.
    post_norms: Option<[Vec<f32>; 2]>,
}

/// A whole model with f32 weights, for the reference forward pass.
pub struct CpuModel {
    pub config: ModelConfig,
    token_embd: Vec<f32>,
    output_norm: Vec<f32>,
    /// `None` when the head is tied to `token_embd`.
    output: Option<Vec<f32>>,
    layers: Vec<CpuLayer>,
}

/// A sequence's KV cache (f32, one `max_ctx × kv_dim` buffer per layer and kind).
pub struct CpuState {
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    /// Round stored keys and values to f16 (as a half-precision KV cache does).
    kv_f16: bool,
    max_ctx: usize,
    /// Positions `0..len` hold valid entries.
    len: usize,
}

impl CpuState {
    /// Capacity in positions.
    pub fn max_ctx(&self) -> usize {
        self.max_ctx
    }
    /// Number of positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Dequantize tensor `name` after checking that it holds `n` elements.
fn load(g: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    let t = g.tensor(name).ok_or_else(|| ModelError::MissingTensor {
        name: name.to_string(),
    })?;
    if t.n_elements != n as u64 {
        return Err(ModelError::BadShape {
            name: name.to_string(),
            expected: vec![n as u64],
            found: t.dims.clone(),
        });
    }
    let bytes = g.read_tensor(t)?;
    let mut out = vec![0.0f32; n];
    dequantize(t.ty, &bytes, &mut out);
    Ok(out)
}

impl CpuModel {
    /// Dequantize every weight of `g` (whose config is `cfg`, from [`ModelConfig::from_gguf`]).
    pub fn from_gguf(g: &GgufFile, cfg: &ModelConfig) -> Result<CpuModel, ModelError> {
        let (e, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let token_embd = load(g, TOKEN_EMBD, cfg.vocab_size * e)?;
        let output_norm = load(g, OUTPUT_NORM, e)?;
        let output = if cfg.tied_output {
            None
        } else {
            Some(load(g, OUTPUT, cfg.vocab_size * e)?)
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let n = LayerNames::new(l);
            let bias = if cfg.has_qkv_bias {
                Some([
                    load(g, &n.attn_q_bias, q)?,
                    load(g, &n.attn_k_bias, kv)?,
                    load(g, &n.attn_v_bias, kv)?,
                ])
            } else {
                None
            };
            let hd = cfg.head_dim;
            let qk_norm = if cfg.qk_norm {
                Some([load(g, &n.attn_q_norm, hd)?, load(g, &n.attn_k_norm, hd)?])
            } else {
                None
            };
            let post_norms = if cfg.post_norms {
                Some([
                    load(g, &n.post_attention_norm, e)?,
                    load(g, &n.post_ffw_norm, e)?,
                ])
            } else {
                None
            };
            let (wq, wk, wv) = if cfg.fused_qkv {
                let mut w = load(g, &n.attn_qkv, (q + 2 * kv) * e)?;
                let wv = w.split_off((q + kv) * e);
                let wk = w.split_off(q * e);
                (w, wk, wv)
            } else {
                (
                    load(g, &n.attn_q, q * e)?,
                    load(g, &n.attn_k, kv * e)?,
                    load(g, &n.attn_v, kv * e)?,
                )
            };
            let (w_gate, w_up) = if cfg.fused_gate_up {
                let mut w = load(g, &n.ffn_up, 2 * ff * e)?;
                let up = w.split_off(ff * e);
                (w, up)
            } else {
                (load(g, &n.ffn_gate, ff * e)?, load(g, &n.ffn_up, ff * e)?)
            };
            layers.push(CpuLayer {
                attn_norm: load(g, &n.attn_norm, e)?,
                wq,
                wk,
                wv,
                bias,
                qk_norm,
                wo: load(g, &n.attn_output, e * q)?,
                ffn_norm: load(g, &n.ffn_norm, e)?,
                w_gate,
                w_up,
                w_down: load(g, &n.ffn_down, e * ff)?,
                post_norms,
            });
        }
        Ok(CpuModel {
            config: cfg.clone(),
            token_embd,
            output_norm,
            output,
            layers,
        })
    }

    /// An empty KV cache for up to `max_ctx` positions (which may exceed the trained context).
    ///
    /// Panics if the cache size overflows `usize`.
    pub fn new_state(&self, max_ctx: usize) -> CpuState {
        self.new_state_kv(max_ctx, false)
    }

    /// As [`CpuModel::new_state`]; with `kv_f16` keys and values are rounded to f16 when stored.
    pub fn new_state_kv(&self, max_ctx: usize, kv_f16: bool) -> CpuState {
        let n = max_ctx
            .checked_mul(self.config.kv_dim())
            .expect("KV cache size overflows usize");
        CpuState {
            k_cache: (0..self.config.n_layers).map(|_| vec![0.0; n]).collect(),
            v_cache: (0..self.config.n_layers).map(|_| vec![0.0; n]).collect(),
            kv_f16,
            max_ctx,
            len: 0,
        }
    }

    /// The embedding row of `token` (also the row of the tied output head).
    pub fn embedding(&self, token: u32) -> Result<&[f32], ModelError> {
        let e = self.config.n_embd;
        let t = token as usize;
        if t >= self.config.vocab_size {
            return Err(ModelError::TokenOutOfRange {
                token,
                vocab: self.config.vocab_size,
            });
        }
        Ok(&self.token_embd[t * e..(t + 1) * e])
    }

    /// Run `token` at position `pos` and return the logits over the vocabulary.
    ///
    /// `pos` must be at most the number of positions already in `state` (positions are fed in
    /// order; feeding an earlier position again rewinds the cache to it) and below its capacity.
    pub fn forward(
        &self,
        state: &mut CpuState,
        token: u32,
        pos: usize,
    ) -> Result<Vec<f32>, ModelError> {
        use ops::*;
        let c = &self.config;
        if pos >= state.max_ctx {
            return Err(ModelError::BadPosition {
                pos,
                problem: format!("the KV cache holds {} positions", state.max_ctx),
            });
        }
        if pos > state.len {
            return Err(ModelError::BadPosition {
                pos,
                problem: format!("only {} earlier positions are cached", state.len),
            });
        }
        let cache_len = state.max_ctx * c.kv_dim();
        if state.k_cache.len() != c.n_layers
            || state
                .k_cache
                .iter()
                .chain(&state.v_cache)
                .any(|v| v.len() != cache_len)
        {
            return Err(ModelError::BadPosition {
                pos,
                problem: "the state was made by a model of another shape".to_string(),
            });
        }
        let (e, q_dim, kv_dim, ff) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff);
        let mut x = self.embedding(token)?.to_vec();
        if let Some(s) = c.embd_scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
        let hd = c.head_dim;
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
            scale: c.attn_scale,
            softcap: c.attn_softcap,
        };

        for (l, w) in self.layers.iter().enumerate() {
            // Attention block.
            let h = rmsnorm(&x, &w.attn_norm, c.rms_eps);
            let mut q = matvec(&w.wq, q_dim, e, &h);
            let mut k = matvec(&w.wk, kv_dim, e, &h);
            let mut v = matvec(&w.wv, kv_dim, e, &h);
            if let Some([bq, bk, bv]) = &w.bias {
                add_assign(&mut q, bq);
                add_assign(&mut k, bk);
                add_assign(&mut v, bv);
            }
            if let Some([qn, kn]) = &w.qk_norm {
                for head in q.chunks_exact_mut(hd) {
                    let y = rmsnorm(head, qn, c.rms_eps);
                    head.copy_from_slice(&y);
                }
                for head in k.chunks_exact_mut(hd) {
                    let y = rmsnorm(head, kn, c.rms_eps);
                    head.copy_from_slice(&y);
                }
            }
            let rope = c.rope_of(l);
            let freqs = rope.freqs(c.rope_dim, state.max_ctx);
            let ms = rope.attn_factor;
            rope_freqs_inplace(&mut q, c.n_heads, hd, &freqs, ms, pos, c.rope_style);
            rope_freqs_inplace(&mut k, c.n_kv_heads, hd, &freqs, ms, pos, c.rope_style);
            let row = pos * kv_dim..(pos + 1) * kv_dim;
            if state.kv_f16 {
                let round = |x: &f32| half::f16::from_f32(*x).to_f32();
                k.iter_mut().for_each(|x| *x = round(x));
                v.iter_mut().for_each(|x| *x = round(x));
            }
            state.k_cache[l][row.clone()].copy_from_slice(&k);
            state.v_cache[l][row].copy_from_slice(&v);
            let first = match c.window_of(l) {
                Some(win) => (pos + 1).saturating_sub(win as usize),
                None => 0,
            };
            let att = attention_range(
                &q,
                &state.k_cache[l],
                &state.v_cache[l],
                &shape,
                first,
                pos + 1,
            );
            let mut o = matvec(&w.wo, e, q_dim, &att);
            if let Some([pa, _]) = &w.post_norms {
                o = rmsnorm(&o, pa, c.rms_eps);
            }
            add_assign(&mut x, &o);

            // Feed-forward block.
            let h = rmsnorm(&x, &w.ffn_norm, c.rms_eps);
            let gate = matvec(&w.w_gate, ff, e, &h);
            let up = matvec(&w.w_up, ff, e, &h);
            let act = match c.ffn_act {
                FfnAct::Silu => swiglu(&gate, &up),
                FfnAct::GeluTanh => geglu(&gate, &up),
            };
            let mut d = matvec(&w.w_down, e, ff, &act);
            if let Some([_, pf]) = &w.post_norms {
                d = rmsnorm(&d, pf, c.rms_eps);
            }
            add_assign(&mut x, &d);
        }
        state.len = pos + 1;

        let h = rmsnorm(&x, &self.output_norm, c.rms_eps);
        let head = self.output.as_deref().unwrap_or(&self.token_embd);
        let mut logits = matvec(head, c.vocab_size, e, &h);
        if let Some(cap) = c.final_softcap {
            softcap_inplace(&mut logits, cap);
        }
        Ok(logits)
    }

    /// Feed `prompt` from position 0, then generate `n` tokens greedily (argmax, ties to the
    /// lowest id). Returns only the generated tokens.
    pub fn greedy(&self, prompt: &[u32], n: usize) -> Result<Vec<u32>, ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::BadPosition {
                pos: 0,
                problem: "greedy needs a non-empty prompt".to_string(),
            });
        }
        let mut state = self.new_state(prompt.len() + n);
        let mut logits = Vec::new();
        for (pos, &t) in prompt.iter().enumerate() {
            logits = self.forward(&mut state, t, pos)?;
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let next = argmax(&logits);
            out.push(next);
            if i + 1 < n {
                logits = self.forward(&mut state, next, prompt.len() + i)?;
            }
        }
        Ok(out)
    }
}

fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Index of the largest value (ties and NaNs resolve to the lowest index).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] || (x[best].is_nan() && !v.is_nan()) {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::ops::*;
    use super::*;

    fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
    }

    #[test]
    fn matvec_small() {
        // [[1 2 3], [4 5 6]] · [1, 0, -1] = [-2, -2]
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(matvec(&w, 2, 3, &[1.0, 0.0, -1.0]), vec![-2.0, -2.0]);
        // Long rows exercise the unrolled loop and its remainder.
        let cols = 37;
        let w: Vec<f32> = (0..2 * cols).map(|i| i as f32).collect();
        let x = vec![1.0; cols];
        let s0: f32 = (0..cols).map(|i| i as f32).sum();
        let s1: f32 = (cols..2 * cols).map(|i| i as f32).sum();
        assert_eq!(matvec(&w, 2, cols, &x), vec![s0, s1]);
    }

    #[test]
    fn rmsnorm_of_constant_vector() {
        // mean(x²) = 9, so x/3 * w.
        let y = rmsnorm(&[3.0; 4], &[1.0, 2.0, 0.5, -1.0], 0.0);
        assert!(close(&y, &[1.0, 2.0, 0.5, -1.0], 1e-6), "{y:?}");
        let y = rmsnorm(&[-2.0; 8], &[1.0; 8], 0.0);
        assert!(close(&y, &[-1.0; 8], 1e-6), "{y:?}");
    }

    #[test]
    fn rope_pos0_is_identity() {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut x = orig.clone();
            rope_inplace(&mut x, 2, 8, 8, 0, 10000.0, style);
            assert_eq!(x, orig);
        }
    }

    #[test]
    fn rope_pairs_and_partial() {
        // Pair 0 has frequency 1: at pos 1 it rotates by 1 radian.
        let (s, c) = (1.0f32.sin(), 1.0f32.cos());
        let mut x = vec![1.0, 0.0, 0.0, 0.0, 7.0, 7.0];
        rope_inplace(&mut x, 1, 6, 4, 1, 10000.0, RopeStyle::Normal);
        assert!(close(&x[..2], &[c, s], 1e-6), "{x:?}");
        assert_eq!(&x[4..], &[7.0, 7.0], "dims past rope_dim must not move");
        // Neox pairs dim 0 with dim rope_dim/2.
        let mut x = vec![1.0, 0.0, 0.0, 0.0, 7.0, 7.0];
        rope_inplace(&mut x, 1, 6, 4, 1, 10000.0, RopeStyle::Neox);
        assert!(close(&x[..4], &[c, 0.0, s, 0.0], 1e-6), "{x:?}");
        // Pair 1 of rope_dim 4 has frequency base^(-1/2) = 0.01.
        let mut x = vec![0.0, 0.0, 1.0, 0.0];
        rope_inplace(&mut x, 1, 4, 4, 100, 10000.0, RopeStyle::Normal);
        assert!(close(&x, &[0.0, 0.0, c, s], 1e-5), "{x:?}");
        // A rotation keeps each pair's norm.
        let mut x: Vec<f32> = (0..24).map(|i| (i as f32).sin()).collect();
        let n0: f32 = x.iter().map(|v| v * v).sum();
        rope_inplace(&mut x, 3, 8, 8, 1234, 10000.0, RopeStyle::Neox);
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
    }

    #[test]
    fn attention_single_position_returns_v() {
        // 4 query heads over 2 kv heads of size 2, one cached position.
        let q = [1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 9.0, 9.0];
        let k = [0.3, -0.2, 1.0, 1.0];
        let v = [10.0, 20.0, 30.0, 40.0];
        let out = attention(&q, &k, &v, 4, 2, 2, 1);
        assert_eq!(out, vec![10.0, 20.0, 10.0, 20.0, 30.0, 40.0, 30.0, 40.0]);
    }

    #[test]
    fn attention_two_positions_hand_computed() {
        // One head of size 4: scores = q·k / 2.
        let q = [1.0, 1.0, 0.0, 0.0];
        let k = [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]; // scores 0 and 1
        let v = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        let p1 = 1.0f32.exp() / (1.0 + 1.0f32.exp());
        let out = attention(&q, &k, &v, 1, 1, 4, 2);
        assert!(close(&out, &[1.0 - p1, p1, 0.0, 0.0], 1e-6), "{out:?}");
        // Only the first n_kv rows count.
        let out = attention(&q, &k, &v, 1, 1, 4, 1);
        assert_eq!(out, vec![1.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn swiglu_and_softmax() {
        let y = swiglu(&[0.0, 1.0, -1.0], &[5.0, 2.0, 2.0]);
        let s = |g: f32| g / (1.0 + (-g).exp());
        assert!(close(&y, &[0.0, 2.0 * s(1.0), 2.0 * s(-1.0)], 1e-6));
        let mut x = [1.0, 2.0, 3.0];
        softmax_inplace(&mut x);
        let z = 1.0f32.exp() + 2.0f32.exp() + 3.0f32.exp();
        assert!(close(
            &x,
            &[1.0f32.exp() / z, 2.0f32.exp() / z, 3.0f32.exp() / z],
            1e-6
        ));
        let mut big = [1000.0, 1000.0];
        softmax_inplace(&mut big);
        assert_eq!(big, [0.5, 0.5]);
    }

    #[test]
    fn argmax_ties_and_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 0.5]), 1);
        assert_eq!(argmax(&[0.0, f32::NAN, 2.0]), 2);
    }
}
