//! One generation from token ids to a response: limits, the queue, the text pipeline on a
//! blocking thread, and the answer whole or as server-sent events in OpenAI's chunk format.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::backend::{Finish, GenEvent, GenRequest};
use super::error::ApiError;
use super::request::{Common, fresh_seed};
use super::text::TextStream;
use super::{AppState, ServedModel, unix_now};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// What the text pipeline sends to the response.
enum Out {
    Text(String),
    End {
        finish: &'static str,
        completion_tokens: usize,
    },
    Fail(ApiError),
}

/// Sets the cancel flag when dropped: a response that is dropped (the client went away, or
/// the request ended early) frees its sequence.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn fresh_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}{:08x}", fresh_seed(), fresh_seed() as u32)
}

/// Check the prompt against the limits, queue it, and answer.
pub async fn run(
    st: Arc<AppState>,
    m: Arc<ServedModel>,
    kind: Kind,
    ids: Vec<u32>,
    c: Common,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let ctx = m.backend.max_ctx();
    let n = ids.len();
    if n == 0 {
        return Err(ApiError::invalid_param(
            "prompt",
            "the prompt is empty after tokenization",
        ));
    }
    let prompt_limit = st.config.max_prompt_tokens.unwrap_or(usize::MAX);
    let param = if kind == Kind::Chat {
        "messages"
    } else {
        "prompt"
    };
    if n >= ctx || n > prompt_limit {
        return Err(ApiError::invalid_param(
            param,
            format!(
                "the prompt has {n} tokens; this server takes at most {} (the context holds {ctx} tokens, prompt and completion together)",
                prompt_limit.min(ctx - 1)
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let room = ctx - n;
    let max_tokens = match c.max_tokens {
        Some(k) if k > room => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!(
                    "the prompt ({n} tokens) and max_tokens ({k}) do not fit the context of {ctx} tokens; ask for at most {room}"
                ),
            )
            .with_code("context_length_exceeded"));
        }
        Some(k) => k,
        None => st.config.max_tokens.min(room),
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let rx = m
        .backend
        .submit(GenRequest {
            prompt: ids,
            max_tokens,
            sampling: c.sampling.clone(),
            cancel: cancel.clone(),
        })
        .map_err(|b| ApiError::busy(b.to_string()))?;
    let guard = CancelOnDrop(cancel.clone());
    // The text pipeline: a blocking thread reads the backend's channel, detokenizes and cuts
    // at stop sequences, and passes text on. A closed `out` (the response is gone) cancels.
    let (out_tx, out_rx) = mpsc::channel::<Out>(64);
    let deadline = start + st.config.timeout;
    let timeout_s = st.config.timeout.as_secs();
    let (mm, stops) = (m.clone(), c.stop.clone());
    tokio::task::spawn_blocking(move || {
        let mut ts = TextStream::new(&mm.model.tokenizer, stops);
        let mut count = 0usize;
        let send = |o: Out| out_tx.blocking_send(o).is_ok();
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            let ev = match rx.recv_timeout(wait) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => {
                    cancel.store(true, Ordering::Release);
                    send(Out::Fail(ApiError::timeout(timeout_s)));
                    return;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    send(Out::Fail(ApiError::server("the model stopped serving")));
                    return;
                }
            };
            match ev {
                GenEvent::Token(id) => {
                    count += 1;
                    let t = ts.push(id);
                    if (!t.is_empty() && !send(Out::Text(t))) || cancel.load(Ordering::Acquire) {
                        cancel.store(true, Ordering::Release);
                        return;
                    }
                    if ts.stopped() {
                        // Enough text: free the sequence, and answer once it is free (within a
                        // token), so the next request of this client finds it free.
                        cancel.store(true, Ordering::Release);
                        let wait = deadline.saturating_duration_since(Instant::now());
                        while let Ok(GenEvent::Token(_)) = rx.recv_timeout(wait) {}
                        send(Out::End {
                            finish: "stop",
                            completion_tokens: count,
                        });
                        return;
                    }
                }
                GenEvent::Done { finish } => {
                    if finish == Finish::Cancelled && !ts.stopped() {
                        // Cancelled by this side (client gone or timed out): nobody listens.
                        return;
                    }
                    let t = ts.finish();
                    if !t.is_empty() && !send(Out::Text(t)) {
                        return;
                    }
                    let reason = if finish == Finish::Stop || ts.stopped() {
                        "stop"
                    } else {
                        "length"
                    };
                    send(Out::End {
                        finish: reason,
                        completion_tokens: count,
                    });
                    return;
                }
                GenEvent::Error(e) => {
                    send(Out::Fail(ApiError::server(format!(
                        "generation failed: {e}"
                    ))));
                    return;
                }
            }
        }
    });
    let meta = Meta {
        id: fresh_id(if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        }),
        created: unix_now(),
        model: m.id.clone(),
        kind,
        prompt_tokens: n,
        include_usage: c.include_usage,
    };
    if c.stream {
        Ok(stream_response(st, meta, out_rx, guard))
    } else {
        whole_response(st, meta, out_rx, guard).await
    }
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    prompt_tokens: usize,
    include_usage: bool,
}

