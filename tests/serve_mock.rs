//! The HTTP layer in-process over a scripted [`Backend`] (no GPU): 503 while loading, the
//! request time limit, cancellation when a client goes away, stop sequences over token
//! boundaries, and the queue's 429.
#[path = "serve/harness.rs"]
mod harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flashlm::model::chat::ChatTemplate;
use flashlm::model::load_model;
use flashlm::serve::{
    AppState, Backend, BackendMetrics, Busy, Finish, GenEvent, GenRequest, ServeConfig, ServedModel,
};
use serde_json::json;

/// Emits `ids` over and over, one every `delay`, up to `max_tokens`; counts the requests that
/// ended by cancellation.
struct Scripted {
    ids: Vec<u32>,
    delay: Duration,
    running: Arc<AtomicUsize>,
    cancelled: Arc<AtomicUsize>,
    requests: Mutex<Vec<Arc<AtomicBool>>>,
}

impl Backend for Scripted {
    fn submit(&self, req: GenRequest) -> Result<Receiver<GenEvent>, Busy> {
        if self.running.load(Ordering::Acquire) >= 1 {
            return Err(Busy { queued: 0 });
        }
        self.running.fetch_add(1, Ordering::AcqRel);
        self.requests.lock().unwrap().push(req.cancel.clone());
        let (tx, rx) = channel();
        let (ids, delay, running, cancelled) = (
            self.ids.clone(),
            self.delay,
            self.running.clone(),
            self.cancelled.clone(),
        );
        std::thread::spawn(move || {
            let mut finish = Finish::Length;
            for &id in ids.iter().cycle().take(req.max_tokens) {
                std::thread::sleep(delay);
                if req.cancel.load(Ordering::Acquire) || tx.send(GenEvent::Token(id)).is_err() {
                    cancelled.fetch_add(1, Ordering::AcqRel);
                    finish = Finish::Cancelled;
                    break;
                }
            }
            running.fetch_sub(1, Ordering::AcqRel);
            let _ = tx.send(GenEvent::Done { finish });
        });
        Ok(rx)
    }
    fn metrics(&self) -> BackendMetrics {
        BackendMetrics {
            running: self.running.load(Ordering::Acquire),
            capacity: 1,
            ..Default::default()
        }
    }
    fn max_ctx(&self) -> usize {
        harness::CTX
    }
}

struct InProcess {
    addr: std::net::SocketAddr,
    state: Arc<AppState>,
    _rt: tokio::runtime::Runtime,
}

fn start(config: ServeConfig) -> InProcess {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let state = AppState::new(config);
    rt.spawn(flashlm::serve::serve(
        listener,
        state.clone(),
        std::future::pending(),
    ));
    InProcess {
        addr,
        state,
        _rt: rt,
    }
}

