//! Layer slots: where a streamed layer's matrix parts sit in a slot's buffers, where a read puts
//! their bytes there, and the output head's chunks when the head streams through the same slots.
//!
//! A slot is one buffer (more only when its parts exceed one binding) holding every matrix part
//! of whichever streamed layer is in it, each part in a region of its own. Where streamed
//! weights are read straight into mapped slots (`in_place`), each region of a part of at least
//! [`SLACK_MIN_PART`] bytes keeps [`SLACK`] of room so that the data can start at the same place
//! within a page as its bytes in the file, with whole pages of room around it: a direct read of
//! the whole pages of the file the part lies in then lands in the slot itself, in one aligned
//! read, with no bounce buffer and no copy. Smaller parts are read through a bounce buffer (the
//! room would cost more than their copy).

use super::{LayerWeights, round16};

/// Bytes of each matrix part a layer slot must hold (per matrix, per part): the largest over
/// the `layers` (their weight types may differ from layer to layer).
pub fn slot_parts(layers: &[LayerWeights]) -> Vec<Vec<u64>> {
    let mut parts: Vec<Vec<u64>> = Vec::new();
    for lw in layers {
        parts.resize(lw.layouts.len().max(parts.len()), Vec::new());
        for (m, lay) in lw.layouts.iter().enumerate() {
            let sp = &mut parts[m];
            sp.resize(lay.parts.len().max(sp.len()), 0);
            for (i, b) in sp.iter_mut().enumerate().take(lay.parts.len()) {
                *b = (*b).max(lay.part_bytes(i));
            }
        }
    }
    parts
}

/// Bytes of the pages file reads are aligned to (direct I/O).
pub const PAGE: u64 = 4096;

/// A head streaming through the layer slots goes in at least this many chunks (where each is
/// still at least [`DEFAULT_HEAD_CHUNK`]): with a chunk or two read ahead, reading the head then
/// overlaps its compute.
pub const MIN_HEAD_CHUNKS: u64 = 4;

/// Room in the region of a part read straight into a mapped slot: a page to place its data as
/// in the file, and a page more so that the whole pages of the file it lies in fit the region
/// whatever the buffer's mapped address.
pub const SLACK: u64 = 2 * PAGE;

/// The least bytes a part needs for room in its region.
pub const SLACK_MIN_PART: u64 = 16 * PAGE;

/// Bytes per output-head chunk when the head streams through chunk slots of its own, unless the
/// caller says otherwise.
pub const DEFAULT_HEAD_CHUNK: u64 = 512 * 1024;

/// One part's room in a slot: buffer, start, size (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub buffer: usize,
    pub start: u64,
    pub size: u64,
}

/// The buffers of one layer slot and the region of each matrix part in them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotLayout {
    /// Bytes of each buffer of a slot.
    pub buffers: Vec<u64>,
    /// Per matrix, per part: its region.
    pub regions: Vec<Vec<Region>>,
    /// Room before the data of each part of at least [`SLACK_MIN_PART`] bytes (and of the output
    /// head's chunks) for placing it as its file offset sits within a page (0: data at the
    /// region start).
    pub slack: u64,
    /// Binding offsets must be multiples of this.
    pub align: u64,
    /// One region for a whole layer: each streamed layer's matrices sit in the slot as they
    /// lie in the file ([`layer_span`]), so that the layer is one read (no `regions`).
    pub span: bool,
}

/// Where layer `lw`'s matrices lie as one run of the file that a slot can take as it is: (file
/// offset, bytes) of the run, when each matrix is one part, every matrix starts at a multiple
/// of the binding alignment `align`, and the run holds little besides them (at most 1/32 more:
/// the layer's norms, say). A layer read in place is then one read instead of one per matrix,
/// split over the reader's threads like any long read (a layer's matrices are a few short
/// reads, most of them on one thread each, and the longest of them bounds the layer).
pub fn layer_span(lw: &LayerWeights, align: u64) -> Option<(u64, u64)> {
    let align = align.max(16);
    let mut start = u64::MAX;
    let mut end = 0u64;
    let mut bytes = 0u64;
    for (t, lay) in lw.files.iter().zip(&lw.layouts) {
        if lay.parts.len() != 1 || !t.offset.is_multiple_of(align) {
            return None;
        }
        start = start.min(t.offset);
        end = end.max(t.offset.checked_add(t.n_bytes)?);
        bytes += t.n_bytes;
    }
    let len = end.checked_sub(start)?;
    (len > 0 && len - bytes.min(len) <= len / 32).then_some((start, len))
}

