//! Tiny llama models with seeded random weights, built in memory as GGUF files.
//!
//! They let tests run the whole pipeline (config, tokenizer, CPU reference, GPU kernels) for any
//! weight type and odd sizes without the real model. Weights are drawn so that activations stay
//! in a sane range: matrices ~ N(0, 1/cols) (unit-variance outputs for unit-variance inputs),
//! norm weights ~ 1 + N(0, 0.1²), so logits come out with a standard deviation around 1.
//!
//! The tokenizer metadata is a minimal byte-level BPE ("gpt2"): the 256 byte tokens, a handful of
//! merges, three control tokens and `[PAD{i}]` fillers up to the vocabulary size.

use crate::gguf::quant::quantize;
use crate::gguf::writer::GgufWriter;
use crate::gguf::{GgmlType, MetaValue};
use crate::sampling::SplitMix64;

use super::config::{LayerNames, OUTPUT, OUTPUT_NORM, TOKEN_EMBD};

/// Shape and weight type of a synthetic llama model.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticSpec {
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub n_ff: usize,
    /// At least [`SYNTHETIC_MIN_VOCAB`].
    pub vocab: usize,
    /// Type of every matrix (embedding and output head included); norms are always F32.
    pub weight_type: GgmlType,
    /// `llama.context_length`.
    pub ctx: usize,
    /// Write a separate `output.weight` instead of tying the head to `token_embd.weight`.
    pub untied_output: bool,
}

impl SyntheticSpec {
    /// A small model (2 layers, n_embd 64, 4 heads over 2 kv heads, n_ff 128, vocab 320).
    pub fn tiny(weight_type: GgmlType) -> Self {
        SyntheticSpec {
            n_layers: 2,
            n_embd: 64,
            n_heads: 4,
            n_kv_heads: 2,
            n_ff: 128,
            vocab: 320,
            weight_type,
            ctx: 256,
            untied_output: false,
        }
    }
}

/// Merges of the synthetic tokenizer, in rank order (GPT-2 byte-level spelling, `Ġ` = space).
pub const SYNTHETIC_MERGES: &[&str] = &["Ġ t", "h e", "i n", "Ġt he", "e r", "Ġ a", "o n", "Ġ s"];
/// Control tokens, placed right after the merged tokens.
pub const SYNTHETIC_SPECIALS: &[&str] = &["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// Smallest vocabulary that holds the byte tokens, merges and control tokens.
pub const SYNTHETIC_MIN_VOCAB: usize = 256 + SYNTHETIC_MERGES.len() + SYNTHETIC_SPECIALS.len();

/// A ChatML template, as SmolLM2-style models carry.
const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Token types as GGUF stores them.
const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_UNUSED: i32 = 5;

/// The GPT-2 byte-to-character map: printable bytes stand for themselves, the others map to
/// code points from U+0100 upward, in byte order.
fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in out.iter_mut().enumerate() {
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        let cp = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(cp).unwrap_or('?');
    }
    out
}

/// Seeded generator (the sampler's SplitMix64) with a Box-Muller normal.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(SplitMix64(seed))
    }
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f32 {
        let (u1, u2) = (self.uniform(), self.uniform());
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
}

fn strings(v: &[String]) -> MetaValue {
    MetaValue::Array(v.iter().cloned().map(MetaValue::String).collect())
}

