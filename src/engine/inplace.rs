//! Weights read straight into mapped layer slots (no staging copy): each destination buffer is
//! mapped once the device is done with it, the file ranges are read into it over the reader's
//! threads, and it is unmapped. With direct I/O a read widens to the whole pages of the file its
//! bytes lie in, where the slot layout left room for that (`plan::slots`), so that each matrix
//! is one aligned read straight into the slot.

use std::sync::Mutex;
use std::time::Instant;

use crate::flash::{DirectReads, WeightSource};
use crate::gpu::GpuContext;

use super::upload::OwnedReq;

/// Map every destination buffer of `reqs` for writing (all requested at once, so their waits
/// for the device overlap), read the source ranges into them, from up to the reader's thread
/// count at a time (a layer's tensors are short reads: one after another they would leave the
/// flash idle between them), and unmap; returns (seconds waiting for the maps, seconds
/// reading).
pub(super) fn fill(
    ctx: &GpuContext,
    src: &dyn WeightSource,
    reqs: &[OwnedReq],
    after: Option<wgpu::SubmissionIndex>,
) -> Result<(f64, f64), String> {
    let mut ranges = Vec::with_capacity(reqs.len());
    for r in reqs {
        let end = r.dst_offset + r.len.div_ceil(4) * 4;
        if !r.dst_offset.is_multiple_of(8) || end > r.dst.size() {
            return Err(format!(
                "in-place upload range [{}, {end}) does not fit the {}-byte buffer",
                r.dst_offset,
                r.dst.size()
            ));
        }
        ranges.push(r.dst_offset..end);
    }
    for (i, a) in ranges.iter().enumerate() {
        for (j, b) in ranges.iter().enumerate().skip(i + 1) {
            if reqs[i].dst == reqs[j].dst && a.start < b.end && b.start < a.end {
                return Err(format!(
                    "in-place upload ranges [{}, {}) and [{}, {}) of one buffer overlap",
                    a.start, a.end, b.start, b.end
                ));
            }
        }
    }
    // Each buffer is mapped whole: a read may then widen to whole pages of the file (see
    // `read_mapped`), past its own bytes into room no other range of the job uses.
    let mut bufs: Vec<&wgpu::Buffer> = Vec::new();
    for r in reqs {
        if !bufs.contains(&&r.dst) {
            bufs.push(&r.dst);
        }
    }
    let t = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, buf) in bufs.iter().enumerate() {
        let tx = tx.clone();
        buf.slice(..).map_async(wgpu::MapMode::Write, move |res| {
            let _ = tx.send((i, res));
        });
    }
    drop(tx);
    // Callbacks run inside some thread's poll. Block until the submission that last reads
    // the destinations is done (which also runs the callbacks of maps it held back), rather
    // than polling on a timer; then poll without blocking on other work until every request
    // has answered (mapped or failed) before the buffers may be touched or unmapped.
    if let Some(idx) = after {
        ctx.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: Some(std::time::Duration::from_secs(120)),
            })
            .map_err(|e| format!("waiting for the device before filling a layer slot: {e}"))?;
    } else {
        ctx.device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| e.to_string())?;
    }
    let mut mapped = vec![false; bufs.len()];
    let mut failure = None;
    let mut answered = 0;
    while answered < bufs.len() {
        match rx.recv_timeout(std::time::Duration::from_micros(50)) {
            Ok((i, res)) => {
                answered += 1;
                match res {
                    Ok(()) => mapped[i] = true,
                    Err(e) => failure = Some(format!("mapping a layer slot failed: {e}")),
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                ctx.device
                    .poll(wgpu::PollType::Poll)
                    .map_err(|e| e.to_string())?;
                if t.elapsed().as_secs() > 120 {
                    return Err("mapping a layer slot timed out".to_string());
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    let waited = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let res = match failure {
        Some(e) => Err(e),
        None => read_mapped(src, reqs, &ranges, &bufs),
    };
    for (buf, m) in bufs.iter().zip(mapped) {
        if m {
            buf.unmap();
        }
    }
    res.map(|()| (waited, t.elapsed().as_secs_f64()))
}

/// One read of `read_mapped`: `n` file bytes from `src_offset` into the front of `dst`, the
/// rest of `dst` (padding) zeroed.
struct MappedRead<'a> {
    src_offset: u64,
    n: usize,
    dst: &'a mut [u8],
}

/// A read of `len` file bytes at `file` into a mapped buffer of `size` bytes at `dst` (whose
/// address is `base` + `dst`), padded to `padded` bytes, widened to the whole pages of the
/// file: (buffer range, file offset, bytes to read), if the bytes sit in the buffer as they do
/// within a page of the file, and the widened range stays in the buffer and the file.
fn widened(
    (file, len): (u64, u64),
    (dst, padded, size): (u64, u64, u64),
    base: u64,
    d: DirectReads,
) -> Option<(std::ops::Range<u64>, u64, u64)> {
    let a = d.align.max(1);
    let lead = file % a;
    if (base.wrapping_add(dst)) % a != lead || dst < lead {
        return None;
    }
    let file_end = (file + len).next_multiple_of(a).min(d.file_len);
    let start = dst - lead;
    let n = file_end.checked_sub(file - lead)?;
    let end = (start + n).max(dst + padded);
    (end <= size).then_some((start..end, file - lead, n))
}

/// Read each request's source range into its mapped destination `ranges` (zeroing the padding
/// after it), over up to the source's reader thread count (its own threads: see
/// [`WeightSource::parallel`]). With direct I/O a read widens to
/// the whole pages of the file its bytes lie in, where its destination sits as they do within a
/// page and the room around it is no other request's: the reader then reads each of a layer's
/// tensors in aligned pieces straight into the slot, instead of its first and last partial
/// pages through a bounce buffer in reads of their own.
fn read_mapped(
    src: &dyn WeightSource,
    reqs: &[OwnedReq],
    ranges: &[std::ops::Range<u64>],
    bufs: &[&wgpu::Buffer],
) -> Result<(), String> {
    let mut views = Vec::with_capacity(bufs.len());
    for b in bufs {
        views.push(
            b.slice(..)
                .get_mapped_range_mut()
                .map_err(|e| e.to_string())?,
        );
    }
    let mut bases = Vec::with_capacity(views.len());
    for v in views.iter_mut() {
        bases.push(v.slice(..).as_raw_element_ptr());
    }
    let buf_of = |r: &OwnedReq| bufs.iter().position(|b| *b == &r.dst).unwrap_or(0);
    // Each request's destination range, file offset and bytes to read: widened where allowed,
    // else its own.
    let mut spans: Vec<(std::ops::Range<u64>, u64, u64)> = reqs
        .iter()
        .zip(ranges)
        .map(|(r, range)| (range.clone(), r.src_offset, r.len))
        .collect();
    if let Some(d) = src.direct_reads() {
        for (i, (r, range)) in reqs.iter().zip(ranges).enumerate() {
            let base = bases[buf_of(r)].as_ptr() as u64;
            let padded = range.end - range.start;
            let at = (r.dst_offset, padded, r.dst.size());
            let Some(wide) = widened((r.src_offset, r.len), at, base, d) else {
                continue;
            };
            let clash = reqs.iter().enumerate().any(|(j, o)| {
                j != i
                    && o.dst == r.dst
                    && [&ranges[j], &spans[j].0]
                        .iter()
                        .any(|x| x.start < wide.0.end && wide.0.start < x.end)
            });
            if !clash {
                spans[i] = wide;
            }
        }
    }
    let mut jobs: Vec<MappedRead<'_>> = Vec::with_capacity(reqs.len());
    for (r, (span, file, n)) in reqs.iter().zip(spans) {
        let base = bases[buf_of(r)];
        // SAFETY: `span` lies within its buffer (checked against the buffer's size), which is
        // mapped whole by `views` until the reads below are done; the spans of one buffer do not
        // overlap (each request's own range was checked against the others', and a widened one
        // against theirs, widened or not); the memory is initialized (wgpu zero-fills buffers)
        // and only written through these slices.
        let dst: &mut [u8] = unsafe {
            std::slice::from_raw_parts_mut(
                base.as_ptr().add(span.start as usize),
                (span.end - span.start) as usize,
            )
        };
        jobs.push(MappedRead {
            src_offset: file,
            n: n as usize,
            dst,
        });
    }
    let threads = src
        .reader_options()
        .map_or(1, |o| o.threads)
        .clamp(1, jobs.len().max(1));
    let read = |j: MappedRead<'_>| {
        let (data, pad) = j.dst.split_at_mut(j.n);
        pad.fill(0);
        src.read_into(j.src_offset, data)
            .map_err(|e| format!("reading {} bytes at {}: {e}", j.n, j.src_offset))
    };
    let res = if threads == 1 {
        jobs.into_iter().try_for_each(read)
    } else {
        // Over the source's reader threads: each takes the next read until none is left or
        // one has failed.
        let queue = Mutex::new(jobs.into_iter());
        let failed: Mutex<Option<String>> = Mutex::new(None);
        let work = || {
            loop {
                if failed.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                    break;
                }
                let Some(j) = queue.lock().unwrap_or_else(|p| p.into_inner()).next() else {
                    break;
                };
                if let Err(e) = read(j) {
                    let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
                    f.get_or_insert(e);
                    break;
                }
            }
        };
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            src.parallel(threads, &work)
        }));
        match (ran, failed.into_inner().unwrap_or_else(|p| p.into_inner())) {
            (Err(_), _) => Err("an in-place reader thread panicked".to_string()),
            (Ok(()), Some(e)) => Err(e),
            (Ok(()), None) => Ok(()),
        }
    };
    drop(views);
    res
}

