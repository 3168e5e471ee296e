//! `serve`: listen first (so `/health` answers 503 while the model loads), then load the model
//! and start the engines on a background thread, then serve until Ctrl-C.

use std::sync::Arc;
use std::time::Duration;

use super::{Cli, CliResult, ServeArgs, engine_options, precheck, resolve_model, start_engine};
use crate::model::chat::ChatTemplate;
use crate::model::load_model;
use crate::serve::{AppState, EngineBackend, EngineBackendOptions, ServeConfig, ServedModel};

/// Load the model and start `a.parallel` engines.
fn load(cli: &Cli, a: &ServeArgs) -> CliResult<ServedModel> {
    let path = resolve_model(&a.model.model)?;
    let m = Arc::new(load_model(&path)?);
    let template = match ChatTemplate::from_gguf(&m.gguf) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("no chat template ({e}): /v1/chat/completions is off");
            None
        }
    };
    let mut opts = engine_options(cli, &a.model, m.cfg.n_layers)?;
    // Each engine gets an equal share of the budget.
    opts.gpu.budget = opts.gpu.budget.map(|b| b / a.parallel as u64);
    let backend_opts = EngineBackendOptions {
        workers: a.parallel,
        queue: a.queue,
        end_ids: m.tokenizer.eog_ids().to_vec(),
        reuse_prefix: true,
    };
    let quiet_cli = Cli {
        list_adapters: false,
        backend: cli.backend.clone(),
        adapter: cli.adapter.clone(),
        command: None,
    };
    let (mm, margs) = (m.clone(), a.model.clone());
    let backend = EngineBackend::spawn(backend_opts, move |_| {
        start_engine(&quiet_cli, &margs, &mm, opts.clone(), 256).map_err(|e| e.to_string())
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
