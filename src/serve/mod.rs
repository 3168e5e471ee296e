//! `flashlm serve`: an OpenAI-compatible HTTP server and a chat page.
//!
//! The HTTP side (axum on hyper and tokio) parses and checks requests ([`request`]), renders
//! chat messages with the model's template, tokenizes, and hands token requests to a
//! [`Backend`]; tokens come back on a channel per request and are detokenized, cut at stop
//! sequences ([`text`]) and sent whole or as server-sent events ([`handlers`]). The model side
//! is behind the [`Backend`] trait; [`EngineBackend`] runs every request's sequence in one engine's shared passes.
//!
//! Limits: bodies over `max_body` get 413, prompts over the context or `max_prompt_tokens` 400,
//! a full queue 429, a request past `timeout` is cancelled (504, or an error event when
//! streaming); connections beyond `max_connections` are closed at once and a client has
//! `HEADER_TIMEOUT` to send its headers. A client that goes away cancels its generation.

pub mod backend;
mod batcher;
pub mod engine_backend;
pub mod error;
mod generate;
mod handlers;
pub mod metrics;
pub mod request;
pub mod text;

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use backend::{Backend, BackendMetrics, Busy, Finish, GenEvent, GenRequest};
pub use engine_backend::{BackendError, EngineBackend, EngineBackendOptions};
pub use error::ApiError;
use metrics::ServerMetrics;

use crate::model::LoadedModel;
use crate::model::chat::ChatTemplate;

/// Time a client has to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Limits and access of the HTTP side.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Clients must send `Authorization: Bearer <key>` to `/v1/*` and `/metrics`.
    pub api_key: Option<String>,
    /// Largest request body in bytes.
    pub max_body: u64,
    /// Most prompt tokens (None: what the context allows).
    pub max_prompt_tokens: Option<usize>,
    /// Most tokens a request may ask for; also the default when it asks for none (bounded by
    /// the room left in the context).
    pub max_tokens: usize,
    /// Longest a request may take, queueing included.
    pub timeout: Duration,
    /// Open connections at once.
    pub max_connections: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            api_key: None,
            max_body: 1 << 20,
            max_prompt_tokens: None,
            max_tokens: 1024,
            timeout: Duration::from_secs(600),
            max_connections: 256,
        }
    }
}

/// The loaded model as the server sees it.
pub struct ServedModel {
    pub backend: Arc<dyn Backend>,
    /// The tokenizer (and the file's metadata).
    pub model: Arc<LoadedModel>,
    /// The chat template (None: `/v1/chat/completions` answers that the model has none).
    pub template: Option<ChatTemplate>,
    /// The name `/v1/models` lists and responses carry.
    pub id: String,
    /// Unix time the model was loaded.
    pub created: u64,
}

/// What every request handler shares.
pub struct AppState {
    pub config: ServeConfig,
    model: OnceLock<Arc<ServedModel>>,
    metrics: ServerMetrics,
}

impl AppState {
    pub fn new(config: ServeConfig) -> Arc<Self> {
        Arc::new(AppState {
            config,
            model: OnceLock::new(),
            metrics: ServerMetrics::default(),
        })
    }

    /// The model is loaded: requests are served from now on. Only the first call counts.
    pub fn set_ready(&self, model: ServedModel) {
        let _ = self.model.set(Arc::new(model));
    }

    pub fn model(&self) -> Option<&Arc<ServedModel>> {
        self.model.get()
    }

    pub fn metrics(&self) -> &ServerMetrics {
        &self.metrics
    }
}

/// Unix time in seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Accept connections on `listener` until `shutdown` completes, serving each with HTTP/1.1.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let app = handlers::router(state.clone());
    let slots = Arc::new(Semaphore::new(state.config.max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    log::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return Ok(()),
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            log::warn!("refusing a connection from {peer}: too many open connections");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let svc = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                log::debug!("connection from {peer}: {e}");
            }
        });
    }
}