impl Meta {
    fn usage(&self, completion: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        })
    }

    /// A streamed chunk with one choice.
    fn chunk(&self, text: Option<&str>, role: bool, finish: Option<&str>) -> Value {
        match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({
                    "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                    "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": null,
                                 "finish_reason": finish}],
                })
            }
            Kind::Completion => json!({
                "id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "text": text.unwrap_or(""), "logprobs": null,
                             "finish_reason": finish}],
            }),
        }
    }

    /// The last streamed chunk with `stream_options.include_usage`: no choices, the usage.
    fn usage_chunk(&self, completion: usize) -> Value {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [], "usage": self.usage(completion),
        })
    }

    fn whole(&self, text: &str, finish: &str, completion: usize) -> Value {
        let (object, choice) = match self.kind {
            Kind::Chat => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": null, "finish_reason": finish}),
            ),
            Kind::Completion => (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish}),
            ),
        };
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [choice], "usage": self.usage(completion),
        })
    }
}

async fn whole_response(
    st: Arc<AppState>,
    meta: Meta,
    mut rx: mpsc::Receiver<Out>,
    guard: CancelOnDrop,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(o) = rx.recv().await {
        match o {
            Out::Text(t) => text.push_str(&t),
            Out::Fail(e) => return Err(e),
            Out::End {
                finish,
                completion_tokens,
            } => {
                drop(guard);
                st.metrics()
                    .count_tokens(meta.prompt_tokens, completion_tokens);
                return Ok(axum::Json(meta.whole(&text, finish, completion_tokens)).into_response());
            }
        }
    }
    Err(ApiError::server("the generation ended without a result"))
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// State of a streamed response.
struct Streaming {
    st: Arc<AppState>,
    meta: Meta,
    rx: mpsc::Receiver<Out>,
    _guard: CancelOnDrop,
    /// Events ready to send, and whether the stream is over once they are sent.
    ready: std::collections::VecDeque<Bytes>,
    over: bool,
}

fn stream_response(
    st: Arc<AppState>,
    meta: Meta,
    rx: mpsc::Receiver<Out>,
    guard: CancelOnDrop,
) -> Response {
    let mut ready = std::collections::VecDeque::new();
    // Chat streams open with the assistant's role.
    if meta.kind == Kind::Chat {
        ready.push_back(sse(&meta.chunk(Some(""), true, None)));
    }
    let s = Streaming {
        st,
        meta,
        rx,
        _guard: guard,
        ready,
        over: false,
    };
    let stream = futures::stream::unfold(s, |mut s| async move {
        loop {
            if let Some(b) = s.ready.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), s));
            }
            if s.over {
                return None;
            }
            match s.rx.recv().await {
                Some(Out::Text(t)) => s.ready.push_back(sse(&s.meta.chunk(Some(&t), false, None))),
                Some(Out::End {
                    finish,
                    completion_tokens,
                }) => {
                    s.st.metrics()
                        .count_tokens(s.meta.prompt_tokens, completion_tokens);
                    let last = match s.meta.kind {
                        Kind::Chat => s.meta.chunk(None, false, Some(finish)),
                        Kind::Completion => s.meta.chunk(Some(""), false, Some(finish)),
                    };
                    s.ready.push_back(sse(&last));
                    if s.meta.include_usage {
                        s.ready
                            .push_back(sse(&s.meta.usage_chunk(completion_tokens)));
                    }
                    s.ready.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    s.over = true;
                }
                Some(Out::Fail(e)) => {
                    s.ready.push_back(sse(&e.body()));
                    s.over = true;
                }
                None => {
                    let e = ApiError::server("the generation ended without a result");
                    s.ready.push_back(sse(&e.body()));
                    s.over = true;
                }
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}
