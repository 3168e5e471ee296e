//! A plain run on a headless machine prints nothing from the graphics stack on stderr.
mod common;

use std::process::Command;

use flashlm::gguf::GgmlType;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};

#[test]
fn headless_run_prints_no_display_errors() {
    if common::gpu().is_none() {
        return;
    }
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("gpu-quiet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("tiny.gguf");
    std::fs::write(
        &model,
        synthetic_llama(&SyntheticSpec::tiny(GgmlType::Q8_0), 3),
    )
    .unwrap();
    // As on a server: no display, no session runtime directory.
    let out = Command::new(env!("CARGO_BIN_EXE_flashlm"))
        .args(["run", "-p", "hi", "-n", "2", "-m"])
        .arg(&model)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("DISPLAY")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("XDG_RUNTIME_DIR"), "{err}");
    assert!(!err.to_lowercase().contains("error"), "{err}");
}
