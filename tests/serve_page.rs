//! The chat page at `/` in headless Chromium (driven by tests/serve/page_check.py): a message
//! sent on load (`?q=`) streams its reply into the page, and the reply is the one the API gives
//! for the same conversation. Skipped
//! with a note when Chromium is absent, except under CI (scripts/test.sh installs it).
mod common;
#[path = "serve/harness.rs"]
mod harness;

use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| {
            std::env::var_os("PATH")
                .map(|p| {
                    std::env::split_paths(&p)
                        .map(|d| d.join(name))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
        .find(|p| p.is_file());
    if found.is_none() {
        if common::in_ci() {
            panic!("CI=true but chromium is not installed: scripts/test.sh installs it");
        }
        eprintln!("skipping: chromium is not installed (apt-get install chromium)");
    }
    found
}

#[test]
fn the_chat_page_streams_a_reply_into_the_dom() {
    if common::gpu().is_none() {
        return;
    }
    let Some(chrome) = chromium() else {
        return;
    };
    let dir = harness::scratch("page");
    let model = harness::model(&dir);
    let server = harness::Server::start(&model, &[]);
    let page = server.request("GET", "/", &[], b"");
    assert_eq!(page.status, 200);
    assert!(
        page.header("content-type")
            .unwrap()
            .starts_with("text/html")
    );
    // What the API answers for the conversation the page will send.
    let want = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hello there"}], "temperature": 0,
                "max_tokens": 12}),
    );
    let want = want.json()["choices"][0].clone();
    // Chromium, driven over the DevTools protocol, loads the page and polls it until the
    // scripted message has its answer.
    let profile = dir.join("chromium-profile");
    let url = format!(
        "{}/?q=hello%20there&temperature=0&max_tokens=12",
        server.url()
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve/page_check.py");
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(py)
        .arg(script)
        .arg(&chrome)
        .arg(&url)
        .arg(&profile)
        .arg("120")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the page gave no answer: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    let got = &seen["result"];
    assert_eq!(got["ok"], true, "{seen}");
    assert_eq!(
        got["text"], want["message"]["content"],
        "page reply vs API reply"
    );
    assert_eq!(got["finish"], want["finish_reason"]);
    assert!(
        got["chunks"].as_u64().unwrap() > 1,
        "the reply came in one piece: {got}"
    );
    // The conversation on the page: the message sent, the reply shown, marked done.
    assert_eq!(seen["user"], json!(["hello there"]));
    assert_eq!(seen["reply"], want["message"]["content"]);
    assert_eq!(seen["state"], ",done");
}
