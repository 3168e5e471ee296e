//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// True when running under CI (`CI=true`): missing prerequisites fail instead of skipping.
pub fn in_ci() -> bool {
    std::env::var("CI").map(|v| v == "true" || v == "1").unwrap_or(false)
}

/// The real default model, or `None` (with a note) when it is absent outside CI.
/// Under CI a missing model fails the test.
pub fn model_path() -> Option<PathBuf> {
    let p = flashlm::paths::default_model_path();
    if p.is_file() {
        return Some(p);
    }
    if in_ci() {
        panic!("CI=true but {}", flashlm::paths::how_to_get_model());
    }
    eprintln!("skipping: {}", flashlm::paths::how_to_get_model());
    None
}
