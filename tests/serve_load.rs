//! A bounded load test on loopback: 200 greedy requests at concurrency 8 against one engine
//! holding four sequences that share passes (with lookup drafts and the prefix cache);
//! each answer must equal the answer to the same request sent alone (nothing lost, cut or mixed
//! up between requests), streamed or not.
mod common;
#[path = "serve/harness.rs"]
mod harness;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::Server;
use serde_json::{Value, json};

const REQUESTS: usize = 200;
const CONCURRENCY: usize = 8;
const DISTINCT: usize = 20;
/// The whole run must finish within this.
const LIMIT: Duration = Duration::from_secs(600);

/// Request `i` of the distinct set: completions and chats with different lengths and limits.
fn request(i: usize) -> (&'static str, Value) {
    let max_tokens = 4 + (i * 7) % 21;
    if i.is_multiple_of(2) {
        let prompt = format!(
            "Item {i}: the {} of",
            ["cat", "sea", "moon", "tree", "road"][i % 5]
        );
        (
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}),
        )
    } else {
        let msg = format!("Question {i}: {}?", "why ".repeat(1 + i % 4));
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": msg}], "max_tokens": max_tokens,
                   "temperature": 0}),
        )
    }
}

/// (text, finish_reason, completion_tokens) of a response, whole or streamed.
fn outcome(path: &str, r: &harness::Response, stream: bool) -> (String, String, u64) {
    assert_eq!(r.status, 200, "{}", r.text());
    let chat = path.contains("chat");
    if !stream {
        let v = r.json();
        let c = &v["choices"][0];
        let text = if chat {
            &c["message"]["content"]
        } else {
            &c["text"]
        };
        return (
            text.as_str().unwrap().to_string(),
            c["finish_reason"].as_str().unwrap().to_string(),
            v["usage"]["completion_tokens"].as_u64().unwrap(),
        );
    }
    let events = r.events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.text()
    );
    let (mut text, mut finish, mut tokens) = (String::new(), String::new(), 0);
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        assert!(v.get("error").is_none(), "{e}");
        if let Some(u) = v.get("usage") {
            tokens = u["completion_tokens"].as_u64().unwrap();
        }
        let Some(c) = v["choices"].get(0) else {
            continue;
        };
        let piece = if chat {
            &c["delta"]["content"]
        } else {
            &c["text"]
        };
        text.push_str(piece.as_str().unwrap_or(""));
        if let Some(f) = c["finish_reason"].as_str() {
            assert!(finish.is_empty(), "two finish reasons");
            finish = f.to_string();
        }
    }
    (text, finish, tokens)
}

fn send(s_addr: &Server, i: usize, stream: bool) -> (String, String, u64) {
    let (path, mut body) = request(i);
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let r = s_addr.post_json(path, &body);
    outcome(path, &r, stream)
}

#[test]
fn two_hundred_concurrent_greedy_requests_match_their_solo_answers() {
    if common::gpu().is_none() {
        return;
    }
    let dir = harness::scratch("load");
    let model = harness::model(&dir);
    let server = Server::start(
        &model,
        &["--parallel", "4", "--queue", "16", "--draft", "lookup"],
    );
    let t0 = Instant::now();
    // Alone: one request at a time.
    let solo: Vec<_> = (0..DISTINCT).map(|i| send(&server, i, false)).collect();
    for (i, (text, finish, n)) in solo.iter().enumerate() {
        let max = request(i).1["max_tokens"].as_u64().unwrap();
        assert!(*n >= 1 && *n <= max, "request {i}: {n} tokens");
        assert!(finish == "length" || finish == "stop", "{finish}");
        assert!(
            finish != "length" || *n == max,
            "request {i}: length finish after {n} of {max}"
        );
        let _ = text;
    }
    // An oracle outside the server: `flashlm run` (a fresh engine, greedy) completes the same
    // raw prompts to the same text.
    for i in [0, 2, 4] {
        let body = request(i).1;
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_flashlm"))
            .args(["run", "--io", "mmap", "--temp", "0", "-m"])
            .arg(&model)
            .args(["-p", body["prompt"].as_str().unwrap(), "-n"])
            .arg(body["max_tokens"].to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.strip_suffix('\n'),
            Some(solo[i].0.as_str()),
            "prompt {i}"
        );
    }
    // Under load: 8 clients take the next request number until 200 are done.
    let server = Arc::new(server);
    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (server, next, failures, done, solo) = (
                server.clone(),
                next.clone(),
                failures.clone(),
                done.clone(),
                solo.clone(),
            );
            std::thread::spawn(move || {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= REQUESTS || t0.elapsed() > LIMIT {
                        return;
                    }
                    let i = k % DISTINCT;
                    let stream = k % 3 == 0;
                    let got = send(&server, i, stream);
                    if got != solo[i] {
                        failures.lock().unwrap().push(format!(
                            "request {k} (prompt {i}, stream {stream}): {got:?} != alone {:?}",
                            solo[i]
                        ));
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let f = failures.lock().unwrap();
    assert!(f.is_empty(), "{} mismatches:\n{}", f.len(), f.join("\n"));
    assert_eq!(
        done.load(Ordering::Relaxed),
        REQUESTS,
        "not every request was answered in time"
    );
    eprintln!(
        "{REQUESTS} requests at concurrency {CONCURRENCY} in {:?}",
        t0.elapsed()
    );
    let m = server.request("GET", "/metrics", &[], b"").text();
    assert!(m.lines().any(|l| l == "flashlm_queue_length 0"), "{m}");
    assert!(m.lines().any(|l| l == "flashlm_running_sequences 0"), "{m}");
    assert!(
        m.lines().any(|l| l
            == format!(
                "flashlm_requests_total{{endpoint=\"/v1/completions\",status=\"200\"}} {}",
                (REQUESTS + DISTINCT) / 2
            )),
        "{m}"
    );
    // Drafting and the prefix cache report what they did (repeated prompts share pages).
    assert!(
        m.lines()
            .any(|l| l.starts_with("flashlm_draft_acceptance_ratio ")),
        "{m}"
    );
    let cached = m
        .lines()
        .find_map(|l| l.strip_prefix("flashlm_prefix_cache_tokens_total "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(cached.is_some_and(|c| c > 0), "{m}");
    let mut server = Arc::try_unwrap(server).ok().unwrap();
    assert!(server.alive());
}
