//! Routes: the API endpoints, `/health`, `/metrics` and the chat page; access checks and
//! request counting around them.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::BodyExt;
use serde_json::json;

use super::error::ApiError;
use super::generate::{self, Kind};
use super::request::{self, Prompt};
use super::{AppState, ServedModel};

/// The chat page.
const PAGE: &str = include_str!("page.html");

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/", get(page))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Paths that need the API key when one is set.
fn needs_key(path: &str) -> bool {
    path.starts_with("/v1/") || path == "/metrics"
}

/// Compares without stopping at the first difference.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn authorized(headers: &HeaderMap, key: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|got| same_key(got.trim().as_bytes(), key.as_bytes()))
}

/// Checks the API key, counts the request by endpoint and status, and gives 405s an error body.
async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let resp = match &st.config.api_key {
        Some(key) if needs_key(&path) && !authorized(req.headers(), key) => {
            ApiError::unauthorized().into_response()
        }
        _ => {
            let r = next.run(req).await;
            if r.status() == StatusCode::METHOD_NOT_ALLOWED {
                let allow = r.headers().get(header::ALLOW).cloned();
                let mut e = ApiError::method_not_allowed().into_response();
                if let Some(a) = allow {
                    e.headers_mut().insert(header::ALLOW, a);
                }
                e
            } else {
                r
            }
        }
    };
    st.metrics().count_request(&path, resp.status().as_u16());
    resp
}

async fn not_found(req: Request) -> ApiError {
    let p: String = req.uri().path().chars().take(200).collect();
    ApiError::not_found(&p)
}

fn ready(st: &AppState) -> Result<Arc<ServedModel>, ApiError> {
    st.model().cloned().ok_or_else(ApiError::loading)
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    match ready(&st) {
        Ok(_) => axum::Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let b = st.model().map(|m| m.backend.metrics());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.metrics().render(b.as_ref()),
    )
        .into_response()
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

async fn models(State(st): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let m = ready(&st)?;
    Ok(axum::Json(json!({
        "object": "list",
        "data": [{
            "id": m.id,
            "object": "model",
            "created": m.created,
            "owned_by": "flashlm",
            "context_length": m.backend.max_ctx(),
        }],
    }))
    .into_response())
}

/// Most bytes of a refused body read and thrown away before answering 413, and for how long:
/// a client still sending when the connection closes would get a reset instead of the answer.
const DRAIN_BYTES: u64 = 16 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// The body, declared as JSON (415 otherwise), at most `max_body` bytes (413 beyond), read
/// within the request time limit.
async fn read_body(st: &AppState, headers: &HeaderMap, body: Body) -> Result<Vec<u8>, ApiError> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(ApiError::not_json());
    }
    let limit = st.config.max_body;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // A client waiting for `100 Continue` sends nothing more: answer at once.
    let waits = headers.contains_key(header::EXPECT);
    if declared.is_some_and(|n| n > limit) && waits {
        return Err(ApiError::too_large(limit));
    }
    let read = async {
        let mut body = body;
        let mut out = Vec::new();
        let mut seen = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| ApiError::invalid(format!("reading the request body failed: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            seen = seen.saturating_add(data.len() as u64);
            if seen > limit || declared.is_some_and(|n| n > limit) {
                // Over the limit: keep reading (and dropping) a while, then refuse.
                let drain = async {
                    while seen <= DRAIN_BYTES {
                        match body.frame().await {
                            Some(Ok(f)) => {
                                let n = f.data_ref().map_or(0, |d| d.len());
                                seen = seen.saturating_add(n as u64);
                            }
                            _ => break,
                        }
                    }
                };
                let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
                return Err(ApiError::too_large(limit));
            }
            out.extend_from_slice(&data);
        }
        Ok(out)
    };
    match tokio::time::timeout(st.config.timeout, read).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::timeout(st.config.timeout.as_secs())),
    }
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let m = ready(&st)?;
    let bytes = read_body(&st, &headers, body).await?;
    let req = request::parse_chat(&bytes, st.config.max_tokens)?;
    let Some(template) = &m.template else {
        return Err(ApiError::invalid(
            "this model has no chat template: use /v1/completions",
        ));
    };
    // Rendering and tokenizing a large conversation is CPU work: off the async threads.
    let rendered = template
        .render(&req.messages, true)
        .map_err(|e| ApiError::invalid_param("messages", e.to_string()))?;
    let mm = m.clone();
    let ids = tokio::task::spawn_blocking(move || mm.model.tokenizer.encode(&rendered, true))
        .await
        .map_err(|e| ApiError::server(format!("tokenizing failed: {e}")))?;
    generate::run(st, m, Kind::Chat, ids, req.common).await
}

async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let m = ready(&st)?;
    let bytes = read_body(&st, &headers, body).await?;
    let req = request::parse_completion(&bytes, st.config.max_tokens)?;
    let ids = match req.prompt {
        Prompt::Tokens(ids) => {
            let vocab = m.model.tokenizer.n_vocab();
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid_param(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary of {vocab}"),
                ));
            }
            ids
        }
        Prompt::Text(text) => {
            let mm = m.clone();
            // Raw text, as `flashlm run` reads it: special tokens are not parsed (send token
            // ids for those).
            tokio::task::spawn_blocking(move || mm.model.tokenizer.encode(&text, false))
                .await
                .map_err(|e| ApiError::server(format!("tokenizing failed: {e}")))?
        }
    };
    generate::run(st, m, Kind::Completion, ids, req.common).await
}
