//! `bench layouts`: the matrix kernels' thread-to-row layouts for this adapter's class, side by
//! side in one process. One resident engine per layout; every round times one pass of each
//! kind of decode product on every engine in turn, so the machine's drift falls on all of them
//! alike. Each round also decodes the same tokens on every engine in turn (whole decode
//! passes: attention, norms and the products' caches as they are in a run). The layout the
//! engine picks by default is marked.

use std::sync::Arc;

use serde::Serialize;

use super::median;
use crate::engine::{Engine, EngineOptions};
use crate::gguf::GgufFile;
use crate::gpu::MatmulLayout;
use crate::sampling::{Sampler, SamplerParams};

/// The kinds of decode product a pass runs, by their dispatch labels; "all" is every product.
const KINDS: [(&str, &str); 5] = [
    ("gated FFN", "matmul gated"),
    ("+residual", "matmul +residual"),
    ("QKV", "matmul qkv"),
    ("output head", "matmul head"),
    ("other", "matmul"),
];

/// Passes of the products per timed submission.
const REPS: usize = 4;

/// Tokens each engine decodes per round (after a fixed prompt of [`PROMPT`] tokens).
const DECODE_TOKENS: usize = 16;
const PROMPT: usize = 8;

/// One layout's figures.
#[derive(Debug, Clone, Serialize)]
pub struct LayoutRow {
    pub layout: String,
    pub default: bool,
    /// GB/s of weight bytes per kind of product (None: the model has no such product), in
    /// the order of [`KINDS`].
    pub kinds_gb_s: Vec<Option<f64>>,
    /// GB/s over every decode product.
    pub all_gb_s: f64,
    /// `all_gb_s` over the first layout's (the reference) in the same rounds.
    pub vs_first: f64,
    /// Whole decode passes: tokens per second (median over the rounds), and its median ratio
    /// to the first layout's in the same rounds.
    pub decode_tok_s: f64,
    pub decode_vs_first: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LayoutsReport {
    pub adapter: String,
    pub adapter_class: String,
    pub rounds: usize,
    pub rows: Vec<LayoutRow>,
}

/// The layout's name as the table shows it.
fn describe(l: &MatmulLayout) -> String {
    if l.tpr > 1 {
        format!(
            "{} rows a workgroup, {} threads a row",
            l.rows_per_wg, l.tpr
        )
    } else {
        format!(
            "{} rows a workgroup, {} a thread in decode{}{}{}{}{}",
            l.rows_per_wg,
            l.rows_per_lane,
            if l.multi_rows_per_lane != l.rows_per_lane {
                format!(" ({} in the one-dispatch Q/K/V)", l.multi_rows_per_lane)
            } else {
                String::new()
            },
            if l.load_words > 1 {
                format!(", loads of up to {} words", l.load_words)
            } else {
                String::new()
            },
            if l.load64 {
                ", 16-byte loads as two 64-bit words"
            } else {
                ""
            },
            if l.load_words > 1 && l.touch_bytes > 0 {
                format!(", rows' first {} bytes touched first", l.touch_bytes)
            } else {
                String::new()
            },
            if l.share_x {
                ", X shared by subgroups"
            } else {
                ""
            }
        )
    }
}

/// The layouts worth comparing on an adapter of this class, the reference first.
pub fn candidates(cpu: bool) -> Vec<MatmulLayout> {
    if cpu {
        [
            (1, 1, false, 0, 1),
            (2, 1, false, 0, 2),
            (4, 1, false, 0, 4),
            (2, 4, false, 0, 2),
            (2, 4, false, 4096, 4),
            (2, 4, true, 0, 2),
            (1, 4, true, 4096, 1),
            (4, 4, true, 4096, 4),
            (2, 4, true, 4096, 4),
        ]
        .into_iter()
        .map(|(r, w, wide, touch, m)| MatmulLayout {
            rows_per_lane: r,
            load_words: w,
            load64: wide,
            touch_bytes: touch,
            multi_rows_per_lane: m,
            ..MatmulLayout::CPU
        })
        .collect()
    } else {
        vec![
            MatmulLayout::GPU,
            MatmulLayout {
                rows_per_wg: 8,
                tpr: 8,
                ..MatmulLayout::GPU
            },
        ]
    }
}

/// Times every candidate layout over `rounds` rounds.
pub fn run(
    gguf: Arc<GgufFile>,
    opts: &EngineOptions,
    rounds: usize,
) -> Result<LayoutsReport, Box<dyn std::error::Error>> {
    let base = Engine::new(gguf.clone(), opts)?;
    let cpu = base.ctx.info.device_type == wgpu::DeviceType::Cpu;
    let chosen = base.ctx.matmul_layout;
    let adapter = base.ctx.info.name.clone();
    // Without 64-bit integers the 64-bit loads are 32-bit ones: each such layout once.
    let mut layouts: Vec<MatmulLayout> = Vec::new();
    for l in candidates(cpu) {
        let l = MatmulLayout {
            load64: l.load64 && base.ctx.int64,
            ..l
        };
        if !layouts.contains(&l) {
            layouts.push(l);
        }
    }
    let mut base = Some(base);
    let mut engines = Vec::new();
    for (i, l) in layouts.iter().enumerate() {
        eprintln!("layout {}: {}", i + 1, describe(l));
        if *l == chosen
            && let Some(e) = base.take()
        {
            engines.push(e);
            continue;
        }
        let mut o = opts.clone();
        o.gpu.matmul_layout = Some(*l);
        engines.push(Engine::new(gguf.clone(), &o)?);
    }
    drop(base);
    // Which kinds this model's pass has.
    let mut present = Vec::new();
    for (_, label) in KINDS {
        let (_, b) = engines[0].time_matvecs_where(1, |l| l == label)?;
        present.push(b > 0);
    }
    let mut all: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    let mut per: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); KINDS.len()]; engines.len()];
    let mut ratio: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    let mut dec: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    let mut dec_ratio: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    // A fixed prompt of ordinary token ids (the decode cost does not depend on which).
    let vocab = engines[0].cfg.vocab_size.min(1000) as u32;
    let prompt: Vec<u32> = (0..PROMPT as u32).map(|i| (i * 97 + 13) % vocab).collect();
    let decode = |e: &mut Engine| -> Result<f64, Box<dyn std::error::Error>> {
        e.reset();
        let mut sampler = Sampler::new(SamplerParams {
            temperature: 0.0,
            ..Default::default()
        });
        let (_, s) = e.generate(&prompt, DECODE_TOKENS, &mut sampler, |_| false, |_| true)?;
        Ok(s.decode_tok_s)
    };
    for e in engines.iter_mut() {
        e.time_matvecs(1)?;
        decode(e)?;
    }
    for r in 0..rounds {
        // Every other round runs the engines in reverse, so that no layout always runs
        // right after the same one.
        let order: Vec<usize> = if r % 2 == 0 {
            (0..engines.len()).collect()
        } else {
            (0..engines.len()).rev().collect()
        };
        let mut round_all = vec![0.0; engines.len()];
        for &i in &order {
            let e = &mut engines[i];
            let (t, b) = e.time_matvecs_where(REPS, |_| true)?;
            let g = (b * REPS as u64) as f64 / t / 1e9;
            all[i].push(g);
            round_all[i] = g;
            for (k, (_, label)) in KINDS.iter().enumerate() {
                if present[k] {
                    let (t, b) = e.time_matvecs_where(REPS, |l| l == *label)?;
                    per[i][k].push((b * REPS as u64) as f64 / t / 1e9);
                }
            }
        }
        for (i, g) in round_all.iter().enumerate() {
            ratio[i].push(g / round_all[0].max(1e-12));
        }
        let mut round_dec = vec![0.0; engines.len()];
        for &i in &order {
            let t = decode(&mut engines[i])?;
            dec[i].push(t);
            round_dec[i] = t;
        }
        for (i, t) in round_dec.iter().enumerate() {
            dec_ratio[i].push(t / round_dec[0].max(1e-12));
        }
        eprintln!("round {}/{rounds} done", r + 1);
    }
    let rows = layouts
        .iter()
        .enumerate()
        .map(|(i, l)| LayoutRow {
            layout: describe(l),
            default: *l == chosen,
            kinds_gb_s: (0..KINDS.len())
                .map(|k| present[k].then(|| median(&mut per[i][k])))
                .collect(),
            all_gb_s: median(&mut all[i]),
            vs_first: median(&mut ratio[i]),
            decode_tok_s: median(&mut dec[i]),
            decode_vs_first: median(&mut dec_ratio[i]),
        })
        .collect();
    Ok(LayoutsReport {
        adapter,
        adapter_class: if cpu { "CPU rasterizer" } else { "GPU" }.into(),
        rounds,
        rows,
    })
}