fn request(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> harness::Response {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    harness::Response::parse(&raw).unwrap()
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting: {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_http_layer_over_a_scripted_backend() {
    let dir = harness::scratch("mock");
    let model = Arc::new(load_model(&harness::model(&dir)).unwrap());
    let srv = start(ServeConfig {
        timeout: Duration::from_secs(3),
        ..Default::default()
    });
    let a = srv.addr;

    // Loading: 503 with an error body everywhere but /metrics and the page.
    let r = request(a, "GET", "/health", "");
    assert_eq!(r.expect_error(503)["code"], "model_loading");
    request(a, "GET", "/v1/models", "").expect_error(503);
    request(a, "POST", "/v1/completions", r#"{"prompt": "x"}"#).expect_error(503);
    let m = request(a, "GET", "/metrics", "");
    assert_eq!(m.status, 200);
    assert!(m.text().contains("flashlm_model_ready 0"));
    assert_eq!(request(a, "GET", "/", "").status, 200);

    let text = "Hello, world! END of it";
    let tk = &model.tokenizer;
    let ids: Vec<u32> = text
        .bytes()
        .map(|b| tk.encode(&(b as char).to_string(), false)[0])
        .collect();
    let cancelled = Arc::new(AtomicUsize::new(0));
    let backend = Arc::new(Scripted {
        ids,
        delay: Duration::from_millis(30),
        running: Arc::new(AtomicUsize::new(0)),
        cancelled: cancelled.clone(),
        requests: Mutex::new(Vec::new()),
    });
    srv.state.set_ready(ServedModel {
        backend: backend.clone(),
        model: model.clone(),
        template: ChatTemplate::from_gguf(&model.gguf).ok(),
        id: "scripted".into(),
        created: 0,
    });
    assert_eq!(request(a, "GET", "/health", "").status, 200);

    // Whole text, and a stop sequence spread over several tokens.
    let r = request(
        a,
        "POST",
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 13}"#,
    );
    assert_eq!(r.json()["choices"][0]["text"], "Hello, world!");
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");
    let r = request(
        a,
        "POST",
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 23, "stop": ["xyz", "END"]}"#,
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], "Hello, world! ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // The stop freed the sequence: the backend saw the cancel.
    wait_until("the stop cancels", || {
        cancelled.load(Ordering::Acquire) == 1
    });

    // Over the time limit: 504, and the sequence is cancelled.
    let r = request(
        a,
        "POST",
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 230}"#,
    );
    assert_eq!(r.expect_error(504)["code"], "timeout");
    wait_until("the timeout cancels", || {
        cancelled.load(Ordering::Acquire) == 2
    });
    // Streaming past the limit: an error event ends the stream.
    let r = request(
        a,
        "POST",
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 230, "stream": true}"#,
    );
    assert_eq!(r.status, 200);
    let last = r.events().last().cloned().unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&last).unwrap()["error"]["code"],
        "timeout"
    );
    wait_until("the streamed timeout cancels", || {
        cancelled.load(Ordering::Acquire) == 3
    });

    // A client that disconnects mid-stream: cancelled within a token or two.
    let body =
        json!({"messages": [{"role": "user", "content": "x"}], "stream": true, "max_tokens": 200})
            .to_string();
    let mut c = TcpStream::connect(a).unwrap();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = [0u8; 2048];
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("\"content\":\"H\"") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    // The role delta came first.
    let s = String::from_utf8_lossy(&got);
    assert!(s.find("\"role\":\"assistant\"").unwrap() < s.find("\"content\":\"H\"").unwrap());
    let t = Instant::now();
    drop(c);
    wait_until("the disconnect cancels", || {
        cancelled.load(Ordering::Acquire) == 4
    });
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());

    // A client that gives up on a whole (not streamed) answer: cancelled too.
    let body = r#"{"prompt": "x", "max_tokens": 200}"#;
    let mut c = TcpStream::connect(a).unwrap();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    wait_until("the request runs", || {
        backend.running.load(Ordering::Acquire) == 1
    });
    let t = Instant::now();
    drop(c);
    wait_until("the hang-up cancels", || {
        cancelled.load(Ordering::Acquire) == 5
    });
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());

    // While one request runs, the scripted backend is full: 429.
    let a2 = a;
    let long = std::thread::spawn(move || {
        request(
            a2,
            "POST",
            "/v1/completions",
            r#"{"prompt": "x", "max_tokens": 10}"#,
        )
    });
    wait_until("the long request runs", || {
        backend.running.load(Ordering::Acquire) == 1
    });
    let r = request(
        a,
        "POST",
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 1}"#,
    );
    assert_eq!(r.expect_error(429)["type"], "rate_limit_error");
    assert_eq!(
        long.join().unwrap().json()["choices"][0]["text"],
        "Hello, wor"
    );
    let m = request(a, "GET", "/metrics", "").text();
    assert!(
        m.contains("flashlm_requests_total{endpoint=\"/v1/completions\",status=\"504\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("flashlm_requests_total{endpoint=\"/v1/completions\",status=\"429\"} 1"),
        "{m}"
    );
    // The scripted backend drafts nothing: no acceptance figure is made up.
    assert!(!m.contains("draft_acceptance"), "{m}");
}