impl SlotLayout {
    /// Regions for parts of `part_bytes` (per matrix, per part: the largest over the layers
    /// that stream through the slot), packed in order into buffers of at most `cap` bytes (a
    /// region larger than `cap` gets a buffer of its own), each starting at a multiple of the
    /// binding alignment `align` (and, with `slack` for it, of a page).
    pub fn new(part_bytes: &[Vec<u64>], cap: u64, align: u64, slack: u64) -> Self {
        let align = align.max(16);
        let mut buffers: Vec<u64> = Vec::new();
        let mut regions = Vec::with_capacity(part_bytes.len());
        let mut cur = 0u64;
        for parts in part_bytes {
            let mut rs = Vec::with_capacity(parts.len());
            for &b in parts {
                // A region never passes one binding (parts are bound from their offset to the
                // end of their buffer): no room for a part that would.
                let (room, step) = if slack > 0 && b >= SLACK_MIN_PART && round16(b) + slack <= cap
                {
                    (slack, align.max(PAGE))
                } else {
                    (0, align)
                };
                cur = cur.div_ceil(step) * step;
                let size = (round16(b) + room).div_ceil(step) * step;
                if buffers.is_empty() || (cur > 0 && cur + size > cap) {
                    buffers.push(0);
                    cur = 0;
                }
                let i = buffers.len() - 1;
                rs.push(Region {
                    buffer: i,
                    start: cur,
                    size,
                });
                cur += size;
                buffers[i] = cur;
            }
            regions.push(rs);
        }
        Self {
            buffers,
            regions,
            slack,
            align,
            span: false,
        }
    }

    /// A layer slot for `layers`: one buffer a slot where the parts fit one binding of `cap`
    /// bytes; with reads straight into mapped slots (`in_place`), a layer as it lies in the file
    /// where every layer is one run of it ([`layer_span`]: one read a layer), else room around
    /// each part so that direct reads of whole pages land in place.
    pub fn for_layers(layers: &[LayerWeights], in_place: bool, cap: u64, align: u64) -> Self {
        let span = || -> Option<u64> {
            let spans: Option<Vec<u64>> = layers
                .iter()
                .map(|lw| layer_span(lw, align).map(|s| s.1))
                .collect();
            spans?.into_iter().max()
        };
        in_place
            .then(span)
            .flatten()
            .and_then(|s| Self::spans(s, cap, align))
            .unwrap_or_else(|| {
                Self::new(
                    &slot_parts(layers),
                    cap,
                    align,
                    if in_place { SLACK } else { 0 },
                )
            })
    }

    /// One buffer with room for a run of the file of `span` bytes placed as it lies within a
    /// page (see [`layer_span`]), if that fits one binding of `cap` bytes.
    pub fn spans(span: u64, cap: u64, align: u64) -> Option<Self> {
        let size = (round16(span) + SLACK).div_ceil(PAGE) * PAGE;
        (size <= cap).then(|| Self {
            buffers: vec![size],
            regions: Vec::new(),
            slack: SLACK,
            align: align.max(16),
            span: true,
        })
    }

    /// Device bytes of one slot.
    pub fn bytes(&self) -> u64 {
        self.buffers.iter().sum()
    }

    /// Where in its buffer the `len` bytes read from `file_offset` go, for a region `r` of a
    /// buffer whose mapped address is `base` modulo [`PAGE`] (None: unknown): at the same place
    /// within a page as in the file when the binding alignment and the region's room allow it
    /// (a page further in where the page the data starts in would otherwise begin before the
    /// region, when the room allows that too), else at the region's start.
    pub fn place(&self, r: Region, len: u64, file_offset: u64, base: Option<u64>) -> u64 {
        let Some(base) = base else {
            return r.start;
        };
        if self.slack < PAGE {
            return r.start;
        }
        let lead = file_offset % PAGE;
        let mut s = (lead + 2 * PAGE - base % PAGE - r.start % PAGE) % PAGE;
        if s < lead && self.slack >= 2 * PAGE {
            s += PAGE;
        }
        if s.is_multiple_of(self.align) && s + round16(len) <= r.size {
            r.start + s
        } else {
            r.start
        }
    }
}

