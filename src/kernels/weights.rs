//! Weight matrices on the device: their layout in parts of whole rows (each fitting one storage
//! binding and one dispatch grid), uploads and slots, and the pieces a fused matrix's
//! sub-matrices are computed in.

use std::sync::Arc;

use crate::gguf::GgmlType;
use crate::gpu::{GpuBuffer, GpuContext};

use super::{KernelError, MAX_WORKGROUPS, MM_ROWS_PER_WG};

/// A weight matrix on the device, stored as in the file, split into parts of whole rows so each
/// part fits one storage binding and one dispatch grid.
pub struct GpuWeight {
    pub ty: GgmlType,
    pub rows: u32,
    pub cols: u32,
    pub row_bytes: u32,
    pub parts: Vec<Part>,
}

/// Rows [r0, r0 + n) of a weight matrix, stored in `buf` from byte `offset`; a buffer may be
/// shared (a layer slot holds every matrix of whichever streamed layer is in it).
#[derive(Clone)]
pub struct Part {
    pub buf: Arc<GpuBuffer>,
    pub offset: u64,
    pub r0: u32,
    pub n: u32,
}

impl GpuWeight {
    /// Part `i`'s rows bound from where they start in its buffer to the buffer's end (every
    /// buffer a part lives in fits one binding: see `plan::slots`).
    pub fn bind(&self, i: usize) -> super::BufAt<'_> {
        let p = &self.parts[i];
        super::BufAt {
            buffer: &p.buf,
            offset: p.offset,
            size: None,
        }
    }
}

impl GpuWeight {
    pub fn bytes(&self) -> u64 {
        self.rows as u64 * self.row_bytes as u64
    }
}

/// Bytes per stored row of a `cols`-wide matrix of type `ty`.
pub fn row_bytes(ty: GgmlType, cols: u32) -> Option<u32> {
    let b = ty.bytes_for(cols as u64)?;
    u32::try_from(b).ok()
}

/// How a weight matrix is laid out on the device: its row size and its parts of whole rows,
/// each fitting one storage binding and one dispatch grid. The one place rows are split: the
/// execution plan sizes memory with it, uploads and layer slots allocate with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightLayout {
    pub ty: GgmlType,
    pub rows: u32,
    pub cols: u32,
    pub row_bytes: u32,
    /// (first row, rows) of each part.
    pub parts: Vec<(u32, u32)>,
}

impl WeightLayout {
    /// Split `rows` x `cols` of type `ty` under a binding limit of `max_binding` bytes.
    pub fn new(
        label: &str,
        ty: GgmlType,
        rows: u32,
        cols: u32,
        max_binding: u64,
    ) -> Result<Self, KernelError> {
        let shape = |problem: String| KernelError::Shape {
            kernel: "weights",
            problem,
        };
        if !u64::from(cols).is_multiple_of(ty.block_len()) {
            return Err(shape(format!(
                "{label}: {cols} columns is not a multiple of the {ty} block length {}",
                ty.block_len()
            )));
        }
        let rb =
            row_bytes(ty, cols).ok_or_else(|| shape(format!("{label}: row size overflows")))?;
        let max_bind = max_binding.min(u32::MAX as u64);
        if (rb as u64) + 16 > max_bind {
            return Err(shape(format!(
                "{label}: one row of {rb} bytes exceeds the binding limit {max_bind}"
            )));
        }
        // Keep a little slack for the 2-byte over-reads of unaligned block formats.
        let rows_fit = ((max_bind.saturating_sub(16)) / rb.max(1) as u64).max(1);
        let rows_per_part = rows_fit.min((MAX_WORKGROUPS * MM_ROWS_PER_WG) as u64) as u32;
        let mut parts = Vec::new();
        let mut r0 = 0u32;
        while r0 < rows {
            let n = rows_per_part.min(rows - r0);
            parts.push((r0, n));
            r0 += n;
        }
        Ok(Self {
            ty,
            rows,
            cols,
            row_bytes: rb,
            parts,
        })
    }

    /// Bytes of part `i` as allocated (16-byte rounded, as the allocator rounds).
    pub fn part_bytes(&self, i: usize) -> u64 {
        let n = self.parts.get(i).map(|p| p.1).unwrap_or(0) as u64;
        round16(n * self.row_bytes as u64)
    }

    /// Device bytes of all parts.
    pub fn device_bytes(&self) -> u64 {
        (0..self.parts.len()).map(|i| self.part_bytes(i)).sum()
    }

    /// Empty device buffers for the parts (a layer slot filled by uploads).
    pub fn alloc(
        &self,
        ctx: &GpuContext,
        label: &str,
        mappable: bool,
    ) -> Result<GpuWeight, KernelError> {
        let mut parts = Vec::with_capacity(self.parts.len());
        for (i, &(r0, n)) in self.parts.iter().enumerate() {
            let name = format!("{label}[{r0}..]");
            let buf = if mappable {
                ctx.mappable_storage(&name, self.part_bytes(i))?
            } else {
                ctx.storage(&name, self.part_bytes(i))?
            };
            parts.push(Part {
                buf: Arc::new(buf),
                offset: 0,
                r0,
                n,
            });
        }
        Ok(self.with_parts(parts))
    }

