//! `flashlm bench io`: how fast model bytes come off flash, each way the engine can read them,
//! measured on the same bytes from a verified-cold page cache.
//!
//! - raw cold read: one plain sequential `read` with a large buffer (the baseline);
//! - direct and mmap reads swept over piece size × reader threads;
//! - the full path through the staging ring into device buffers, for the best direct and mmap
//!   settings and a few ring chunk sizes, as a fraction of the raw cold read.

use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::median;
use crate::flash::{
    DIRECT_ALIGN, FlashError, FlashFile, IoMode, ReaderOptions, Residency, evict_page_cache,
    format_size,
};
use crate::gpu::staging::StagingRing;
use crate::gpu::{GpuContext, GpuOptions};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Piece sizes of the sweep: 4 KiB to 16 MiB in powers of 4.
pub const SWEEP_CHUNKS: [usize; 7] = [
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
];
/// Reader threads of the sweep.
pub const SWEEP_THREADS: [usize; 4] = [1, 2, 4, 8];
/// Staging-ring chunk sizes tried for the full path.
pub const RING_CHUNKS: [u64; 3] = [1 << 20, 4 << 20, 16 << 20];
/// Staging-ring slots.
pub const RING_SLOTS: usize = 4;
/// Largest device buffer the full path fills.
pub const MAX_DST_BUFFER: u64 = 128 << 20;
/// Extra eviction attempts when pages stay cached.
const EVICT_RETRIES: usize = 5;
/// A sweep point whose first run takes longer than this is not repeated.
const REPEAT_UNDER_S: f64 = 0.5;

/// What to measure.
#[derive(Debug, Clone)]
pub struct IoBenchOptions {
    pub model: PathBuf,
    /// Bytes to read (capped at the tensor data region).
    pub bytes: u64,
    /// Repeats per measurement (the median is reported).
    pub repeats: usize,
    /// Measure the staging-ring path (needs a GPU adapter).
    pub gpu: Option<GpuOptions>,
}

/// One cold measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub mode: String,
    pub threads: usize,
    pub chunk: u64,
    /// Median GB/s (1e9 bytes per second) over `runs`.
    pub gb_s: f64,
    pub runs: usize,
    /// Bytes requested from storage per run (alignment overhead included).
    pub bytes_read: u64,
    /// Storage requests per run.
    pub reads: u64,
    /// Page-cache residency of the file before and after the eviction of the last run.
    pub residency: Residency,
    /// Whether every run of this point started from a cold cache.
    pub cold: bool,
}

/// One full-path measurement: flash → staging ring → device buffers.
#[derive(Debug, Clone, Serialize)]
pub struct RingPoint {
    pub mode: String,
    pub threads: usize,
    pub chunk: u64,
    pub ring_chunk: u64,
    pub ring_slots: usize,
    pub gb_s: f64,
    pub runs: usize,
    /// Seconds reading into staging memory / waiting for slots (median run).
    pub read_s: f64,
    pub wait_s: f64,
    /// `gb_s` over the raw cold read of this run.
    pub ratio_to_raw: f64,
    pub cold: bool,
}

/// Everything `bench io` measured.
#[derive(Debug, Clone, Serialize)]
pub struct IoReport {
    pub model: String,
    pub file_len: u64,
    /// Start of the measured range (the tensor data region, rounded up to 4 KiB).
    pub offset: u64,
    pub bytes: u64,
    pub repeats: usize,
    pub raw_cold: Point,
    pub sweep: Vec<Point>,
    /// The best direct setting again, into a destination whose address is not aligned with
    /// the file offset (every byte goes through a bounce buffer).
    pub direct_unaligned_dst: Option<Point>,
    pub best_direct: Option<Point>,
    pub best_mmap: Option<Point>,
    pub ring: Vec<RingPoint>,
    /// Best staging-ring GB/s over the raw cold-read GB/s.
    pub ring_over_raw: Option<f64>,
    pub adapter: Option<String>,
    /// Whether every eviction took effect.
    pub eviction_effective: bool,
    /// Evictions attempted and those that did not take effect.
    pub evictions: u64,
    pub evictions_failed: u64,
    pub notes: Vec<String>,
    pub seconds: f64,
}