/// How the output head streams: its chunk size and where the chunks go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadChunks {
    pub chunk_rows: u32,
    pub n_chunks: u32,
    /// Bytes a chunk's rows take.
    pub chunk_bytes: u64,
    /// Chunks stream through the layer slots' first buffers (no memory of their own), else
    /// through two chunk slots of `chunk_bytes`.
    pub in_slots: bool,
}

impl HeadChunks {
    /// Chunks of at most `bytes` of whole rows of `row_bytes` each, over `rows` rows.
    pub fn of(bytes: u64, row_bytes: u64, rows: u64, in_slots: bool) -> Self {
        let chunk_rows = (bytes / row_bytes.max(1)).clamp(1, rows.max(1)) as u32;
        Self {
            chunk_rows,
            n_chunks: (rows.max(1) as u32).div_ceil(chunk_rows),
            chunk_bytes: round16(chunk_rows as u64 * row_bytes),
            in_slots,
        }
    }

    /// Chunks streaming through the layer slots of `slot`, when a slot's first buffer holds
    /// chunks of at least [`DEFAULT_HEAD_CHUNK`] (or the whole head), each within one binding
    /// of `max_binding` bytes: bigger chunks than slots of their own would get, with no memory
    /// beyond the slots. Chunks are a whole number of row groups whose bytes are a multiple of
    /// the binding alignment, so that every chunk's file offset allows the same placements.
    pub fn in_slots(
        slot: &SlotLayout,
        row_bytes: u64,
        rows: u64,
        max_binding: u64,
    ) -> Option<Self> {
        let room = slot.buffers.first()?.saturating_sub(slot.slack);
        let head = rows * row_bytes;
        let bytes = room
            .min(max_binding.saturating_sub(16))
            .min(head.div_ceil(MIN_HEAD_CHUNKS).max(DEFAULT_HEAD_CHUNK));
        if bytes < row_bytes || (bytes < DEFAULT_HEAD_CHUNK && bytes < head) {
            return None;
        }
        let group = slot.align / gcd(row_bytes.max(1), slot.align.max(1));
        let fit = bytes / row_bytes.max(1);
        let rows_per = if fit >= group {
            fit / group * group
        } else {
            fit
        };
        Some(Self::of(rows_per * row_bytes, row_bytes, rows, true))
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgmlType, TensorInfo};
    use crate::kernels::WeightLayout;
    use crate::model::tensors::MatrixRole;

    /// A layer of Q4_1 matrices of (rows, file offset), 256 columns (160 bytes a row), parts of
    /// at most `binding` bytes.
    fn layer(mats: &[(u32, u64)], binding: u64) -> LayerWeights {
        let mut lw = LayerWeights {
            roles: Vec::new(),
            files: Vec::new(),
            layouts: Vec::new(),
        };
        for (i, &(rows, offset)) in mats.iter().enumerate() {
            let name = format!("m{i}");
            let lay = WeightLayout::new(&name, GgmlType::Q4_1, rows, 256, binding).unwrap();
            lw.files.push(TensorInfo {
                name,
                dims: vec![256, rows as u64],
                ty: GgmlType::Q4_1,
                rel_offset: offset,
                offset,
                n_elements: 256 * rows as u64,
                n_bytes: 160 * rows as u64,
            });
            lw.layouts.push(lay);
            lw.roles.push(MatrixRole::Q);
        }
        lw
    }

