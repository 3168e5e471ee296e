//! A small GGUF writer: builds valid files for tests, tiny synthetic models and tools.

use super::{GgmlType, MetaValue};

/// Builds a GGUF v3 file in memory.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
    alignment: Option<u64>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }
    /// Add a metadata pair (`general.alignment` given here is honoured when laying out data).
    pub fn meta(&mut self, key: &str, value: MetaValue) -> &mut Self {
        let _ = (key, value);
        todo!()
    }
    /// Add a tensor with GGUF dims (`dims[0]` contiguous) and its stored bytes.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        let _ = (name, dims, ty, data);
        todo!()
    }
    /// Serialize: header, metadata, tensor infos, padding, aligned data.
    pub fn to_bytes(&self) -> Vec<u8> {
        todo!()
    }
}