    /// Device buffers holding `data` (the stored bytes of all rows).
    pub fn upload(
        &self,
        ctx: &GpuContext,
        label: &str,
        data: &[u8],
    ) -> Result<GpuWeight, KernelError> {
        self.check_len(label, data)?;
        let rb = self.row_bytes as usize;
        let mut parts = Vec::with_capacity(self.parts.len());
        for &(r0, n) in &self.parts {
            let a = r0 as usize * rb;
            let b = a + n as usize * rb;
            parts.push(Part {
                buf: Arc::new(ctx.storage_with(&format!("{label}[{r0}..]"), &data[a..b])?),
                offset: 0,
                r0,
                n,
            });
        }
        Ok(self.with_parts(parts))
    }

    /// The weight holding `data`, as [`Self::upload`] makes it, but at byte `offset` of `buf`,
    /// a buffer it shares (see [`packed_offsets`]); one part only (else [`Self::placed`]'s
    /// error).
    pub fn upload_into(
        &self,
        ctx: &GpuContext,
        label: &str,
        data: &[u8],
        buf: Arc<GpuBuffer>,
        offset: u64,
    ) -> Result<GpuWeight, KernelError> {
        self.check_len(label, data)?;
        let w = self.placed(label, vec![(buf.clone(), offset)])?;
        ctx.write(&buf.buffer, offset, data);
        Ok(w)
    }

    /// `data` must be the stored bytes of all rows.
    fn check_len(&self, label: &str, data: &[u8]) -> Result<(), KernelError> {
        let expected = self.rows as u64 * self.row_bytes as u64;
        if data.len() as u64 != expected {
            return Err(KernelError::Shape {
                kernel: "upload_weight",
                problem: format!("{label}: {} bytes given, {expected} expected", data.len()),
            });
        }
        Ok(())
    }

    /// This layout over existing buffers (a layer slot with room for every layer that streams
    /// through it): part `i` lives in `at[i].0` from byte `at[i].1`.
    pub fn placed(
        &self,
        label: &str,
        at: Vec<(Arc<GpuBuffer>, u64)>,
    ) -> Result<GpuWeight, KernelError> {
        if at.len() != self.parts.len() {
            return Err(KernelError::Shape {
                kernel: "weights",
                problem: format!(
                    "{label}: {} places for {} parts",
                    at.len(),
                    self.parts.len()
                ),
            });
        }
        let mut parts = Vec::with_capacity(self.parts.len());
        for (i, ((r0, n), (b, offset))) in self.parts.iter().copied().zip(at).enumerate() {
            if offset
                .checked_add(self.part_bytes(i))
                .is_none_or(|e| e > b.size)
            {
                return Err(KernelError::Shape {
                    kernel: "weights",
                    problem: format!("{label}: part {i} does not fit its slot"),
                });
            }
            parts.push(Part {
                buf: b,
                offset,
                r0,
                n,
            });
        }
        Ok(self.with_parts(parts))
    }

    fn with_parts(&self, parts: Vec<Part>) -> GpuWeight {
        GpuWeight {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            row_bytes: self.row_bytes,
            parts,
        }
    }
}

/// Pieces of rows `[lo, hi)` of a matrix split into `parts` ((first row, rows) each): for each,
/// (part index, first row within the part, rows). A fused matrix's sub-matrix (Q, K or V of
/// `attn_qkv`) is computed one piece per dispatch.
pub fn row_pieces(parts: &[(u32, u32)], lo: u32, hi: u32) -> Vec<(usize, u32, u32)> {
    let mut out = Vec::new();
    for (i, &(r0, n)) in parts.iter().enumerate() {
        let a = lo.max(r0);
        let b = hi.min(r0.saturating_add(n));
        if a < b {
            out.push((i, a - r0, b - a));
        }
    }
    out
}

/// One dispatch of a gated product whose gate rows `[0, n)` and up rows `[n, 2n)` share one
/// matrix split into parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairedPiece {
    /// Output rows `[out_row, out_row + rows)`.
    pub out_row: u32,
    pub rows: u32,
    /// Part and first row within it of the gate rows, and of the up rows.
    pub gate: (usize, u32),
    pub up: (usize, u32),
}