    #[test]
    fn a_layer_whose_matrices_are_one_run_of_the_file_is_read_as_one() {
        // 100, 64 and 300 rows back to back from byte 4,128: one run of 74,240 bytes.
        let lw = layer(&[(100, 4128), (64, 20_128), (300, 30_368)], 1 << 20);
        assert_eq!(layer_span(&lw, 16), Some((4128, 74_240)));
        // Out of file order: the same run.
        let lw = layer(&[(300, 30_368), (100, 4128), (64, 20_128)], 1 << 20);
        assert_eq!(layer_span(&lw, 16), Some((4128, 74_240)));
        // A gap of 2,304 bytes (a norm) in 74,240: within 1/32, read with the run.
        let lw = layer(&[(100, 4128), (64, 22_432), (300, 32_672)], 1 << 20);
        assert_eq!(layer_span(&lw, 16), Some((4128, 76_544)));
        // A gap of 8 KiB: more than 1/32 of the run, so each matrix is read on its own.
        let lw = layer(&[(100, 4128), (64, 28_320), (300, 38_560)], 1 << 20);
        assert_eq!(layer_span(&lw, 16), None);
        // A matrix that does not start at a multiple of the binding alignment.
        let lw = layer(&[(100, 4128), (64, 20_128), (300, 30_368)], 1 << 20);
        assert_eq!(layer_span(&lw, 256), None);
        // A matrix in two parts (bindings of 32 KiB).
        assert_eq!(layer_span(&layer(&[(300, 4096)], 32 << 10), 16), None);
    }

    #[test]
    fn a_run_slot_has_two_pages_of_room_and_fits_one_binding() {
        let l = SlotLayout::spans(74_240, 1 << 20, 16).unwrap();
        assert!(l.span && l.regions.is_empty());
        assert_eq!(
            l.buffers,
            vec![74_240usize.div_ceil(4096) as u64 * 4096 + 8192]
        );
        assert_eq!(l.slack, SLACK);
        // The run placed as its first byte sits within a page (buffer mapped at a page).
        let whole = Region {
            buffer: 0,
            start: 0,
            size: l.buffers[0],
        };
        assert_eq!(l.place(whole, 74_240, 4128, Some(0)) % PAGE, 4128 % PAGE);
        assert!(l.place(whole, 74_240, 4128, Some(0)) + 74_240 <= l.buffers[0]);
        // Past one binding: none.
        assert_eq!(SlotLayout::spans(1 << 20, 1 << 20, 16), None);
    }

    #[test]
    fn regions_pack_in_order_and_split_at_the_cap() {
        // Three matrices: one part each of 1000, 5000 and 300 bytes; binding alignment 256.
        let l = SlotLayout::new(&[vec![1000], vec![5000], vec![300]], 1 << 20, 256, 0);
        assert_eq!(l.buffers, vec![1024 + 5120 + 512]);
        assert_eq!(
            l.regions,
            vec![
                vec![Region {
                    buffer: 0,
                    start: 0,
                    size: 1024
                }],
                vec![Region {
                    buffer: 0,
                    start: 1024,
                    size: 5120
                }],
                vec![Region {
                    buffer: 0,
                    start: 6144,
                    size: 512
                }],
            ]
        );
        // A cap of 6000 bytes: the second region starts a new buffer, the third joins it.
        let l = SlotLayout::new(&[vec![1000], vec![5000], vec![300]], 6000, 256, 0);
        assert_eq!(l.buffers, vec![1024, 5632]);
        assert_eq!(
            l.regions[1][0],
            Region {
                buffer: 1,
                start: 0,
                size: 5120
            }
        );
        assert_eq!(
            l.regions[2][0],
            Region {
                buffer: 1,
                start: 5120,
                size: 512
            }
        );
        assert_eq!(l.bytes(), 1024 + 5632);
    }

