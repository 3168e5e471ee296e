//! Tensor element types and their block layouts, with reference (de)quantization on the CPU.
//!
//! Block layouts (bytes, little-endian), as ggml stores them:
//! - `Q4_0`: 32 weights in 18 bytes: f16 `d`, 16 bytes of nibbles; w = d * (q - 8).
//!   Byte j holds weight j (low nibble) and weight j + 16 (high nibble).
//! - `Q4_1`: 32 weights in 20 bytes: f16 `d`, f16 `m`, 16 bytes of nibbles; w = d * q + m.
//! - `Q8_0`: 32 weights in 34 bytes: f16 `d`, 32 signed bytes; w = d * q.

/// A ggml tensor type known to the reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q8_0,
}

impl GgmlType {
    /// From the GGUF type id; `Err(Some(name))` for a known but unsupported type, `Err(None)`
    /// for an unknown id.
    pub fn from_id(id: u32) -> Result<Self, Option<&'static str>> {
        let _ = id;
        todo!()
    }
    pub fn id(self) -> u32 {
        todo!()
    }
    pub fn name(self) -> &'static str {
        todo!()
    }
    /// Weights per block (1 for plain float types).
    pub fn block_len(self) -> u64 {
        todo!()
    }
    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        todo!()
    }
    /// Bytes taken by `n` elements (`n` must be a multiple of `block_len`); `None` on overflow.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let _ = n;
        todo!()
    }
}

/// Decode `out.len()` elements from `src` (which holds exactly their blocks).
pub fn dequantize(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    let _ = (ty, src, out);
    todo!()
}

/// Encode values into `ty`'s blocks (reference quantizer, used by tests and tiny test models).
/// `src.len()` must be a multiple of the block length.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Vec<u8> {
    let _ = (ty, src);
    todo!()
}
