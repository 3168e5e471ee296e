//! `flashlm serve` through the official `openai` Python client (tests/serve/openai_client.py):
//! chat, completions, streaming, stop sequences, seeds, and the client's exception classes for
//! errors. Skipped with a note when python3 or the `openai` package is missing, except under
//! CI (scripts/test.sh installs it).
mod common;
#[path = "serve/harness.rs"]
mod harness;

use std::process::Command;

/// The Python interpreter with the `openai` package, or None (with a note) outside CI.
fn python_with_openai() -> Option<String> {
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    if common::in_ci() {
        panic!("CI=true but `{py} -c 'import openai'` fails: scripts/test.sh installs it");
    }
    eprintln!("skipping: the `openai` Python package is not installed (pip install openai)");
    None
}

#[test]
fn the_openai_python_client_works_against_the_server() {
    if common::gpu().is_none() {
        return;
    }
    let Some(py) = python_with_openai() else {
        return;
    };
    let dir = harness::scratch("openai");
    let model = harness::model(&dir);
    let mut server = harness::Server::start(
        &model,
        &["--api-key", "test-key", "--queue", "0", "--parallel", "1"],
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve/openai_client.py");
    let out = Command::new(py)
        .arg(script)
        .arg(server.url())
        .arg("test-key")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "the openai client checks failed:\n{stderr}"
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    assert!(server.alive());
}
