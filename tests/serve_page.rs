//! The chat page at `/` in headless Chromium: a message sent on load (`?q=`) streams its reply
//! into the page, and the reply is the one the API gives for the same conversation. Skipped
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

/// Undo the escapes of HTML text serialization.
fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
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
    let profile = dir.join("chromium-profile");
    let url = format!(
        "{}/?q=hello%20there&temperature=0&max_tokens=12",
        server.url()
    );
    let out = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            "--virtual-time-budget=60000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(&url)
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The page writes the outcome into <pre id="result">.
    let result = dom
        .split("<pre id=\"result\"")
        .nth(1)
        .and_then(|r| r.split_once('>'))
        .and_then(|(_, r)| r.split_once("</pre>"))
        .map(|(r, _)| unescape(r))
        .unwrap_or_else(|| panic!("no result in the page:\n{dom}"));
    let got: Value = serde_json::from_str(&result).unwrap();
    assert_eq!(got["ok"], true, "{got}");
    assert_eq!(
        got["text"], want["message"]["content"],
        "page reply vs API reply"
    );
    assert_eq!(got["finish"], want["finish_reason"]);
    assert!(
        got["chunks"].as_u64().unwrap() > 1,
        "the reply came in one piece: {got}"
    );
    // The reply is in the conversation, marked done.
    assert!(dom.contains("data-state=\"done\""), "{dom}");
    assert!(
        dom.contains("<span class=\"content\">hello there</span>"),
        "{dom}"
    );
}
