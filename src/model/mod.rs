//! The model: config from GGUF metadata, tokenizer, chat template, and the CPU reference
//! forward pass (the tests' oracle).

pub mod chat;
pub mod config;
pub mod reference;
pub mod synthetic;
pub mod tokenizer;