/// A page-aligned host buffer (a `Vec` with its start skipped forward).
struct HostBuf {
    v: Vec<u8>,
    skew: usize,
    len: usize,
}

impl HostBuf {
    /// `len` bytes whose address is congruent to `phase` modulo 4096.
    fn new(len: usize, phase: usize) -> Self {
        let mut v = vec![0u8; len + 2 * DIRECT_ALIGN];
        // Touch every page now so the measured reads do not pay for first-touch faults.
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        let base = v.as_ptr() as usize % DIRECT_ALIGN;
        let skew = (DIRECT_ALIGN + phase % DIRECT_ALIGN - base) % DIRECT_ALIGN;
        Self { v, skew, len }
    }
    fn get(&mut self) -> &mut [u8] {
        &mut self.v[self.skew..self.skew + self.len]
    }
}

struct Cold {
    residency: Residency,
    cold: bool,
}

/// Evictions of a run and the notes to print.
#[derive(Debug, Default)]
struct Log {
    notes: Vec<String>,
    evictions: u64,
    failed: u64,
    worst_after: f64,
}

fn evict(path: &Path, log: &mut Log) -> BenchResult<Cold> {
    let mut r = evict_page_cache(path)?;
    // Another process may hold the file mapped for a moment (a test, a run): retry briefly.
    for _ in 0..EVICT_RETRIES {
        if r.effective() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let again = evict_page_cache(path)?;
        r = Residency {
            before: r.before,
            after: again.after,
        };
    }
    log.evictions += 1;
    if !r.effective() {
        log.failed += 1;
        log.worst_after = log.worst_after.max(r.after);
    }
    Ok(Cold {
        residency: r,
        cold: r.effective(),
    })
}

fn gbps(bytes: u64, s: f64) -> f64 {
    bytes as f64 / s.max(1e-9) / 1e9
}

/// Plain buffered `read` of the range into `buf` after an eviction.
fn raw_cold(
    path: &Path,
    offset: u64,
    buf: &mut [u8],
    repeats: usize,
    log: &mut Log,
) -> BenchResult<Point> {
    let mut v = Vec::new();
    let mut last = None;
    let mut cold = true;
    for _ in 0..repeats {
        let c = evict(path, log)?;
        cold &= c.cold;
        last = Some(c.residency);
        let mut f =
            std::fs::File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
        let t = Instant::now();
        f.seek(SeekFrom::Start(offset))
            .and_then(|_| f.read_exact(buf))
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        v.push(gbps(buf.len() as u64, t.elapsed().as_secs_f64()));
    }
    Ok(Point {
        mode: "raw read".into(),
        threads: 1,
        chunk: buf.len() as u64,
        gb_s: median(&mut v),
        runs: v.len(),
        bytes_read: buf.len() as u64,
        reads: 1,
        residency: last.unwrap_or(Residency {
            before: 0.0,
            after: 0.0,
        }),
        cold,
    })
}

/// Cold reads of the range with a [`FlashFile`] of the given options.
fn flash_point(
    path: &Path,
    opts: ReaderOptions,
    offset: u64,
    buf: &mut [u8],
    repeats: usize,
    log: &mut Log,
) -> BenchResult<Point> {
    let mut v = Vec::new();
    let mut cold = true;
    let mut last = Residency {
        before: 0.0,
        after: 0.0,
    };
    let (mut bytes_read, mut reads) = (0, 0);
    for r in 0..repeats.max(1) {
        let c = evict(path, log)?;
        cold &= c.cold;
        last = c.residency;
        let f = FlashFile::open(path, opts)?;
        if opts.mode == IoMode::Mmap {
            f.advise_sequential()?;
        }
        let t = Instant::now();
        f.read_into(offset, buf)?;
        let s = t.elapsed().as_secs_f64();
        v.push(gbps(buf.len() as u64, s));
        bytes_read = f.bytes_read();
        reads = f.reads();
        // Unmap before the next eviction: mapped pages cannot be evicted.
        drop(f);
        if r == 0 && s > REPEAT_UNDER_S {
            break;
        }
    }
    Ok(Point {
        mode: opts.mode.to_string(),
        threads: opts.threads,
        chunk: opts.chunk as u64,
        gb_s: median(&mut v),
        runs: v.len(),
        bytes_read,
        reads,
        residency: last,
        cold,
    })
}

