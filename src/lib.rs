//! flashlm: LLM inference with weights and KV cache on flash, streamed to the GPU through wgpu.
//!
//! A token's path: [`cli`] parses the command, [`engine`] runs the per-token schedule, which
//! drives [`kernels`] (typed wrappers over `shaders/*.wgsl`) on the [`gpu`] context, reading
//! weights parsed by [`gguf`] through [`flash`]. [`model`] holds the config, the tokenizer and the
//! CPU reference forward pass that the tests use as an oracle.

pub mod bench;
pub mod cli;
pub mod engine;
pub mod eval;
pub mod flash;
pub mod gguf;
pub mod gpu;
pub mod kernels;
pub mod kv;
pub mod model;
pub mod paths;
pub mod plan;
pub mod sampling;
pub mod serve;