#[cfg(test)]
mod tests {
    use super::widened;
    use crate::flash::DirectReads;

    const D: DirectReads = DirectReads {
        align: 4096,
        file_len: 1 << 20,
    };

    #[test]
    fn reads_widen_to_whole_pages_where_they_sit_as_in_the_file() {
        // 10,000 bytes at file offset 8,292 (100 into a page), placed 100 into a page of a
        // buffer mapped at a page boundary: pages [8192, 20480) of the file, 4 KiB before.
        let w = widened((8292, 10_000), (4096 + 100, 10_000, 1 << 16), 0, D);
        assert_eq!(w, Some((4096..4096 + 12_288, 8192, 12_288)));
        // The same, the buffer mapped 64 bytes into a page: the place must be 36 into one.
        let w = widened((8292, 10_000), (4096 + 36, 10_000, 1 << 16), 64, D);
        assert_eq!(w, Some((4096 - 64..4096 - 64 + 12_288, 8192, 12_288)));
        // Aligned already: unchanged.
        let w = widened((8192, 8192), (4096, 8192, 1 << 16), 0, D);
        assert_eq!(w, Some((4096..12_288, 8192, 8192)));
    }

    #[test]
    fn reads_stay_as_they_are_where_widening_would_not_fit() {
        // Not where it sits within a page of the file.
        assert_eq!(
            widened((8292, 10_000), (4096 + 96, 10_000, 1 << 16), 0, D),
            None
        );
        // No room before it in the buffer.
        assert_eq!(widened((8292, 10_000), (36, 10_000, 1 << 16), 64, D), None);
        // The last page would pass the end of the buffer.
        assert_eq!(widened((8292, 10_000), (4196, 10_000, 14_200), 0, D), None);
    }

    #[test]
    fn the_end_of_the_file_bounds_a_widened_read() {
        // The file ends 50 bytes into a page: the read stops there, the padding is zeroed.
        let d = DirectReads {
            align: 4096,
            file_len: 12_288 + 50,
        };
        let w = widened((12_288 + 10, 37), (4096 + 10, 40, 1 << 16), 0, d);
        assert_eq!(w, Some((4096..4096 + 50, 12_288, 50)));
        let w = widened((12_288 + 10, 40), (4096 + 10, 40, 1 << 16), 0, d);
        assert_eq!(w, Some((4096..4096 + 50, 12_288, 50)));
    }
}
