//! The read path of [`FlashFile`]: [`FlashFile::read_into`] splits a read into pieces and
//! spreads them over the file's reader threads (kept from read to read, see `pool`); each piece is copied out of the map (mmap mode) or read
//! with `pread`, straight into the destination where the alignment allows and through pooled
//! bounce buffers otherwise (direct mode). Injected faults are checked here.

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::flash::pool::ReaderPool;
use crate::flash::sys::{AlignedBuf, DIRECT_ALIGN, pread};
use crate::flash::{FlashError, FlashFault, FlashFile, IoMode};

/// Most bytes one memcpy moves out of the map in mmap mode.
const MMAP_COPY_STEP: usize = 256 << 10;

impl FlashFile {
    fn check_faults(&self, offset: u64, len: u64) -> Result<(), FlashError> {
        let Ok(faults) = self.faults.lock() else {
            return Ok(());
        };
        for f in faults.iter() {
            match *f {
                FlashFault::ShortRead { at } if at >= offset && at < offset + len => {
                    return Err(FlashError::ShortRead {
                        path: self.path.clone(),
                        offset,
                        wanted: len,
                        got: at - offset,
                    });
                }
                FlashFault::IoError { at } if at >= offset && at < offset + len => {
                    return Err(self.io_err("reading", at, io::Error::other("injected I/O error")));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Read exactly `dst.len()` bytes at `offset`.
    ///
    /// The read is split into pieces at multiples of the piece size in the file and spread
    /// over up to `threads` threads (the calling thread is one of them).
    pub fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<(), FlashError> {
        let len = dst.len() as u64;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.len)
            .ok_or_else(|| FlashError::OutOfRange {
                path: self.path.clone(),
                offset,
                len,
                file_len: self.len,
            })?;
        if len == 0 {
            return Ok(());
        }
        self.check_faults(offset, len)?;
        if self.opts.mode == IoMode::Mmap {
            // Touching pages past the end of a shrunk file raises SIGBUS.
            self.check_size()?;
        }
        let piece = self.piece as u64;
        let n_pieces = (end - 1) / piece - offset / piece + 1;
        let workers = (self.opts.threads as u64).min(n_pieces) as usize;
        if workers <= 1 {
            let mut pos = offset;
            let mut rest = dst;
            while pos < end {
                let next = ((pos / piece + 1) * piece).min(end);
                let (head, tail) = rest.split_at_mut((next - pos) as usize);
                self.read_piece(pos, head)?;
                rest = tail;
                pos = next;
            }
            return Ok(());
        }
        // Pieces in file order; workers take the next one as they finish, so the device sees
        // requests in ascending order with `workers` of them in flight.
        let mut pieces = Vec::with_capacity(n_pieces as usize);
        let mut pos = offset;
        let mut rest = dst;
        while pos < end {
            let next = ((pos / piece + 1) * piece).min(end);
            let (head, tail) = rest.split_at_mut((next - pos) as usize);
            pieces.push((pos, head));
            rest = tail;
            pos = next;
        }
        let queue = Mutex::new(pieces.into_iter());
        let failed = AtomicBool::new(false);
        let first_err: Mutex<Option<FlashError>> = Mutex::new(None);
        let work = || {
            while !failed.load(Ordering::Relaxed) {
                let next = match queue.lock() {
                    Ok(mut q) => q.next(),
                    Err(_) => None,
                };
                let Some((pos, buf)) = next else { break };
                if let Err(e) = self.read_piece(pos, buf) {
                    failed.store(true, Ordering::Relaxed);
                    if let Ok(mut slot) = first_err.lock()
                        && slot.is_none()
                    {
                        *slot = Some(e);
                    }
                    break;
                }
            }
        };
        self.parallel(workers, &work);
        if let Some(e) = first_err.into_inner().ok().flatten() {
            return Err(e);
        }
        if failed.load(Ordering::Relaxed) {
            return Err(self.io_err(
                "reading",
                offset,
                io::Error::other("a reader thread failed"),
            ));
        }
        Ok(())
    }

    /// Call `f` on up to `n` threads at once, this one and the file's reader threads (started
    /// on first use), and return when every call has returned. A call made from inside
    /// another's `f` stays on its thread.
    pub fn parallel(&self, n: usize, f: &(dyn Fn() + Sync)) {
        let pool = self
            .pool
            .get_or_init(|| ReaderPool::new(self.opts.threads.saturating_sub(1)).ok());
        match pool {
            Some(p) => p.run(n, f),
            None => f(),
        }
    }

    fn read_piece(&self, offset: u64, dst: &mut [u8]) -> Result<(), FlashError> {
        match &self.map {
            Some(map) => {
                // Copy in bounded steps: a single huge memcpy may walk several far-apart
                // streams at once (large-copy strategies of the C library), which defeats the
                // kernel's sequential readahead on a cold map.
                let a = offset as usize;
                for (i, d) in dst.chunks_mut(MMAP_COPY_STEP).enumerate() {
                    let s = a + i * MMAP_COPY_STEP;
                    d.copy_from_slice(&map[s..s + d.len()]);
                }
                self.bytes_read
                    .fetch_add(dst.len() as u64, Ordering::Relaxed);
                self.reads.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            None => match self.opts.mode {
                IoMode::Direct => self.direct_piece(offset, dst),
                // An empty file has no map and no bytes to read.
                IoMode::Mmap => Ok(()),
            },
        }
    }

    /// Direct read of one piece: the aligned middle straight into `dst` when the address and
    /// the file offset share their alignment, everything else through a bounce buffer.
    fn direct_piece(&self, offset: u64, dst: &mut [u8]) -> Result<(), FlashError> {
        let a = DIRECT_ALIGN as u64;
        let end = offset + dst.len() as u64;
        let congruent = (dst.as_ptr() as u64) % a == offset % a;
        let mid_start = offset.next_multiple_of(a);
        let mid_end = end / a * a;
        if congruent && mid_start < mid_end {
            let h = (mid_start - offset) as usize;
            let m = (mid_end - offset) as usize;
            let (head, rest) = dst.split_at_mut(h);
            let (mid, tail) = rest.split_at_mut(m - h);
            if !head.is_empty() {
                self.bounce_read(offset, head)?;
            }
            self.aligned_read(mid_start, mid, mid.len() as u64)?;
            if !tail.is_empty() {
                self.bounce_read(mid_end, tail)?;
            }
            return Ok(());
        }
        self.bounce_read(offset, dst)
    }

    /// Read `dst.len()` bytes at `offset` through aligned bounce buffers.
    fn bounce_read(&self, offset: u64, dst: &mut [u8]) -> Result<(), FlashError> {
        let a = DIRECT_ALIGN as u64;
        let mut buf = self.take_bounce()?;
        let cap = buf.len() as u64;
        let end = offset + dst.len() as u64;
        let mut pos = offset;
        let mut result = Ok(());
        while pos < end {
            let a0 = pos / a * a;
            let a1 = end.next_multiple_of(a).min(a0 + cap);
            let upto = a1.min(end);
            let need = upto - a0;
            let window = &mut buf.as_mut_slice()[..(a1 - a0) as usize];
            if let Err(e) = self.aligned_read(a0, window, need) {
                result = Err(e);
                break;
            }
            let s = (pos - offset) as usize;
            let n = (upto - pos) as usize;
            dst[s..s + n].copy_from_slice(&window[(pos - a0) as usize..(pos - a0) as usize + n]);
            self.bounced.fetch_add(n as u64, Ordering::Relaxed);
            pos = upto;
        }
        self.give_bounce(buf);
        result
    }

    /// Aligned direct read of `buf.len()` bytes at `offset` (both aligned) of which at least
    /// `need` must arrive (the aligned tail may lie past the end of the file).
    fn aligned_read(&self, offset: u64, buf: &mut [u8], need: u64) -> Result<(), FlashError> {
        let a = DIRECT_ALIGN;
        let mut got = 0usize;
        while (got as u64) < need {
            let n = pread(&self.file, &mut buf[got..], offset + got as u64)
                .map_err(|e| self.io_err("reading", offset + got as u64, e))?;
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.bytes_read
                .fetch_add((buf.len() - got) as u64, Ordering::Relaxed);
            got += n;
            // End of file, or an unaligned remainder (only at the end of the file).
            if n == 0 || n % a != 0 {
                break;
            }
        }
        if (got as u64) < need {
            self.check_unchanged()?;
            return Err(FlashError::ShortRead {
                path: self.path.clone(),
                offset,
                wanted: need,
                got: got as u64,
            });
        }
        Ok(())
    }

    fn take_bounce(&self) -> Result<AlignedBuf, FlashError> {
        if let Ok(mut pool) = self.bounce.lock()
            && let Some(b) = pool.pop()
        {
            return Ok(b);
        }
        AlignedBuf::new(self.piece).map_err(|e| self.io_err("allocating for", 0, e))
    }

    fn give_bounce(&self, b: AlignedBuf) {
        if let Ok(mut pool) = self.bounce.lock() {
            pool.push(b);
        }
    }
}
