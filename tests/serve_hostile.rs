//! `flashlm serve` against hostile and broken clients, over raw TCP: every request gets a clean
//! OpenAI-style error or a correct answer, and the server stays up.
mod common;
#[path = "serve/harness.rs"]
mod harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use harness::{CTX, Server};
use serde_json::json;

fn chat(content: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut v = json!({"model": "tiny", "messages": [{"role": "user", "content": content}]});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn healthy(s: &mut Server) {
    assert!(s.alive(), "the server died");
    assert_eq!(s.request("GET", "/health", &[], b"").status, 200);
}

fn malformed_and_wrong_types(s: &mut Server) {
    let h = [("Content-Type", "application/json")];
    for (body, param) in [
        (&b"{\"messages\": ["[..], None),
        (b"not json at all", None),
        (b"[1, 2, 3]", None),
        (b"", None),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": -5}", Some("max_tokens")),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 99999999999999999999999}", Some("max_tokens")),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": \"10\"}", Some("max_tokens")),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": -1}", Some("temperature")),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"top_p\": 0}", Some("top_p")),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"top_p\": 1.5}", Some("top_p")),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 3}", Some("n")),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"frobnicate\": true}", Some("frobnicate")),
        (b"{\"messages\": \"hi\"}", Some("messages")),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\xfd\"}]}", None),
    ] {
        let r = s.request("POST", "/v1/chat/completions", &h, body);
        let e = r.expect_error(400);
        assert_eq!(e["type"], "invalid_request_error");
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{}", String::from_utf8_lossy(body));
        }
    }
    let r = s.request("POST", "/v1/completions", &h, br#"{"prompt": ["a", "b"]}"#);
    let e = r.expect_error(400);
    assert!(e["message"].as_str().unwrap().contains("one prompt"), "{e}");
    // A body not declared as JSON (what a cross-site form or text post would send).
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let hs: Vec<(&str, &str)> = ct.map(|c| ("Content-Type", c)).into_iter().collect();
        let r = s.request("POST", "/v1/completions", &hs, br#"{"prompt": "a"}"#);
        assert_eq!(r.expect_error(415)["code"], "unsupported_media_type");
    }
    let r = s.request(
        "POST",
        "/v1/completions",
        &[("Content-Type", "Application/JSON; charset=utf-8")],
        br#"{"prompt": "a", "max_tokens": 1}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Unknown paths and methods.
    s.request("GET", "/v1/nothing", &[], b"").expect_error(404);
    s.request("GET", "/v1/chat/completions", &[], b"")
        .expect_error(405);
}

fn huge_bodies(s: &mut Server) {
    // Declared too large: refused before the body is read.
    let big = vec![b' '; 2 << 20];
    let r = s.request(
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        &big,
    );
    r.expect_error(413);
    // Chunked, with no length given: cut at the limit.
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        .unwrap();
    let chunk = vec![b'a'; 64 << 10];
    for _ in 0..40 {
        let head = format!("{:x}\r\n", chunk.len());
        if c.write_all(head.as_bytes()).is_err()
            || c.write_all(&chunk).is_err()
            || c.write_all(b"\r\n").is_err()
        {
            break;
        }
    }
    let _ = c.write_all(b"0\r\n\r\n");
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    let r = harness::Response::parse(&raw).unwrap();
    r.expect_error(413);
}

fn context_limits(s: &mut Server) {
    // A prompt longer than the context (each letter-space pair is at least one token).
    let long = "q z ".repeat(CTX);
    let r = s.post_json("/v1/completions", &json!({"prompt": long, "max_tokens": 1}));
    let e = r.expect_error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    // A prompt that fits, but not with max_tokens.
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": CTX}),
    );
    assert_eq!(r.expect_error(400)["code"], "context_length_exceeded");
    // Token ids outside the vocabulary.
    let r = s.post_json("/v1/completions", &json!({"prompt": [1, 2, 99999]}));
    assert_eq!(r.expect_error(400)["param"], "prompt");
}

