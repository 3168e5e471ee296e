//! The model: config from GGUF metadata, tokenizer, chat template, and the CPU reference
//! forward pass (the tests' oracle).

pub mod arch;
pub mod chat;
pub mod config;
pub mod reference;
pub mod rope;
pub mod synthetic;
pub mod synthetic_arch;
pub mod tensors;
pub mod tokenizer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::gguf::GgufFile;

/// A loaded model: file, config and tokenizer.
pub struct LoadedModel {
    pub gguf: Arc<GgufFile>,
    pub cfg: config::ModelConfig,
    pub tokenizer: tokenizer::Tokenizer,
    pub path: PathBuf,
}

/// A model file that could not be loaded, with its path.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct LoadError {
    pub path: PathBuf,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// Open `path`, read its config and tokenizer.
pub fn load_model(path: &Path) -> Result<LoadedModel, LoadError> {
    let err = |e: Box<dyn std::error::Error + Send + Sync>| LoadError {
        path: path.to_path_buf(),
        source: e,
    };
    let gguf = GgufFile::open(path).map_err(|e| err(e.into()))?;
    let cfg = config::ModelConfig::from_gguf(&gguf).map_err(|e| err(e.into()))?;
    let tokenizer = tokenizer::Tokenizer::from_gguf(&gguf).map_err(|e| err(e.into()))?;
    Ok(LoadedModel {
        gguf: Arc::new(gguf),
        cfg,
        tokenizer,
        path: path.to_path_buf(),
    })
}