/// Cold uploads of the range through a staging ring into device buffers.
#[allow(clippy::too_many_arguments)]
fn ring_point(
    ctx: &GpuContext,
    dst: &[crate::gpu::GpuBuffer],
    path: &Path,
    opts: ReaderOptions,
    ring_chunk: u64,
    offset: u64,
    bytes: u64,
    repeats: usize,
    raw_gb_s: f64,
    log: &mut Log,
) -> BenchResult<RingPoint> {
    let mut ring = StagingRing::new(ctx, RING_SLOTS, ring_chunk)?;
    let mut runs = Vec::new();
    let mut cold = true;
    for _ in 0..repeats.max(1) {
        let c = evict(path, log)?;
        cold &= c.cold;
        let f = FlashFile::open(path, opts)?;
        ctx.wait()?;
        let t = Instant::now();
        let mut stats = crate::gpu::staging::UploadStats::default();
        let mut done = 0u64;
        for b in dst {
            if done >= bytes {
                break;
            }
            let n = (bytes - done).min(b.size);
            stats.add(&ring.upload(ctx, &f, offset + done, n, b, 0)?);
            done += n;
        }
        ctx.wait()?;
        let s = t.elapsed().as_secs_f64();
        runs.push((gbps(bytes, s), stats));
        drop(f);
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (gb_s, stats) = runs[runs.len() / 2];
    Ok(RingPoint {
        mode: opts.mode.to_string(),
        threads: opts.threads,
        chunk: opts.chunk as u64,
        ring_chunk: ring.chunk_bytes(),
        ring_slots: ring.slots(),
        gb_s,
        runs: runs.len(),
        read_s: stats.read_s,
        wait_s: stats.wait_s,
        ratio_to_raw: gb_s / raw_gb_s.max(1e-12),
        cold,
    })
}

/// Run the whole benchmark; progress goes to stderr.
pub fn run(o: &IoBenchOptions) -> BenchResult<IoReport> {
    let t_all = Instant::now();
    let path = o.model.as_path();
    let repeats = o.repeats.max(1);
    // Parse the header for the data region, then let go of the map before measuring.
    let (data_offset, file_len) = {
        let g =
            crate::gguf::GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        (g.data_offset, g.file_len)
    };
    let offset = data_offset.next_multiple_of(DIRECT_ALIGN as u64);
    if offset >= file_len {
        return Err(format!("{} has no tensor data to read", path.display()).into());
    }
    if o.bytes == 0 {
        return Err("--bytes must be at least 1 byte".into());
    }
    let bytes = o.bytes.min(file_len - offset);
    let len = usize::try_from(bytes).map_err(|_| "--bytes does not fit in memory")?;
    let mut log = Log::default();
    if bytes < o.bytes {
        log.notes.push(format!(
            "--bytes capped at the tensor data of the file: {}",
            format_size(bytes)
        ));
    }
    eprintln!(
        "bench io: {} bytes at offset {offset} of {} ({} bytes)",
        bytes,
        path.display(),
        file_len
    );
    let mut buf = HostBuf::new(len, offset as usize);

    let raw = raw_cold(path, offset, buf.get(), repeats, &mut log)?;
    eprintln!("raw cold read: {:.3} GB/s", raw.gb_s);

    let mut sweep = Vec::new();
    for mode in [IoMode::Direct, IoMode::Mmap] {
        for &threads in &SWEEP_THREADS {
            for &chunk in &SWEEP_CHUNKS {
                let opts = ReaderOptions {
                    mode,
                    threads,
                    chunk,
                };
                match flash_point(path, opts, offset, buf.get(), repeats, &mut log) {
                    Ok(p) => {
                        eprintln!(
                            "{mode:>6} threads {threads} chunk {:>8}: {:.3} GB/s",
                            format_size(chunk as u64),
                            p.gb_s
                        );
                        sweep.push(p);
                    }
                    Err(e) if is_direct_unsupported(&*e) => {
                        log.notes.push(format!("direct I/O skipped: {e}"));
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            if mode == IoMode::Direct && sweep.is_empty() {
                break;
            }
        }
    }
    // Best among the cold points; among all when none was cold.
    let best = |m: IoMode| {
        let of_mode = || sweep.iter().filter(|p| p.mode == m.to_string());
        let any_cold = of_mode().any(|p| p.cold);
        of_mode()
            .filter(|p| p.cold || !any_cold)
            .max_by(|a, b| a.gb_s.total_cmp(&b.gb_s))
            .cloned()
    };
    let best_direct = best(IoMode::Direct);
    let best_mmap = best(IoMode::Mmap);

    // The best direct setting once more with every byte through bounce buffers.
    let direct_unaligned_dst = match &best_direct {
        Some(p) => {
            let mut skewed = HostBuf::new(len, offset as usize + 64);
            let opts = ReaderOptions {
                mode: IoMode::Direct,
                threads: p.threads,
                chunk: p.chunk as usize,
            };
            let mut q = flash_point(path, opts, offset, skewed.get(), repeats, &mut log)?;
            q.mode = "direct, unaligned dst".into();
            eprintln!("direct into an unaligned destination: {:.3} GB/s", q.gb_s);
            Some(q)
        }
        None => None,
    };
    drop(buf);

    let mut ring = Vec::new();
    let mut adapter = None;
    if let Some(gpu_opts) = &o.gpu {
        match GpuContext::new(gpu_opts) {
            Err(e) => log.notes.push(format!("staging-ring path skipped: {e}")),
            Ok(ctx) => {
                adapter = Some(ctx.describe());
                let part = MAX_DST_BUFFER.min(ctx.limits.max_buffer_size) / 16 * 16;
                let mut dst = Vec::new();
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(part);
                    dst.push(ctx.storage(&format!("bench-io-dst[{}]", dst.len()), n)?);
                    left -= n;
                }
                for b in [&best_direct, &best_mmap].into_iter().flatten() {
                    let opts = ReaderOptions {
                        mode: b.mode.parse()?,
                        threads: b.threads,
                        chunk: b.chunk as usize,
                    };
                    for &rc in &RING_CHUNKS {
                        let p = ring_point(
                            &ctx, &dst, path, opts, rc, offset, bytes, repeats, raw.gb_s, &mut log,
                        )?;
                        eprintln!(
                            "ring {} ({} threads, {} pieces), ring chunk {}: {:.3} GB/s = {:.2} × raw",
                            p.mode,
                            p.threads,
                            format_size(p.chunk),
                            format_size(p.ring_chunk),
                            p.gb_s,
                            p.ratio_to_raw
                        );
                        ring.push(p);
                    }
                }
            }
        }
    }
    let ring_over_raw = ring
        .iter()
        .map(|p| p.ratio_to_raw)
        .max_by(|a, b| a.total_cmp(b));
    if log.failed > 0 {
        log.notes.push(format!(
            "eviction did not take effect in {} of {} attempts (up to {:.0}% of the file still cached: pages mapped by another process, dirty, or no permission); those figures include page-cache hits",
            log.failed,
            log.evictions,
            log.worst_after * 100.0
        ));
    }
    let notes = log.notes;
    let eviction_effective = raw.cold
        && sweep.iter().all(|p| p.cold)
        && ring.iter().all(|p| p.cold)
        && direct_unaligned_dst.as_ref().is_none_or(|p| p.cold);
    Ok(IoReport {
        model: path.display().to_string(),
        file_len,
        offset,
        bytes,
        repeats,
        raw_cold: raw,
        sweep,
        direct_unaligned_dst,
        best_direct,
        best_mmap,
        ring,
        ring_over_raw,
        adapter,
        eviction_effective,
        evictions: log.evictions,
        evictions_failed: log.failed,
        notes,
        seconds: t_all.elapsed().as_secs_f64(),
    })
}

fn is_direct_unsupported(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        e.downcast_ref::<FlashError>(),
        Some(FlashError::DirectUnsupported { .. })
    )
}

impl IoReport {
    /// Markdown: a summary table and the sweep grid (GB/s).
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let cold = |c: bool| if c { "yes" } else { "**no**" };
        let _ = writeln!(
            s,
            "bench io: {} of {} at offset {} (medians of up to {} runs, cold page cache)\n",
            format_size(self.bytes),
            self.model,
            self.offset,
            self.repeats
        );
        let _ = writeln!(s, "| path | setting | GB/s | × raw | cold |");
        let _ = writeln!(s, "|---|---|---|---|---|");
        let r = &self.raw_cold;
        let _ = writeln!(
            s,
            "| raw cold read | one {} read (residency {:.2} → {:.2}) | {:.3} | 1.00 | {} |",
            format_size(r.chunk),
            r.residency.before,
            r.residency.after,
            r.gb_s,
            cold(r.cold)
        );
        let raw = r.gb_s.max(1e-12);
        for (name, p) in [
            ("best direct", &self.best_direct),
            ("best mmap", &self.best_mmap),
            ("direct, unaligned dst", &self.direct_unaligned_dst),
        ] {
            if let Some(p) = p {
                let _ = writeln!(
                    s,
                    "| {name} | {} threads, {} pieces | {:.3} | {:.2} | {} |",
                    p.threads,
                    format_size(p.chunk),
                    p.gb_s,
                    p.gb_s / raw,
                    cold(p.cold)
                );
            }
        }
        for p in &self.ring {
            let _ = writeln!(
                s,
                "| staging ring ({}) | {} threads, {} pieces, {} × {} ring | {:.3} | {:.2} | {} |",
                p.mode,
                p.threads,
                format_size(p.chunk),
                p.ring_slots,
                format_size(p.ring_chunk),
                p.gb_s,
                p.ratio_to_raw,
                cold(p.cold)
            );
        }
        match self.ring_over_raw {
            Some(x) => {
                let _ = writeln!(
                    s,
                    "\nstaging ring / raw cold read: {x:.2} (best ring GB/s over the raw cold-read GB/s of this run; adapter: {})",
                    self.adapter.as_deref().unwrap_or("?")
                );
            }
            None => {
                let _ = writeln!(s, "\nstaging ring: not measured");
            }
        }
        if !self.sweep.is_empty() {
            let _ = writeln!(
                s,
                "\nsweep, GB/s (piece size across, mode × threads down):\n"
            );
            let _ = write!(s, "| mode | threads |");
            for c in SWEEP_CHUNKS {
                let _ = write!(s, " {} |", format_size(c as u64));
            }
            let _ = write!(s, "\n|---|---|");
            for _ in SWEEP_CHUNKS {
                let _ = write!(s, "---|");
            }
            let _ = writeln!(s);
            for (mode, threads) in self.series() {
                let _ = write!(s, "| {mode} | {threads} |");
                for c in SWEEP_CHUNKS {
                    match self
                        .sweep
                        .iter()
                        .find(|p| p.mode == mode && p.threads == threads && p.chunk == c as u64)
                    {
                        Some(p) => {
                            let _ = write!(s, " {:.3}{} |", p.gb_s, if p.cold { "" } else { "*" });
                        }
                        None => {
                            let _ = write!(s, " - |");
                        }
                    }
                }
                let _ = writeln!(s);
            }
        }
        if !self.eviction_effective {
            let _ = writeln!(
                s,
                "\n**eviction did not take effect for some runs (marked no / *): those figures include page-cache hits; best settings are chosen among cold runs**"
            );
        }
        for n in &self.notes {
            let _ = writeln!(s, "\nnote: {n}");
        }
        s
    }

    /// (mode, threads) pairs of the sweep, in order.
    fn series(&self) -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = Vec::new();
        for p in &self.sweep {
            let k = (p.mode.clone(), p.threads);
            if !v.contains(&k) {
                v.push(k);
            }
        }
        v
    }

    /// An SVG line plot: GB/s against piece size (log scale), one line per mode × threads,
    /// the raw cold read as a dashed line.
    pub fn to_svg(&self) -> String {
        let (w, h) = (820.0f64, 500.0f64);
        let (l, r, t, b) = (70.0, 190.0, 40.0, 60.0);
        let pw = w - l - r;
        let ph = h - t - b;
        let ymax_data = self
            .sweep
            .iter()
            .map(|p| p.gb_s)
            .chain([self.raw_cold.gb_s])
            .chain(self.ring.iter().map(|p| p.gb_s))
            .fold(0.0f64, f64::max);
        let ymax = nice_ceiling(ymax_data.max(1e-3));
        let x0 = (SWEEP_CHUNKS[0] as f64).log2();
        let x1 = (SWEEP_CHUNKS[SWEEP_CHUNKS.len() - 1] as f64).log2();
        let xp = |c: f64| l + (c.log2() - x0) / (x1 - x0) * pw;
        let yp = |g: f64| t + ph - (g / ymax).clamp(0.0, 1.05) * ph;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="14">Cold reads of {} from {}</text>"#,
            l + pw / 2.0,
            format_size(self.bytes),
            xml_escape(
                Path::new(&self.model)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("model")
            )
        );
        // Grid and axes.
        for i in 0..=5 {
            let g = ymax * i as f64 / 5.0;
            let y = yp(g);
            let _ = writeln!(
                s,
                r##"<line x1="{l}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                l + pw,
                l - 6.0,
                y + 4.0,
                trim_num(g)
            );
        }
        for &c in &SWEEP_CHUNKS {
            let x = xp(c as f64);
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{t}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                t + ph,
                t + ph + 18.0,
                format_size(c as u64).replace(' ', "")
            );
        }
        let _ = writeln!(
            s,
            r#"<rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">piece size (bytes per read request)</text>"#,
            l + pw / 2.0,
            h - 18.0
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle">GB/s</text>"#,
            t + ph / 2.0
        );
        // Raw cold read.
        let yr = yp(self.raw_cold.gb_s);
        let _ = writeln!(
            s,
            r#"<line x1="{l}" y1="{yr:.1}" x2="{:.1}" y2="{yr:.1}" stroke="black" stroke-dasharray="6 4"/>"#,
            l + pw
        );
        // One polyline per mode × threads.
        const DIRECT: [&str; 4] = ["#9ecae1", "#4292c6", "#2171b5", "#08306b"];
        const MMAP: [&str; 4] = ["#fdae6b", "#f16913", "#d94801", "#7f2704"];
        let mut legend = vec![(
            "raw cold read".to_string(),
            "black".to_string(),
            "6 4".to_string(),
        )];
        for (i, (mode, threads)) in self.series().into_iter().enumerate() {
            let ti = SWEEP_THREADS
                .iter()
                .position(|&x| x == threads)
                .unwrap_or(i % 4);
            let color = if mode == "direct" {
                DIRECT[ti % 4]
            } else {
                MMAP[ti % 4]
            };
            let dash = if mode == "direct" { "" } else { "2 2" };
            let pts: Vec<String> = self
                .sweep
                .iter()
                .filter(|p| p.mode == mode && p.threads == threads)
                .map(|p| format!("{:.1},{:.1}", xp(p.chunk as f64), yp(p.gb_s)))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>"#,
                pts.join(" ")
            );
            for p in pts {
                let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
                let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="2.5" fill="{color}"/>"#);
            }
            legend.push((
                format!(
                    "{mode}, {threads} thread{}",
                    if threads == 1 { "" } else { "s" }
                ),
                color.to_string(),
                dash.to_string(),
            ));
        }
        for (i, (name, color, dash)) in legend.iter().enumerate() {
            let y = t + 10.0 + i as f64 * 18.0;
            let x = l + pw + 14.0;
            let _ = writeln!(
                s,
                r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="{}">{}</text>"#,
                x + 24.0,
                x + 30.0,
                y + 4.0,
                xml_escape(name)
            );
        }
        let _ = writeln!(s, "</svg>");
        s
    }
}

/// 1, 2 or 5 times a power of ten, at least `v`.
fn nice_ceiling(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

fn trim_num(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() { "0".into() } else { s.into() }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(0.7), 1.0);
        assert_eq!(nice_ceiling(1.3), 2.0);
        assert_eq!(nice_ceiling(3.0), 5.0);
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(trim_num(0.4), "0.4");
        assert_eq!(trim_num(0.0), "0");
        assert_eq!(xml_escape("a<b&\"c\">"), "a&lt;b&amp;&quot;c&quot;&gt;");
    }
}