/// A client that goes away mid-stream frees its sequence at once: the next request is not
/// kept waiting behind a generation nobody reads.
fn disconnect_mid_stream(s: &mut Server) {
    let body = chat(
        "tell me a long story",
        json!({"stream": true, "max_tokens": 200, "temperature": 0}),
    )
    .to_string();
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read until a few content events arrived, then drop the connection.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.windows(9).filter(|w| w == b"\"content\"").count() < 4 {
        let n = c.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "stream ended early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    drop(c);
    // The sequence is freed within a few tokens: a new request runs promptly and the
    // server reports nothing running once it is answered.
    let t = Instant::now();
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let metrics = s.request("GET", "/metrics", &[], b"").text();
    assert!(
        metrics.lines().any(|l| l == "flashlm_running_sequences 0"),
        "{metrics}"
    );
    let gen_line = metrics
        .lines()
        .find(|l| l.starts_with("flashlm_backend_generated_tokens_total "))
        .unwrap();
    let generated: u64 = gen_line.rsplit(' ').next().unwrap().parse().unwrap();
    // Far fewer than the 200 asked for by the abandoned stream (plus the 2 just now, and
    // earlier requests' few).
    assert!(
        generated < 150,
        "{gen_line}: the abandoned generation ran on"
    );
    eprintln!("after the disconnect, a request took {:?}", t.elapsed());
}

/// 64 connections at once, each a real request: every one is answered 200 or 429, never a
/// hang or a broken response.
fn concurrent_connections(s: &mut Server) {
    let addr = s.addr;
    let handles: Vec<_> = (0..64)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({"prompt": format!("request {i}"), "max_tokens": 4, "temperature": 0})
                    .to_string();
                let mut c = TcpStream::connect(addr).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                write!(
                    c,
                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
                let mut raw = Vec::new();
                c.read_to_end(&mut raw).unwrap();
                harness::Response::parse(&raw).unwrap()
            })
        })
        .collect();
    let (mut ok, mut busy) = (0, 0);
    for h in handles {
        let r = h.join().unwrap();
        match r.status {
            200 => {
                let v = r.json();
                assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 4);
                ok += 1;
            }
            429 => {
                r.expect_error(429);
                assert_eq!(r.header("retry-after"), Some("1"));
                busy += 1;
            }
            other => panic!("status {other}: {}", r.text()),
        }
    }
    eprintln!("64 concurrent connections: {ok} answered, {busy} refused as busy");
    assert!(
        ok > 2,
        "at least the running and queued requests are answered"
    );
}

fn api_key_is_required() {
    let dir = harness::scratch("key");
    let model = harness::model(&dir);
    let mut s = Server::start(&model, &["--api-key", "s3cret"]);
    let body = json!({"prompt": "x", "max_tokens": 1}).to_string();
    let r = s.request("POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(r.expect_error(401)["code"], "invalid_api_key");
    let r = s.request(
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer wrong")],
        body.as_bytes(),
    );
    r.expect_error(401);
    s.request("GET", "/metrics", &[], b"").expect_error(401);
    let r = s.request(
        "POST",
        "/v1/completions",
        &[
            ("Authorization", "Bearer s3cret"),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The page and the health check stay open.
    assert_eq!(s.request("GET", "/", &[], b"").status, 200);
    healthy(&mut s);
}

#[test]
fn hostile_requests_get_clean_errors_and_the_server_stays_up() {
    if common::gpu().is_none() {
        return;
    }
    let dir = harness::scratch("hostile");
    let model = harness::model(&dir);
    let mut s = Server::start(
        &model,
        &["--queue", "2", "--max-body", "1MiB", "--parallel", "1"],
    );
    malformed_and_wrong_types(&mut s);
    healthy(&mut s);
    huge_bodies(&mut s);
    healthy(&mut s);
    context_limits(&mut s);
    healthy(&mut s);
    disconnect_mid_stream(&mut s);
    healthy(&mut s);
    concurrent_connections(&mut s);
    healthy(&mut s);
    // Every refusal was counted by endpoint and status.
    let m = s.request("GET", "/metrics", &[], b"").text();
    for l in [
        "flashlm_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"}",
        "flashlm_requests_total{endpoint=\"/v1/completions\",status=\"413\"}",
        "flashlm_requests_total{endpoint=\"other\",status=\"404\"}",
    ] {
        assert!(m.contains(l), "{l} missing from\n{m}");
    }
    drop(s);
    api_key_is_required();
}
