//! The staging ring: N host-visible buffers (MAP_WRITE | COPY_SRC) used round-robin to move
//! file bytes into device buffers.
//!
//! Each slot cycles Mapped → (the source writes pieces into the mapped memory, packed one after
//! another) → unmapped, copies submitted → Pending (map requested again) → Mapped once the
//! copies have run. Pieces of many requests share a slot, and a request larger than what is
//! left of a slot continues in the next one, so a batch of B bytes needs about B / slot-size
//! slots whatever its pieces look like: a ring sized for a layer holds the layer. A batch is
//! submitted when it wraps onto a slot it already holds or at its end, so writes never pile up
//! unsubmitted beyond the ring's bytes. A failed map or a failed read ends the upload with an
//! error; the ring stays usable and releases every byte when dropped.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use thiserror::Error;

use super::{GpuBuffer, GpuContext, GpuError};

pub use crate::flash::source::ChunkSource;

#[derive(Debug, Error)]
pub enum StagingError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("reading {len} bytes at offset {offset} for upload failed: {source}")]
    Read {
        offset: u64,
        len: u64,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("upload destination range [{offset}, {end}) exceeds the buffer of {size} bytes")]
    Destination { offset: u64, end: u64, size: u64 },
}

/// Faults the tests can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The next map request reports failure.
    MapFailure,
}

#[derive(Debug, Clone, PartialEq)]
enum SlotState {
    Mapped,
    Pending,
    /// The map request failed (`mapped`: the buffer is mapped anyway, after an injected fault).
    Failed {
        message: String,
        mapped: bool,
    },
}

struct Slot {
    buf: GpuBuffer,
    state: Arc<Mutex<SlotState>>,
    submission: Option<wgpu::SubmissionIndex>,
}

/// Figures of one upload.
#[derive(Debug, Clone, Copy, Default)]
pub struct UploadStats {
    pub bytes: u64,
    pub chunks: u32,
    /// Seconds spent reading the source into staging memory.
    pub read_s: f64,
    /// Seconds spent waiting for a staging slot to come back.
    pub wait_s: f64,
    /// Times a batch wrapped onto a slot it already held (its copies were submitted early).
    pub wraps: u32,
}

impl UploadStats {
    pub fn add(&mut self, o: &UploadStats) {
        self.bytes += o.bytes;
        self.chunks += o.chunks;
        self.read_s += o.read_s;
        self.wait_s += o.wait_s;
        self.wraps += o.wraps;
    }
}

/// Extra bytes per slot so a chunk can start at any offset below 4 KiB.
const SLACK: u64 = 4096;

/// Device bytes of a ring of `n` slots of `chunk` bytes (as [`StagingRing::new`] allocates).
pub fn ring_bytes(n: usize, chunk: u64) -> u64 {
    n.max(1) as u64 * (chunk.max(4096).div_ceil(4096) * 4096 + SLACK)
}

/// N mapped staging buffers reused round-robin.
pub struct StagingRing {
    slots: Vec<Slot>,
    chunk: u64,
    next: usize,
    fault: Option<Fault>,
}