impl LayoutsReport {
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "adapter {} ({}); {} rounds, each timing {REPS} passes of every kind of decode \
             product on every layout in turn, then decoding {DECODE_TOKENS} tokens after a \
             {PROMPT}-token prompt on each (every other round in reverse order); GB/s of weight bytes and decode tok/s, medians over \
             the rounds; \"x first\" is the median of the rounds' ratios to the first layout\n\n",
            self.adapter, self.adapter_class, self.rounds
        );
        s += "| layout | default |";
        for (name, _) in KINDS {
            s += &format!(" {name} |");
        }
        s += " all products | x first | decode tok/s | decode x first |\n|---|---|";
        for _ in KINDS {
            s += "---|";
        }
        s += "---|---|---|---|\n";
        for r in &self.rows {
            s += &format!("| {} | {} |", r.layout, if r.default { "yes" } else { "" });
            for k in &r.kinds_gb_s {
                match k {
                    Some(g) => s += &format!(" {g:.3} |"),
                    None => s += " - |",
                }
            }
            s += &format!(
                " {:.3} | {:.2} | {:.2} | {:.2} |\n",
                r.all_gb_s, r.vs_first, r.decode_tok_s, r.decode_vs_first
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_put_the_reference_first_and_include_the_defaults() {
        let cpu = candidates(true);
        assert_eq!(cpu[0].rows_per_lane, 1);
        assert!(cpu.contains(&MatmulLayout::CPU));
        let gpu = candidates(false);
        assert_eq!(gpu[0], MatmulLayout::GPU);
        for l in cpu.iter().chain(&gpu) {
            assert!(l.rows_per_wg >= crate::kernels::MM_ROWS_PER_WG);
            assert!(l.tpr == 1 || l.tpr >= crate::kernels::MM_PREFILL_TT);
        }
    }
}