/// Build a llama GGUF file for `spec` with weights drawn from `seed`.
///
/// Panics on a spec that cannot form a valid model (zero sizes, `n_heads` not a multiple of
/// `n_kv_heads`, odd head size, a quantized row length that is not a multiple of the block
/// length, or a vocabulary below [`SYNTHETIC_MIN_VOCAB`]): specs come from test code.
pub fn synthetic_llama(spec: &SyntheticSpec, seed: u64) -> Vec<u8> {
    let s = spec;
    assert!(
        s.n_layers > 0 && s.n_embd > 0 && s.n_heads > 0 && s.n_kv_heads > 0 && s.n_ff > 0,
        "synthetic spec: sizes must be non-zero: {s:?}"
    );
    assert!(
        s.n_embd.is_multiple_of(s.n_heads) && s.n_heads.is_multiple_of(s.n_kv_heads),
        "synthetic spec: n_heads must divide n_embd and n_kv_heads divide n_heads: {s:?}"
    );
    let head_dim = s.n_embd / s.n_heads;
    assert!(
        head_dim.is_multiple_of(2),
        "synthetic spec: head size {head_dim} must be even"
    );
    let block = s.weight_type.block_len() as usize;
    assert!(
        s.n_embd.is_multiple_of(block) && s.n_ff.is_multiple_of(block),
        "synthetic spec: n_embd and n_ff must be multiples of the {} block length {block}",
        s.weight_type.name()
    );
    assert!(
        s.vocab >= SYNTHETIC_MIN_VOCAB,
        "synthetic spec: vocab must be at least {SYNTHETIC_MIN_VOCAB}"
    );
    assert!(s.ctx > 0, "synthetic spec: ctx must be non-zero");

    let mut w = GgufWriter::new();
    let u32v = |v: usize| MetaValue::U32(v as u32);
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta(
            "general.name",
            MetaValue::String("flashlm synthetic llama".into()),
        )
        .meta("llama.block_count", u32v(s.n_layers))
        .meta("llama.context_length", u32v(s.ctx))
        .meta("llama.embedding_length", u32v(s.n_embd))
        .meta("llama.feed_forward_length", u32v(s.n_ff))
        .meta("llama.attention.head_count", u32v(s.n_heads))
        .meta("llama.attention.head_count_kv", u32v(s.n_kv_heads))
        .meta("llama.rope.freq_base", MetaValue::F32(10000.0))
        .meta("llama.rope.dimension_count", u32v(head_dim))
        .meta(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        )
        .meta("llama.vocab_size", u32v(s.vocab));

    // Tokenizer: bytes, merged tokens, control tokens, padding.
    let chars = byte_chars();
    let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let mut types = vec![TOKEN_NORMAL; 256];
    for m in SYNTHETIC_MERGES {
        tokens.push(m.replace(' ', ""));
        types.push(TOKEN_NORMAL);
    }
    let first_special = tokens.len();
    for sp in SYNTHETIC_SPECIALS {
        tokens.push(sp.to_string());
        types.push(TOKEN_CONTROL);
    }
    for i in tokens.len()..s.vocab {
        tokens.push(format!("[PAD{i}]"));
        types.push(TOKEN_UNUSED);
    }
    let merges: Vec<String> = SYNTHETIC_MERGES.iter().map(|m| m.to_string()).collect();
    let (eot, bos, eos) = (first_special, first_special + 1, first_special + 2);
    w.meta("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .meta("tokenizer.ggml.pre", MetaValue::String("gpt2".into()))
        .meta("tokenizer.ggml.tokens", strings(&tokens))
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
        )
        .meta("tokenizer.ggml.merges", strings(&merges))
        .meta("tokenizer.ggml.bos_token_id", u32v(bos))
        .meta("tokenizer.ggml.eos_token_id", u32v(eos))
        .meta("tokenizer.ggml.unknown_token_id", u32v(eot))
        .meta("tokenizer.ggml.padding_token_id", u32v(eos))
        .meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(false))
        .meta(
            "tokenizer.chat_template",
            MetaValue::String(CHAT_TEMPLATE.into()),
        );

    // Weights, drawn in a fixed order so a seed always gives the same model.
    let mut rng = Rng::new(seed);
    let ty = s.weight_type;
    let mut matrix = |w: &mut GgufWriter, name: &str, cols: usize, rows: usize, std: f32| {
        let vals: Vec<f32> = (0..rows * cols).map(|_| rng.normal() * std).collect();
        w.tensor(name, &[cols as u64, rows as u64], ty, quantize(ty, &vals));
    };
    let inv_sqrt = |n: usize| 1.0 / (n as f32).sqrt();
    let (e, kv) = (s.n_embd, s.n_kv_heads * head_dim);
    matrix(&mut w, TOKEN_EMBD, e, s.vocab, inv_sqrt(e));
    let mut norm_rng = Rng::new(seed ^ 0x5EED_0F4E_0F00_0001);
    let mut norm = |w: &mut GgufWriter, name: &str, n: usize| {
        let vals: Vec<f32> = (0..n).map(|_| 1.0 + 0.1 * norm_rng.normal()).collect();
        w.tensor(
            name,
            &[n as u64],
            GgmlType::F32,
            quantize(GgmlType::F32, &vals),
        );
    };
    for l in 0..s.n_layers {
        let n = LayerNames::new(l);
        norm(&mut w, &n.attn_norm, e);
        matrix(&mut w, &n.attn_q, e, e, inv_sqrt(e));
        matrix(&mut w, &n.attn_k, e, kv, inv_sqrt(e));
        matrix(&mut w, &n.attn_v, e, kv, inv_sqrt(e));
        matrix(&mut w, &n.attn_output, e, e, inv_sqrt(e));
        norm(&mut w, &n.ffn_norm, e);
        matrix(&mut w, &n.ffn_gate, e, s.n_ff, inv_sqrt(e));
        matrix(&mut w, &n.ffn_up, e, s.n_ff, inv_sqrt(e));
        matrix(&mut w, &n.ffn_down, s.n_ff, e, inv_sqrt(s.n_ff));
    }
    norm(&mut w, OUTPUT_NORM, e);
    if s.untied_output {
        matrix(&mut w, OUTPUT, e, s.vocab, inv_sqrt(e));
    }
    w.to_bytes()
}