impl StagingRing {
    /// `n` slots of `chunk` bytes (rounded up to 4 KiB) plus 4 KiB of placement slack each,
    /// counted against the device budget.
    pub fn new(ctx: &GpuContext, n: usize, chunk: u64) -> Result<Self, GpuError> {
        let chunk = chunk.max(4096).div_ceil(4096) * 4096;
        let mut slots = Vec::with_capacity(n.max(1));
        for i in 0..n.max(1) {
            let buf = ctx.buffer_mapped(
                &format!("staging[{i}]"),
                chunk + SLACK,
                wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            )?;
            slots.push(Slot {
                buf,
                state: Arc::new(Mutex::new(SlotState::Mapped)),
                submission: None,
            });
        }
        Ok(Self {
            slots,
            chunk,
            next: 0,
            fault: None,
        })
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of device memory the ring holds (as [`ring_bytes`] computes).
    pub fn device_bytes(&self) -> u64 {
        self.slots.iter().map(|s| s.buf.size).sum()
    }

    /// Inject a fault into the next map request (tests).
    pub fn inject(&mut self, fault: Fault) {
        self.fault = Some(fault);
    }

    fn request_map(&mut self, i: usize) {
        let state = self.slots[i].state.clone();
        if let Ok(mut s) = state.lock() {
            *s = SlotState::Pending;
        }
        let fail = self.fault.take() == Some(Fault::MapFailure);
        self.slots[i]
            .buf
            .slice(..)
            .map_async(wgpu::MapMode::Write, move |r| {
                let next = match r {
                    Ok(()) if !fail => SlotState::Mapped,
                    Ok(()) => SlotState::Failed {
                        message: "injected map failure".into(),
                        mapped: true,
                    },
                    Err(e) => SlotState::Failed {
                        message: e.to_string(),
                        mapped: false,
                    },
                };
                if let Ok(mut s) = state.lock() {
                    *s = next;
                }
            });
    }

    fn state(&self, i: usize) -> SlotState {
        self.slots[i]
            .state
            .lock()
            .map(|s| s.clone())
            .unwrap_or(SlotState::Failed {
                message: "slot state lock poisoned".into(),
                mapped: false,
            })
    }

    /// Wait until slot `i` is mapped and writable.
    fn acquire(&mut self, ctx: &GpuContext, i: usize) -> Result<(), StagingError> {
        loop {
            match self.state(i) {
                SlotState::Mapped => return Ok(()),
                SlotState::Failed { message, mapped } => {
                    // Ask for the mapping again so later uploads can use the slot, and report
                    // this one.
                    if mapped {
                        self.slots[i].buf.unmap();
                    }
                    self.request_map(i);
                    return Err(GpuError::MapFailed(message).into());
                }
                SlotState::Pending => {
                    let sub = self.slots[i].submission.clone();
                    ctx.device
                        .poll(wgpu::PollType::Wait {
                            submission_index: sub,
                            timeout: Some(std::time::Duration::from_secs(60)),
                        })
                        .map_err(|e| GpuError::DeviceLost(e.to_string()))?;
                    ctx.check()?;
                    if self.state(i) == SlotState::Pending {
                        // The map callback runs on a later poll.
                        ctx.device
                            .poll(wgpu::PollType::Poll)
                            .map_err(|e| GpuError::DeviceLost(e.to_string()))?;
                        if self.state(i) == SlotState::Pending {
                            std::thread::yield_now();
                        }
                    }
                }
            }
        }
    }

    /// Copy `len` bytes at `src_offset` of `src` into `dst` at `dst_offset` (a multiple of 4),
    /// chunk by chunk through the ring.
    pub fn upload(
        &mut self,
        ctx: &GpuContext,
        src: &(impl ChunkSource + ?Sized),
        src_offset: u64,
        len: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
    ) -> Result<UploadStats, StagingError> {
        self.upload_batch(
            ctx,
            src,
            &[UploadReq {
                src_offset,
                len,
                dst,
                dst_offset,
            }],
        )
    }

    /// Upload several ranges with as few submissions as the ring allows. Pieces are packed
    /// into the slots back to back (each 4-byte aligned); the copies go into one command
    /// buffer, submitted when the ring wraps onto a slot it already holds or at the end, so a
    /// batch never holds more than the ring's bytes unsubmitted.
    pub fn upload_batch(
        &mut self,
        ctx: &GpuContext,
        src: &(impl ChunkSource + ?Sized),
        reqs: &[UploadReq<'_>],
    ) -> Result<UploadStats, StagingError> {
        for r in reqs {
            let end = r.dst_offset + r.len.div_ceil(4) * 4;
            if !r.dst_offset.is_multiple_of(4) || end > r.dst.size() {
                return Err(StagingError::Destination {
                    offset: r.dst_offset,
                    end,
                    size: r.dst.size(),
                });
            }
        }
        let mut stats = UploadStats::default();
        let mut b = Batch {
            enc: None,
            held: Vec::new(),
            cur: None,
            base: 0,
        };
        let res = self.pack(ctx, src, reqs, &mut b, &mut stats);
        match res {
            Ok(()) => {
                self.close_slot(&mut b);
                self.flush(ctx, &mut b.enc, &mut b.held);
                Ok(stats)
            }
            Err(e) => {
                self.close_slot(&mut b);
                self.abandon(&mut b.enc, &mut b.held);
                Err(e)
            }
        }
    }

    fn pack(
        &mut self,
        ctx: &GpuContext,
        src: &(impl ChunkSource + ?Sized),
        reqs: &[UploadReq<'_>],
        b: &mut Batch,
        stats: &mut UploadStats,
    ) -> Result<(), StagingError> {
        let cap = self.chunk + SLACK;
        let align = src.preferred_alignment().clamp(1, SLACK);
        for r in reqs {
            let mut done = 0u64;
            while done < r.len {
                let src_at = r.src_offset + done;
                // Where the piece would start in the current slot (4-aligned, or congruent to
                // its source offset for sources that prefer it).
                let start = b.cur.map(|(_, c)| place(c, src_at, align, cap, b.base));
                let room = start.map(|s| cap.saturating_sub(s)).unwrap_or(0);
                if room < 4 {
                    self.close_slot(b);
                    let i = self.next;
                    if b.held.contains(&i) {
                        stats.wraps += 1;
                        self.flush(ctx, &mut b.enc, &mut b.held);
                    }
                    self.next = (self.next + 1) % self.slots.len();
                    let t_wait = Instant::now();
                    self.acquire(ctx, i)?;
                    stats.wait_s += t_wait.elapsed().as_secs_f64();
                    b.held.push(i);
                    b.cur = Some((i, 0));
                    b.base = if align > 4 { self.base_addr(i)? } else { 0 };
                    continue;
                }
                let Some((i, _)) = b.cur else { continue };
                let at = start.unwrap_or(0);
                let left = r.len - done;
                // Whole tail when it fits (padded to 4), else a 4-byte multiple that fits.
                let n = if left.div_ceil(4) * 4 <= room {
                    left
                } else {
                    room / 4 * 4
                };
                let padded = n.div_ceil(4) * 4;
                let t_read = Instant::now();
                let filled = self.fill(i, src, src_at, n, at);
                stats.read_s += t_read.elapsed().as_secs_f64();
                filled?;
                let e = b.enc.get_or_insert_with(|| {
                    ctx.device
                        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                            label: Some("upload"),
                        })
                });
                e.copy_buffer_to_buffer(&self.slots[i].buf, at, r.dst, r.dst_offset + done, padded);
                b.cur = Some((i, at + padded));
                stats.bytes += n;
                stats.chunks += 1;
                done += n;
            }
        }
        Ok(())
    }

    /// Read `n` source bytes at `src_at` into mapped slot `i` at offset `at` (zero padding to a
    /// multiple of 4).
    fn fill(
        &mut self,
        i: usize,
        src: &(impl ChunkSource + ?Sized),
        src_at: u64,
        n: u64,
        at: u64,
    ) -> Result<(), StagingError> {
        let padded = n.div_ceil(4) * 4;
        // Mapped views start at multiples of 8; the piece starts `lead` bytes into its view.
        let view_at = at & !7;
        let lead = (at - view_at) as usize;
        let slot = &self.slots[i];
        let mut view = slot
            .buf
            .slice(view_at..at + padded)
            .get_mapped_range_mut()
            .map_err(|e| GpuError::MapFailed(e.to_string()))?;
        let mut w = view.slice(..);
        let len = w.len();
        let ptr = w.as_raw_element_ptr();
        // SAFETY: `view` maps exactly `len` bytes, is held exclusively until this function
        // returns, and the memory is initialized (wgpu zero-fills new buffers). Sources only
        // write into the slice (file reads, copies), so no read of write-combined memory
        // happens; this lets the file be read straight into staging memory.
        let bytes: &mut [u8] = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) };
        let bytes = &mut bytes[lead..];
        bytes[n as usize..].fill(0);
        src.read_into(src_at, &mut bytes[..n as usize])
            .map_err(|source| StagingError::Read {
                offset: src_at,
                len: n,
                source,
            })
    }

    /// Host address where slot `i`'s mapped memory starts.
    fn base_addr(&self, i: usize) -> Result<u64, StagingError> {
        let mut view = self.slots[i]
            .buf
            .slice(0..8)
            .get_mapped_range_mut()
            .map_err(|e| GpuError::MapFailed(e.to_string()))?;
        let mut w = view.slice(..);
        Ok(w.as_raw_element_ptr().as_ptr() as u64)
    }

    /// Unmap the slot being filled, if any (its copies are recorded; it is held until submit).
    fn close_slot(&mut self, b: &mut Batch) {
        if let Some((i, _)) = b.cur.take() {
            self.slots[i].buf.unmap();
        }
    }

    /// Submit the held copies and ask for their slots back.
    fn flush(
        &mut self,
        ctx: &GpuContext,
        enc: &mut Option<wgpu::CommandEncoder>,
        held: &mut Vec<usize>,
    ) {
        if let Some(e) = enc.take() {
            let sub = ctx.queue.submit([e.finish()]);
            for &i in held.iter() {
                self.slots[i].submission = Some(sub.clone());
            }
        }
        for i in std::mem::take(held) {
            self.request_map(i);
        }
    }

    /// Drop unsubmitted copies after an error; their slots are mapped again.
    fn abandon(&mut self, enc: &mut Option<wgpu::CommandEncoder>, held: &mut Vec<usize>) {
        enc.take();
        for i in std::mem::take(held) {
            self.request_map(i);
        }
    }
}

