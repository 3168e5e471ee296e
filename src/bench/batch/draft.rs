//! The drafting half of `bench batch`: prompt-lookup drafts against plain decoding on prompts
//! whose answers repeat their input.
//!
//! Each prompt asks the model, through its chat template, to repeat a passage of the default
//! text word for word. The passages are chosen by a rule, not by hand: whole sentences (at least
//! `draft_words` words, at most twice that) starting at the first sentence after evenly spaced
//! points of the text. Generation stops at the model's end of generation (or after
//! `draft_tokens`), as a request would; figures are summed over the passages.

use serde::Serialize;

use super::{BatchBenchOptions, BenchResult, engine, greedy, read_bytes};
use crate::engine::EngineOptions;
use crate::engine::draft::DraftStats;
use crate::model::LoadedModel;
use crate::model::chat::{ChatMessage, ChatTemplate};

/// The instruction of the drafting prompts; the passage follows it.
pub const COPY_INSTRUCTION: &str =
    "Repeat the following passage exactly, word for word, and write nothing else.";

#[derive(Debug, Clone, Serialize)]
pub struct DraftRow {
    pub mode: String,
    /// Tokens generated, over all prompts.
    pub tokens: usize,
    /// Every decode pass after the prefills.
    pub decode_passes: u64,
    /// Passes that verified a draft.
    pub draft_passes: u64,
    pub drafted: u64,
    pub accepted: u64,
    /// Drafted tokens accepted per decode pass (the token each pass yields anyway excluded;
    /// passes with no draft count with 0).
    pub accepted_per_pass: f64,
    /// Drafted tokens accepted per pass that carried a draft.
    pub accepted_per_draft_pass: f64,
    /// Tokens per decode pass, including the one each pass yields anyway.
    pub tokens_per_pass: f64,
    /// Decode milliseconds per token after each prompt's first.
    pub ms_per_token: f64,
    /// Flash bytes of the whole generations (prefills included) per generated token.
    pub flash_bytes_per_token: f64,
    /// Each prompt's generated ids.
    pub ids: Vec<Vec<u32>>,
}

/// The drafting comparison: rows for plain and lookup decoding, and the prompts' lengths.
pub struct DraftRun {
    pub rows: Vec<DraftRow>,
    pub prompt_tokens: Vec<usize>,
}

fn ends_sentence(w: &str) -> bool {
    let w = w.trim_end_matches(['"', '\'', ')', '_']);
    w.ends_with('.') || w.ends_with('!') || w.ends_with('?')
}

/// Whole sentences from the first one starting after word `from`: at least `min` words (fewer
/// only where the text ends), cut at `2 * min` words inside an overlong sentence.
pub fn sentences(words: &[&str], from: usize, min: usize) -> String {
    let min = min.max(1);
    let mut a = from.min(words.len());
    while a < words.len() && !ends_sentence(words[a]) {
        a += 1;
    }
    a += 1;
    if a + min > words.len() {
        a = 0;
    }
    let mut b = a;
    while b < words.len() && b - a < 2 * min && (b - a < min || !ends_sentence(words[b - 1])) {
        b += 1;
    }
    words[a..b].join(" ")
}

/// A prompt asking to repeat `text`: the model's chat template (plain text when it has none).
pub fn copy_prompt(m: &LoadedModel, text: &str) -> Vec<u32> {
    let ask = format!("{COPY_INSTRUCTION}\n\n{text}");
    match ChatTemplate::from_gguf(&m.gguf)
        .and_then(|t| t.render(&[ChatMessage::user(ask.clone())], true))
    {
        Ok(r) => m.tokenizer.encode(&r, true),
        Err(_) => m.tokenizer.encode(&format!("{ask}\n\n"), false),
    }
}

pub fn run(
    m: &LoadedModel,
    base: &EngineOptions,
    b: &BatchBenchOptions,
    words: &[&str],
) -> BenchResult<DraftRun> {
    let count = b.draft_passages.max(1);
    let prompts: Vec<Vec<u32>> = (1..=count)
        .map(|i| {
            copy_prompt(
                m,
                &sentences(words, i * words.len() / (count + 1), b.draft_words),
            )
        })
        .collect();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut o = base.clone();
    o.gpu.budget = Some(b.budget);
    o.ctx = Some((longest + b.draft_tokens).max(256));
    o.logit_rows = b.draft.max + 1;
    let eog = m.tokenizer.eog_ids().to_vec();
    let is_end = |t: u32| eog.contains(&t);
    let mut rows = Vec::new();
    for mode in ["plain", "lookup"] {
        let mut e = engine(m, &o, b.io)?;
        let f0 = read_bytes(&e);
        let mut sum = DraftStats::default();
        let mut ids = Vec::new();
        let mut decode_s = 0.0;
        for p in &prompts {
            e.reset();
            let (out, s, d) = if mode == "plain" {
                let (out, s) = e.generate(p, b.draft_tokens, &mut greedy(), is_end, |_| true)?;
                let d = DraftStats {
                    decode_passes: out.len().saturating_sub(1) as u64,
                    ..Default::default()
                };
                (out, s, d)
            } else {
                e.generate_drafted(p, b.draft_tokens, &mut greedy(), &b.draft, is_end, |_| true)?
            };
            decode_s += s.decode_s;
            sum.decode_passes += d.decode_passes;
            sum.passes += d.passes;
            sum.drafted += d.drafted;
            sum.accepted += d.accepted;
            ids.push(out);
        }
        let tokens: usize = ids.iter().map(Vec::len).sum();
        let decoded = tokens.saturating_sub(ids.len());
        let per = |a: f64, p: f64| if p > 0.0 { a / p } else { 0.0 };
        let row = DraftRow {
            mode: mode.into(),
            tokens,
            decode_passes: sum.decode_passes,
            draft_passes: sum.passes,
            drafted: sum.drafted,
            accepted: sum.accepted,
            accepted_per_pass: per(sum.accepted as f64, sum.decode_passes as f64),
            accepted_per_draft_pass: per(sum.accepted as f64, sum.passes as f64),
            tokens_per_pass: per(decoded as f64, sum.decode_passes as f64),
            ms_per_token: per(decode_s * 1e3, decoded as f64),
            flash_bytes_per_token: per((read_bytes(&e) - f0) as f64, tokens as f64),
            ids,
        };
        eprintln!(
            "{mode}: {:.2} tokens per pass, {:.1} ms/token",
            row.tokens_per_pass, row.ms_per_token
        );
        rows.push(row);
    }
    Ok(DraftRun {
        rows,
        prompt_tokens: prompts.iter().map(Vec::len).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::sentences;

    #[test]
    fn passages_are_whole_sentences() {
        let w: Vec<&str> = "a b. c d e. f g h i j k l m n o p. q r?"
            .split(' ')
            .collect();
        // From inside the first sentence: starts at the next one, ends at a sentence end.
        assert_eq!(sentences(&w, 0, 2), "c d e.");
        // An overlong sentence is cut at twice the minimum.
        assert_eq!(sentences(&w, 3, 3), "f g h i j k");
        assert_eq!(sentences(&w, 0, 4), "c d e. f g h i j");
        // Near the end of the text: from the start.
        assert_eq!(sentences(&w, 17, 2), "a b.");
    }
}
