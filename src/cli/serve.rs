//! `serve`: listen first (so `/health` answers 503 while the model loads), then load the model
//! and start the engine on a background thread, then serve until Ctrl-C.

use std::sync::Arc;
use std::time::Duration;

use super::{Cli, CliResult, ServeArgs, engine_options, precheck, resolve_model, start_engine};
use crate::engine::{EngineError, PlacementError};
use crate::model::chat::ChatTemplate;
use crate::model::load_model;
use crate::serve::{AppState, EngineBackend, EngineBackendOptions, ServeConfig, ServedModel};

/// Load the model and start its engine, holding `a.parallel` sequences.
fn load(cli: &Cli, a: &ServeArgs) -> CliResult<ServedModel> {
    let path = resolve_model(&a.model.model)?;
    let m = Arc::new(load_model(&path)?);
    let template = match ChatTemplate::from_gguf(&m.gguf) {
        Ok(t) => Some(super::sandboxed(t)),
        Err(e) => {
            eprintln!("no chat template ({e}): /v1/chat/completions is off");
            None
        }
    };
    let mut opts = engine_options(cli, &a.model, m.cfg.n_layers)?;
    // One engine holds every sequence; a pass carries a row per decoding sequence (and its
    // drafts), and the output head computes all their logits from one read of its weights.
    opts.max_seqs = a.parallel;
    opts.ubatch = opts.ubatch.max(a.parallel);
    let per_seq = 1 + a.draft.map_or(0, |d| d.max);
    opts.logit_rows = (a.parallel * per_seq)
        .min(opts.ubatch)
        .min(16)
        .max(opts.logit_rows);
    let backend_opts = EngineBackendOptions {
        parallel: a.parallel,
        queue: a.queue,
        end_ids: m.tokenizer.eog_ids().to_vec(),
        reuse_prefix: true,
        draft: a.draft,
    };
    let quiet_cli = Cli {
        list_adapters: false,
        backend: cli.backend.clone(),
        adapter: cli.adapter.clone(),
        command: None,
    };
    let (mm, margs) = (m.clone(), a.model.clone());
    let parallel = a.parallel;
    let backend = EngineBackend::spawn(backend_opts, move || {
        // Several sequences' KV pages and rows must fit the budget: unless --kv-page is given,
        // smaller pages and passes are tried before giving up.
        let mut tries = vec![(opts.kv_page, opts.ubatch)];
        if margs.kv_page.is_none() {
            for (page, ub) in [(16, 32), (8, 16), (4, 8)] {
                tries.push((Some(page), opts.ubatch.min(ub).max(parallel)));
            }
        }
        let mut first_err = None;
        for (page, ub) in tries {
            let mut o = opts.clone();
            o.kv_page = page;
            o.ubatch = ub;
            o.logit_rows = o.logit_rows.min(ub);
            match start_engine(&quiet_cli, &margs, &mm, o, 256) {
                Ok(e) => return Ok(e),
                Err(e) => {
                    let too_small = matches!(
                        e.downcast_ref::<EngineError>(),
                        Some(EngineError::Placement(PlacementError::TooSmall { .. }))
                    );
                    let msg = e.to_string();
                    first_err.get_or_insert(msg);
                    if !too_small {
                        break;
                    }
                }
            }
        }
        Err(first_err.unwrap_or_default())
    })?;
    let id = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model")
        .to_string();
    Ok(ServedModel {
        backend: Arc::new(backend),
        model: m,
        template,
        id,
        created: crate::serve::unix_now(),
    })
}

pub fn serve(cli: &Cli, a: &ServeArgs) -> CliResult<()> {
    precheck(&a.model)?;
    // Fail on a missing model before listening.
    resolve_model(&a.model.model)?;
    let config = ServeConfig {
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        max_body: a.max_body,
        max_prompt_tokens: a.max_prompt_tokens,
        max_tokens: a.max_tokens,
        timeout: Duration::from_secs(a.timeout),
        max_connections: a.max_connections,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .map_err(|e| format!("cannot listen on {}:{}: {e}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        eprintln!("flashlm serve: listening on http://{addr}");
        if !addr.ip().is_loopback() && config.api_key.is_none() {
            eprintln!(
                "warning: listening on {} without --api-key: anyone who can reach it can use the model",
                addr.ip()
            );
        }
        let state = AppState::new(config);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let cli2 = Cli {
            list_adapters: false,
            backend: cli.backend.clone(),
            adapter: cli.adapter.clone(),
            command: None,
        };
        let a2 = a.clone();
        std::thread::Builder::new()
            .name("flashlm-load".into())
            .spawn(move || {
                let _ = tx.send(load(&cli2, &a2).map_err(|e| e.to_string()));
            })?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(crate::serve::serve(listener, state.clone(), async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = stop_rx => {}
            }
        }));
        match rx.await {
            Ok(Ok(model)) => {
                eprintln!(
                    "flashlm serve: model {} ready (context {} tokens) at http://{addr}/",
                    model.id,
                    model.backend.max_ctx()
                );
                state.set_ready(model);
            }
            Ok(Err(e)) => {
                let _ = stop_tx.send(());
                let _ = server.await;
                return Err(format!("loading the model failed: {e}").into());
            }
            Err(_) => return Err("the loading thread ended without a result".into()),
        }
        server.await??;
        eprintln!("flashlm serve: stopped");
        CliResult::Ok(())
    })
}
