//! `eval ppl`: perplexity of a text under the engine, with any budget and KV options.

use std::time::Instant;

use super::{
    Cli, CliResult, EvalArgs, EvalKind, engine_options, precheck, resolve_model, start_engine,
};
use crate::eval::ppl;
use crate::model::load_model;

pub fn eval(cli: &Cli, e: &EvalArgs) -> CliResult<()> {
    match &e.which {
        EvalKind::Ppl {
            model,
            file,
            chunks,
            json,
        } => {
            precheck(model)?;
            let path = resolve_model(&model.model)?;
            let m = load_model(&path)?;
            let bytes =
                std::fs::read(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
            let text = String::from_utf8(bytes)
                .map_err(|e| format!("{} is not UTF-8 text: {e}", file.display()))?;
            let tokens = m
                .tokenizer
                .encode_with_bos(&text, false, m.tokenizer.add_bos());
            let ctx = model.ctx.unwrap_or(512);
            let bos = if m.tokenizer.add_bos() {
                m.tokenizer.bos_id()
            } else {
                None
            };
            let list = ppl::chunks(&tokens, ctx, *chunks, bos)?;
            let mut opts = engine_options(cli, model, m.cfg.n_layers)?;
            opts.ctx = Some(ctx);
            opts.logit_rows = if model.gpu_budget.is_some() { 4 } else { 16 };
            let mut engine = start_engine(cli, model, &m, opts, ctx)?;
            eprintln!(
                "perplexity over {} ({} tokens): {} chunks of {ctx} tokens, {} scored each",
                file.display(),
                tokens.len(),
                list.len(),
                ppl::scored_per_chunk(ctx)
            );
            let t0 = Instant::now();
            let report = crate::eval::perplexity(&mut engine, &list, &mut |k, acc| {
                eprintln!(
                    "[{}/{}] ppl {:.4} ({:.1} s)",
                    k + 1,
                    list.len(),
                    acc.ppl(),
                    t0.elapsed().as_secs_f64()
                );
            })?;
            println!(
                "PPL = {:.4} +/- {:.5} ({} tokens scored in {} chunks of {ctx})",
                report.ppl, report.stderr, report.tokens, report.chunks
            );
            if let Some(j) = json {
                let v = serde_json::json!({
                    "report": report,
                    "ctx": ctx,
                    "text": file.display().to_string(),
                    "text_tokens": tokens.len(),
                    "placement": engine.placement.to_string(),
                    "kv_select": model.kv_select,
                    "kv_page_tokens": engine.plan.kv.page_tokens,
                    "seconds": t0.elapsed().as_secs_f64(),
                });
                std::fs::write(j, serde_json::to_string_pretty(&v)?)
                    .map_err(|e| format!("writing {}: {e}", j.display()))?;
            }
            Ok(())
        }
    }
}