/// The dispatches of a gated product over a matrix of `2 n` rows split into `parts`: output rows
/// cut wherever a gate row or its up row crosses a part boundary.
pub fn paired_pieces(parts: &[(u32, u32)], n: u32) -> Vec<PairedPiece> {
    let mut cuts = vec![0, n];
    for &(r0, _) in parts {
        if r0 > 0 && r0 < n {
            cuts.push(r0);
        }
        if r0 > n && r0 < 2 * n {
            cuts.push(r0 - n);
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    let locate = |r: u32| {
        parts
            .iter()
            .position(|&(r0, k)| r >= r0 && r < r0.saturating_add(k))
            .map(|i| (i, r - parts[i].0))
    };
    cuts.windows(2)
        .filter_map(|w| {
            Some(PairedPiece {
                out_row: w[0],
                rows: w[1] - w[0],
                gate: locate(w[0])?,
                up: locate(w[0] + n)?,
            })
        })
        .collect()
}

fn round16(n: u64) -> u64 {
    n.max(16).div_ceil(16) * 16
}

/// Upload a weight matrix (`rows` x `cols`, stored bytes `data`) as one or more parts.
pub fn upload_weight(
    ctx: &GpuContext,
    label: &str,
    ty: GgmlType,
    rows: u32,
    cols: u32,
    data: &[u8],
) -> Result<GpuWeight, KernelError> {
    WeightLayout::new(label, ty, rows, cols, ctx.max_binding())?.upload(ctx, label, data)
}

/// Byte offsets for the weights of `layouts` side by side in one buffer, and its size, where
/// they can share one: one part each, each part's bytes a multiple of `align` (a binding offset
/// multiple), so that the buffer is exactly what they take apart, and all of it within one
/// binding of `max_binding` bytes. Products can then read several of them from one binding
/// (`matmul_multi`: Q, K and V without a branch per weight).
pub fn packed_offsets(
    layouts: &[WeightLayout],
    align: u64,
    max_binding: u64,
) -> Option<(Vec<u64>, u64)> {
    let mut offsets = Vec::with_capacity(layouts.len());
    let mut total = 0u64;
    for l in layouts {
        let bytes = l.part_bytes(0);
        if l.parts.len() != 1 || align == 0 || !bytes.is_multiple_of(align) {
            return None;
        }
        offsets.push(total);
        total = total.checked_add(bytes)?;
    }
    (!layouts.is_empty() && total <= max_binding).then_some((offsets, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_offsets_only_without_padding_and_within_a_binding() {
        let l = |rows: u32, cols: u32| {
            WeightLayout::new("w", GgmlType::Q4_1, rows, cols, 1 << 20).unwrap()
        };
        // Q4_1 rows of 576 columns are 360 bytes: 576, 192 and 192 rows take 207360, 69120
        // and 69120 bytes, all multiples of 32.
        let qkv = [l(576, 576), l(192, 576), l(192, 576)];
        assert_eq!(
            packed_offsets(&qkv, 32, 1 << 20),
            Some((vec![0, 207_360, 276_480], 345_600))
        );
        // Past the binding: apart.
        assert_eq!(packed_offsets(&qkv, 32, 345_599), None);
        // 3 rows of 64 columns (40 bytes each, 128 rounded): a multiple of 32 but not of 256.
        assert_eq!(
            packed_offsets(&[l(3, 64)], 32, 1 << 20),
            Some((vec![0], 128))
        );
        assert_eq!(packed_offsets(&[l(3, 64)], 256, 1 << 20), None);
        // More than one part (rows past one binding), or nothing: apart.
        let split = WeightLayout::new("w", GgmlType::Q4_1, 4096, 576, 360 * 1024 + 16).unwrap();
        assert!(split.parts.len() > 1);
        assert_eq!(packed_offsets(&[split], 16, u64::MAX), None);
        assert_eq!(packed_offsets(&[], 16, 1 << 20), None);
    }

    #[test]
    fn row_pieces_cover_a_range_once() {
        // Parts of 100, 100 and 88 rows; Q = [0, 96), K = [96, 192), V = [192, 288).
        let parts = [(0u32, 100u32), (100, 100), (200, 88)];
        assert_eq!(row_pieces(&parts, 0, 96), vec![(0, 0, 96)]);
        assert_eq!(row_pieces(&parts, 96, 192), vec![(0, 96, 4), (1, 0, 92)]);
        assert_eq!(row_pieces(&parts, 192, 288), vec![(1, 92, 8), (2, 0, 88)]);
        assert!(row_pieces(&parts, 50, 50).is_empty());
    }

    #[test]
    fn paired_pieces_align_gate_and_up_rows() {
        // 2 x 128 rows in parts of 160 and 96: up row r + 128 crosses at r = 32.
        let parts = [(0u32, 160u32), (160, 96)];
        let p = paired_pieces(&parts, 128);
        assert_eq!(
            p,
            vec![
                PairedPiece {
                    out_row: 0,
                    rows: 32,
                    gate: (0, 0),
                    up: (0, 128)
                },
                PairedPiece {
                    out_row: 32,
                    rows: 96,
                    gate: (0, 32),
                    up: (1, 0)
                },
            ]
        );
        // Every output row once, each gate row r and up row r + n inside their part.
        let parts = [(0u32, 7u32), (7, 7), (14, 7), (21, 5)];
        let p = paired_pieces(&parts, 13);
        assert_eq!(p.iter().map(|x| x.rows).sum::<u32>(), 13);
        for x in &p {
            let inside = |(i, r): (usize, u32)| r + x.rows <= parts[i].1;
            assert!(inside(x.gate) && inside(x.up), "{x:?}");
            assert_eq!(parts[x.gate.0].0 + x.gate.1, x.out_row);
            assert_eq!(parts[x.up.0].0 + x.up.1, x.out_row + 13);
        }
        // One part: one piece.
        assert_eq!(paired_pieces(&[(0, 20)], 10).len(), 1);
    }
}