    #[test]
    fn slack_places_data_as_in_the_file() {
        // With a page of slack, regions of parts of 64 KiB or more start at pages and hold a
        // page more than their data; smaller parts get no room.
        let l = SlotLayout::new(&[vec![100_000], vec![70_000], vec![300]], 1 << 20, 16, PAGE);
        assert_eq!(
            l.regions[0][0],
            Region {
                buffer: 0,
                start: 0,
                size: 26 * PAGE
            }
        );
        assert_eq!(
            l.regions[1][0],
            Region {
                buffer: 0,
                start: 26 * PAGE,
                size: 19 * PAGE
            }
        );
        assert_eq!(
            l.regions[2][0],
            Region {
                buffer: 0,
                start: 45 * PAGE,
                size: 304
            }
        );
        assert_eq!(l.buffers, vec![45 * PAGE + 304]);
        let r = l.regions[1][0];
        // Buffer mapped at 64 past a page; bytes at file offset 3 pages + 1056: they go 992
        // bytes into the region, at the same place within a page as in the file.
        let at = l.place(r, 70_000, 3 * PAGE + 1056, Some(64));
        assert_eq!(at, 26 * PAGE + 992);
        assert_eq!((64 + at) % PAGE, (3 * PAGE + 1056) % PAGE);
        // Unknown address; a part without room; an offset the binding alignment does not
        // allow: the region's start.
        assert_eq!(l.place(r, 70_000, 1056, None), 26 * PAGE);
        assert_eq!(l.place(l.regions[2][0], 300, 1056, Some(0)), 45 * PAGE);
        let coarse = SlotLayout::new(&[vec![100_000]], 1 << 20, 256, PAGE);
        assert_eq!(
            coarse.place(coarse.regions[0][0], 100_000, 1056, Some(0)),
            0
        );
        // No slack: always the start.
        let tight = SlotLayout::new(&[vec![100_000]], 1 << 20, 16, 0);
        assert_eq!(tight.place(tight.regions[0][0], 100_000, 1056, Some(0)), 0);
    }

    #[test]
    fn two_pages_of_room_keep_the_whole_pages_of_a_part_in_its_region() {
        let l = SlotLayout::new(&[vec![100_000], vec![70_000]], 1 << 20, 16, SLACK);
        let r = l.regions[1][0];
        // 70,000 bytes (18 pages) and two pages of room.
        assert_eq!(r.size, 20 * PAGE);
        let file = 3 * PAGE + 1056;
        // Mapped 64 past a page: 992 into the region would put the data's first page 64 bytes
        // before the region; a page further in, the whole pages fit.
        let at = l.place(r, 70_000, file, Some(64));
        assert_eq!(at, r.start + PAGE + 992);
        assert_eq!((64 + at) % PAGE, file % PAGE);
        let first_page = at - file % PAGE;
        let last_page = first_page + (file % PAGE + 70_000).next_multiple_of(PAGE);
        assert!(first_page >= r.start && last_page <= r.start + r.size);
        // Mapped at a page: the data's first page is the region's.
        assert_eq!(l.place(r, 70_000, file, Some(0)), r.start + 1056);
    }

    #[test]
    fn head_chunks_through_slots_or_their_own() {
        // 49152 rows of 612 bytes; a slot of 2.2 MB with a page of slack.
        let slot = SlotLayout::new(&[vec![2_200_000]], 1 << 27, 16, PAGE);
        let h = HeadChunks::in_slots(&slot, 612, 49152, 1 << 27).expect("fits");
        assert!(h.in_slots);
        // Whole groups of 4 rows (612 = 4 x 153: 4 rows are a multiple of the 16-byte
        // alignment), as many as the room holds.
        assert_eq!(h.chunk_rows as u64, (slot.buffers[0] - PAGE) / 612 / 4 * 4);
        assert_eq!(h.chunk_rows % 4, 0);
        assert_eq!(h.n_chunks, 49152u32.div_ceil(h.chunk_rows));
        assert!(h.chunk_bytes + PAGE <= slot.buffers[0]);
        // A slot too small for chunks of the default size: chunks of their own instead.
        let small = SlotLayout::new(&[vec![100_000]], 1 << 27, 16, PAGE);
        assert_eq!(HeadChunks::in_slots(&small, 612, 49152, 1 << 27), None);
        // ... unless it holds the whole head.
        assert!(HeadChunks::in_slots(&small, 612, 100, 1 << 27).is_some());
        // A slot larger than the head: still 4 chunks, so reading overlaps compute.
        let big = SlotLayout::new(&[vec![100 << 20]], 1 << 27, 16, PAGE);
        let h = HeadChunks::in_slots(&big, 612, 49152, 1 << 27).expect("fits");
        assert_eq!(h.n_chunks, 4);
        let own = HeadChunks::of(DEFAULT_HEAD_CHUNK, 612, 49152, false);
        assert_eq!(own.chunk_rows, 856);
        assert_eq!(own.n_chunks, 58);
    }
}