/// Slots needed to hold `bytes` of uploads split into `pieces` ranges in one batch without
/// wrapping: each piece may waste up to 3 bytes of alignment, and a batch starts a fresh slot.
pub fn slots_for(bytes: u64, pieces: u64, chunk: u64) -> usize {
    let chunk = chunk.max(4096).div_ceil(4096) * 4096 + SLACK;
    (bytes + 3 * pieces).div_ceil(chunk).max(1) as usize
}

/// Where a piece from source offset `src_at` starts in a slot whose cursor is `cursor` and whose
/// mapped memory starts at host address `base`.
fn place(cursor: u64, src_at: u64, align: u64, cap: u64, base: u64) -> u64 {
    let c = cursor.div_ceil(4) * 4;
    if align <= 4 {
        return c;
    }
    // The piece's host address congruent to its source offset modulo `align`.
    let addr = base + c;
    let want = c + (src_at % align + align - addr % align) % align;
    if want.is_multiple_of(4) && want < cap {
        want
    } else {
        c
    }
}

struct Batch {
    enc: Option<wgpu::CommandEncoder>,
    held: Vec<usize>,
    /// The slot being filled and its cursor.
    cur: Option<(usize, u64)>,
    /// Host address of the slot's mapped memory (for sources that prefer an alignment).
    base: u64,
}

/// One range for [`StagingRing::upload_batch`].
pub struct UploadReq<'a> {
    pub src_offset: u64,
    pub len: u64,
    pub dst: &'a wgpu::Buffer,
    pub dst_offset: u64,
}
