//! The machine constants the performance model reads: what `flashlm calibrate` measures and
//! saves, and the rates it derives from them (flash by piece size, products by shape, overlap by
//! layer size).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::work::MatrixWork;

mod points;
pub use points::{FlashRate, MAX_MEASURED_ROWS, MatmulPoint, OverlapPoint, PrefillPoint};
use points::{bounded_factor, factors, log_interp, sized_factor};

/// Constants measured on one machine and adapter.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Calibration {
    pub adapter: String,
    /// Flash GB/s by (mode, piece bytes, threads), cold.
    pub flash: Vec<FlashRate>,
    /// Staging memory to device buffers, GB/s.
    pub upload_gb_s: f64,
    /// Host memory to host memory, GB/s: the copies the I/O thread makes of bytes it did not
    /// read from flash (host-cache hits into their slot or staging, KV pages through a host
    /// buffer into staging). 0 in profiles from before it was measured: not priced.
    #[serde(default)]
    pub host_copy_gb_s: f64,
    /// Decode (one token) matrix-vector GB/s of weight bytes, by weight type name.
    pub matvec_gb_s: BTreeMap<String, f64>,
    /// Prefill matrix product: weight GB/s × tokens (bytes × tokens ÷ seconds), by type name.
    pub prefill_gb_s: BTreeMap<String, f64>,
    /// Matrix-product rates by type and shape: the calibrated model's own matrices, and every
    /// type the kernels read on synthetic ones (empty in profiles from before they were
    /// measured: the per-type rates above stand in).
    #[serde(default)]
    pub matmul_points: Vec<MatmulPoint>,
    /// Seconds per dispatch (launch cost).
    pub dispatch_s: f64,
    /// Seconds a pass loses at one wait for a selecting layer's page scores: at least one host
    /// round trip beyond its dispatch (a submission with one dispatch and a copy into a
    /// mappable buffer, mapped and waited for), and, where more, what a resident run with page
    /// selection took beyond the same run attending every page, less the model's gap between
    /// the two, per wait (the device idles while the host ranks the pages and submits the rest
    /// of the layer). 0 in profiles from before it was measured.
    #[serde(default)]
    pub sync_s: f64,
    /// Attention: KV bytes read per second (decode: one row).
    pub attn_gb_s: f64,
    /// Prefill attention: KV bytes per second summed over a batch's rows (each row counts the
    /// keys it attends; the row-tiled kernel reads them once per tile). 0 in profiles from
    /// before it was measured: `attn_gb_s` stands in.
    #[serde(default)]
    pub prefill_attn_gb_s: f64,
    /// Page selection's kernels in one selecting layer of a decode step (the page summaries
    /// and the pages' scores) beyond their two dispatches. None in profiles from before it was
    /// measured: priced as their dispatches.
    #[serde(default)]
    pub select: Option<SelectCost>,
    /// Overlap of compute and I/O in the pipeline (0 perfect, 1 none), on the calibrated
    /// model.
    pub overlap_beta: f64,
    /// The unhidden share of the I/O thread's host memory copies (0: hidden behind compute
    /// like reads, 1: added to the token whole), measured on a streamed run whose host cache
    /// holds every streamed weight byte. Where the device computes on the host's cores (a CPU
    /// rasterizer) a copy takes a core the kernels run on. 0 in profiles from before it was
    /// measured.
    #[serde(default)]
    pub copy_beta: f64,
    /// The overlap measured on streamed layers of several sizes (empty in profiles from
    /// before: `overlap_beta` holds for every size).
    #[serde(default)]
    pub overlap_points: Vec<OverlapPoint>,
    /// A decode pass's device time over what the kernel rates above add up to for it, measured
    /// on a resident run: inside a pass the kernels run slower than alone (caches shared with
    /// the copies and the host threads, small kernels between the products). 1 in profiles
    /// from before it was measured.
    #[serde(default = "one")]
    pub compute_scale: f64,
    /// The same for a prefill: a resident run's time to first token over what the prefill
    /// rates above add up to for it (on lavapipe a pass's prefill ran faster than its matrices
    /// timed one at a time: every time to first token of the default model was predicted
    /// 18-33% over without it). 1 in profiles from before it was measured.
    #[serde(default = "one")]
    pub prefill_scale: f64,
    /// The prefill factor measured on models of several sizes (empty in profiles from before:
    /// `prefill_scale` holds for every size): on lavapipe a pass's prefill ran faster than its
    /// matrices timed alone on the default model's small matrices, and slower on large ones.
    #[serde(default)]
    pub prefill_points: Vec<PrefillPoint>,
    /// The decode's factor measured on models of several sizes, as `prefill_points` (empty in
    /// profiles from before: `compute_scale` holds for every size).
    #[serde(default)]
    pub compute_points: Vec<PrefillPoint>,
    /// What the calibrated device does that changes the plan (None in profiles from before
    /// it was recorded): `flashlm plan` then plans as `run` would on it.
    #[serde(default)]
    pub device: Option<DeviceFacts>,
    /// The machine's speed when these constants were measured, by the short probe a bench
    /// takes again before each run ([`Calibration::rescaled`]). None in profiles from before.
    #[serde(default)]
    pub probe: Option<Probe>,
}

/// Nothing measured: no rates, in-pass factors of 1, nothing fitted. `calibrate` fills in what
/// it measures; tests state the constants they need.
impl Default for Calibration {
    fn default() -> Self {
        Self {
            adapter: String::new(),
            flash: Vec::new(),
            upload_gb_s: 0.0,
            host_copy_gb_s: 0.0,
            matvec_gb_s: BTreeMap::new(),
            prefill_gb_s: BTreeMap::new(),
            matmul_points: Vec::new(),
            dispatch_s: 0.0,
            sync_s: 0.0,
            attn_gb_s: 0.0,
            prefill_attn_gb_s: 0.0,
            select: None,
            overlap_beta: 0.0,
            copy_beta: 0.0,
            overlap_points: Vec::new(),
            compute_scale: 1.0,
            prefill_scale: 1.0,
            prefill_points: Vec::new(),
            compute_points: Vec::new(),
            device: None,
            probe: None,
        }
    }
}

/// What page selection's kernels cost in one selecting layer of a decode step, beyond their
/// dispatches: a fixed part and a part per page scored.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct SelectCost {
    pub layer_s: f64,
    pub page_s: f64,
}

impl SelectCost {
    /// Seconds for `layers` selecting layers scoring `pages` pages in all.
    pub fn seconds(&self, layers: u64, pages: u64) -> f64 {
        layers as f64 * self.layer_s + pages as f64 * self.page_s
    }
}

/// A short measure of the machine's speed: a few resident decode steps of the calibrated model
/// and cold direct reads of its file at two piece sizes. Taken once with the calibration and
/// again just before a run, the two say how much faster or slower the machine runs now (a
/// shared VM's speed moves by a factor of two or more from one hour to the next).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Probe {
    /// The calibrated model's file (the probe decodes it again).
    pub model: String,
    /// Resident decode of the calibrated model, ms/token.
    pub resident_ms: f64,
    /// Cold direct reads by one thread, GB/s, of pieces of [`PROBE_SMALL_PIECE`] and
    /// [`PROBE_LARGE_PIECE`] bytes.
    pub flash_small_gb_s: f64,
    pub flash_large_gb_s: f64,
}

/// The probe's two read sizes: a KV run's order of size, and a streamed layer's.
pub const PROBE_SMALL_PIECE: u64 = 64 << 10;
pub const PROBE_LARGE_PIECE: u64 = 1 << 20;

/// How far one probe may move a constant (a probe that failed, or a machine stalled for a
/// moment, should not turn a prediction into nonsense).
const PROBE_RATIO_BOUNDS: (f64, f64) = (0.2, 5.0);

fn probe_ratio(now: f64, then: f64) -> f64 {
    if now.is_finite() && then.is_finite() && now > 0.0 && then > 0.0 {
        (now / then).clamp(PROBE_RATIO_BOUNDS.0, PROBE_RATIO_BOUNDS.1)
    } else {
        1.0
    }
}

/// Facts of the calibrated device that the plan depends on.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct DeviceFacts {
    /// Largest storage binding, bytes.
    pub max_binding: u64,
    /// `--upload auto` writes streamed weights in place into mappable slots.
    pub auto_in_place: bool,
    /// The matrix kernels apply the layers' RMSNorms themselves.
    pub fuse_norms: bool,
    /// Decode attention applies RoPE and stores the new key and value itself (profiles without
    /// it: no).
    #[serde(default)]
    pub fuse_rope: bool,
    /// Storage binding offsets must be multiples of this (profiles without it: 256).
    #[serde(default = "default_bind_align")]
    pub bind_align: u64,
    /// Worker threads of a software rasterizer (`LP_NUM_THREADS`) while it was calibrated;
    /// None on other adapters and in profiles from before it was recorded.
    #[serde(default)]
    pub driver_threads: Option<u32>,
}

fn default_bind_align() -> u64 {
    256
}

/// Write `value` as pretty JSON to `path` through a temporary file beside it (a reader never
/// sees half a file), creating the directory.
pub(super) fn save_json<T: Serialize>(value: &T, path: &Path) -> Result<(), String> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(&tmp, text).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("writing {}: {e}", path.display()))
}

fn one() -> f64 {
    1.0
}

impl Calibration {
    /// These constants carried to the machine's speed of `now`: the in-pass compute factors
    /// times the resident decode's slowdown since the calibration's probe (the matrix rates
    /// stay as measured; only the factor the pass puts on them moves), the attention rates
    /// (which take no factor) divided by it, and every flash rate
    /// times the read speed's change at the nearer of the probe's two piece sizes (in log2).
    /// Unchanged when the calibration has no probe of its own.
    pub fn rescaled(&self, now: &Probe) -> Calibration {
        let mut c = self.clone();
        let Some(then) = &self.probe else {
            return c;
        };
        let slowdown = probe_ratio(now.resident_ms, then.resident_ms);
        c.compute_scale = self.compute_scale * slowdown;
        c.prefill_scale = self.prefill_scale * slowdown;
        c.attn_gb_s = self.attn_gb_s / slowdown;
        c.prefill_attn_gb_s = self.prefill_attn_gb_s / slowdown;
        c.select = self.select.map(|s| SelectCost {
            layer_s: s.layer_s * slowdown,
            page_s: s.page_s * slowdown,
        });
        for p in c
            .prefill_points
            .iter_mut()
            .chain(c.compute_points.iter_mut())
        {
            p.scale *= slowdown;
        }
        let small = probe_ratio(now.flash_small_gb_s, then.flash_small_gb_s);
        let large = probe_ratio(now.flash_large_gb_s, then.flash_large_gb_s);
        let mid = ((PROBE_SMALL_PIECE as f64).log2() + (PROBE_LARGE_PIECE as f64).log2()) / 2.0;
        for f in &mut c.flash {
            f.gb_s *= if (f.piece.max(1) as f64).log2() < mid {
                small
            } else {
                large
            };
        }
        c.probe = Some(now.clone());
        c
    }

    /// The in-pass compute factor, within sane bounds.
    pub fn compute_factor(&self) -> f64 {
        bounded_factor(self.compute_scale)
    }

    /// The decode's factor for a model whose decode step reads `pass_bytes` of matrix weights:
    /// from [`Calibration::compute_points`] on a log scale of size, else
    /// [`Calibration::compute_factor`]; bounded as it is.
    pub fn compute_factor_for(&self, pass_bytes: u64) -> f64 {
        sized_factor(&self.compute_points, pass_bytes, self.compute_scale)
    }

    /// [`Calibration::prefill_scale`], bounded as [`Calibration::compute_factor`] is.
    pub fn prefill_factor(&self) -> f64 {
        bounded_factor(self.prefill_scale)
    }

    /// The prefill factor for a model whose decode step reads `pass_bytes` of matrix weights:
    /// from [`Calibration::prefill_points`] on a log scale of size, else
    /// [`Calibration::prefill_factor`]; bounded as it is.
    pub fn prefill_factor_for(&self, pass_bytes: u64) -> f64 {
        sized_factor(&self.prefill_points, pass_bytes, self.prefill_scale)
    }

    /// Where calibration profiles live.
    pub fn path() -> PathBuf {
        crate::paths::cache_dir().join("calibration.json")
    }

    /// The prefill attention rate (the decode one where the profile has none).
    pub fn prefill_attn(&self) -> f64 {
        if self.prefill_attn_gb_s > 0.0 {
            self.prefill_attn_gb_s
        } else {
            self.attn_gb_s
        }
    }

    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The profile as a markdown table: the fastest cold read of each mode (with its piece size
    /// and threads), and every other constant.
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "adapter {}\n\n| constant | value |\n|---|---|\n",
            self.adapter
        );
        for mode in ["direct", "mmap"] {
            if let Some(best) = self
                .flash
                .iter()
                .filter(|r| r.mode == mode)
                .max_by(|a, b| a.gb_s.total_cmp(&b.gb_s))
            {
                s.push_str(&format!(
                    "| cold read, {mode}, fastest setting | {:.3} GB/s ({} KiB pieces, {} threads; {} settings measured) |\n",
                    best.gb_s,
                    best.piece / 1024,
                    best.threads,
                    self.flash.iter().filter(|r| r.mode == mode).count()
                ));
            }
        }
        s.push_str(&format!(
            "| staging to device copy | {:.3} GB/s |\n",
            self.upload_gb_s
        ));
        let mut types: Vec<&str> = self.matmul_points.iter().map(|p| p.ty.as_str()).collect();
        types.sort_unstable();
        types.dedup();
        for ty in types {
            let mut pts: Vec<&MatmulPoint> =
                self.matmul_points.iter().filter(|p| p.ty == ty).collect();
            pts.sort_by_key(|p| p.bytes);
            let list = |f: fn(&MatmulPoint) -> f64| {
                pts.iter()
                    .map(|p| {
                        let mark = if p.model { "*" } else { "" };
                        format!("{:.3} ({} x {}{mark})", f(p), p.rows, p.cols)
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            s.push_str(&format!(
                "| matrix product, {ty}: decode, GB/s of weights | {} |\n| matrix product, {ty}: prefill, GB/s of weights × tokens | {} |\n",
                list(|p| p.decode_gb_s),
                list(|p| p.prefill_gb_s)
            ));
        }
        if self.matmul_points.is_empty() {
            for (ty, v) in &self.matvec_gb_s {
                s.push_str(&format!(
                    "| decode product, {ty} | {v:.3} GB/s of weights |\n"
                ));
            }
            for (ty, v) in &self.prefill_gb_s {
                s.push_str(&format!(
                    "| prefill product, {ty} | {v:.3} GB/s of weights × tokens |\n"
                ));
            }
        }
        s.push_str(&format!(
            "| host memory copy | {} |\n| dispatch | {:.1} µs each |\n| host round trip (submit, map, wait) | {:.1} µs |\n| attention, decode | {:.3} GB/s of KV |\n| attention, prefill | {:.3} GB/s of KV over the rows |\n| page selection, a selecting layer beyond its dispatches | {} |\n| unhidden share of the overlap (β) | {} |\n| unhidden share of host memory copies | {:.2} |\n| decode pass in place of its kernels (resident run ÷ the rates above) | {} |\n| prefill in place of its kernels (resident time to first token ÷ the rates above) | {} |\n",
            if self.host_copy_gb_s > 0.0 {
                format!("{:.2} GB/s", self.host_copy_gb_s)
            } else {
                "not measured".to_string()
            },
            self.dispatch_s * 1e6,
            self.sync_s * 1e6,
            self.attn_gb_s,
            self.prefill_attn(),
            match self.select {
                Some(c) => format!(
                    "{:.1} µs + {:.2} µs a page scored",
                    c.layer_s * 1e6,
                    c.page_s * 1e6
                ),
                None => "not measured".to_string(),
            },
            if self.overlap_points.is_empty() {
                format!("{:.2}", self.overlap_beta)
            } else {
                let mut pts = self.overlap_points.clone();
                pts.sort_by_key(|p| p.layer_bytes);
                pts.iter()
                    .map(|p| format!("{:.2} (streamed layers of {:.1} MB)", p.beta, p.layer_bytes as f64 / 1e6))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            self.copy_beta,
            factors(&self.compute_points, self.compute_factor()),
            factors(&self.prefill_points, self.prefill_factor()),
        ));
        if let Some(d) = self.device {
            s.push_str(&format!(
                "| device | bindings up to {} MiB; --upload auto: {}; norms applied by the products: {}; RoPE applied by decode attention: {}{} |\n",
                d.max_binding >> 20,
                if d.auto_in_place { "in place" } else { "staging ring" },
                if d.fuse_norms { "yes" } else { "no" },
                if d.fuse_rope { "yes" } else { "no" },
                d.driver_threads
                    .map(|n| format!("; {n} driver threads"))
                    .unwrap_or_default()
            ));
        }
        if let Some(p) = &self.probe {
            s.push_str(&format!(
                "| speed probe (benches compare theirs with it) | resident decode {:.1} ms/token; direct reads {:.2} GB/s (64 KiB pieces), {:.2} GB/s (1 MiB) |\n",
                p.resident_ms, p.flash_small_gb_s, p.flash_large_gb_s
            ));
        }
        s
    }

    pub fn save(&self, path: &Path) -> Result<(), String> {
        save_json(self, path)
    }

    /// Seconds to copy `bytes` in host memory (0 when the copy rate was not measured).
    pub fn host_copy_s(&self, bytes: f64) -> f64 {
        if self.host_copy_gb_s > 0.0 && self.host_copy_gb_s.is_finite() {
            bytes / (self.host_copy_gb_s * 1e9)
        } else {
            0.0
        }
    }

    /// Flash GB/s for reads in `mode` ("direct"/"mmap") with `threads` readers of `piece`
    /// bytes: the measured point nearest in log2(piece), then in threads, read as the median
    /// of it and the points of the next smaller and the next larger piece at its thread count.
    /// Each point is one timing on a shared machine, where one of them can read 20% off its
    /// neighbours; in a run of points that rise or fall with the piece size the median is the
    /// point itself.
    pub fn flash_gb_s(&self, mode: &str, piece: u64, threads: usize) -> f64 {
        let lp = (piece.max(1) as f64).log2();
        let dist = |f: &FlashRate| {
            ((f.piece as f64).log2() - lp).abs() * 8.0 + (f.threads as f64 - threads as f64).abs()
        };
        let Some(near) = self
            .flash
            .iter()
            .filter(|f| f.mode == mode)
            .min_by(|a, b| dist(a).total_cmp(&dist(b)))
        else {
            return 1.0;
        };
        let row = self
            .flash
            .iter()
            .filter(|f| f.mode == mode && f.threads == near.threads);
        let below = row
            .clone()
            .filter(|f| f.piece < near.piece)
            .max_by_key(|f| f.piece);
        let above = row.filter(|f| f.piece > near.piece).min_by_key(|f| f.piece);
        match (below, above) {
            (Some(a), Some(b)) => {
                let mut v = [a.gb_s, near.gb_s, b.gb_s];
                v.sort_by(f64::total_cmp);
                v[1]
            }
            _ => near.gb_s,
        }
    }

    /// GB/s of a matrix product (decode, or prefill per token) on `m`: the point measured on
    /// its shape (rows capped at [`MAX_MEASURED_ROWS`]); else interpolated between its type's
    /// points in log(bytes), held at the ends; else the per-type rate.
    pub fn product_gb_s(&self, m: &MatrixWork, prefill: bool) -> f64 {
        let rate = |p: &MatmulPoint| {
            if prefill {
                p.prefill_gb_s
            } else {
                p.decode_gb_s
            }
        };
        let rows = m.rows.min(MAX_MEASURED_ROWS) as u32;
        let mut pts: Vec<&MatmulPoint> = self
            .matmul_points
            .iter()
            .filter(|p| p.ty == m.ty && rate(p) > 0.0 && p.bytes > 0)
            .collect();
        if let Some(p) = pts
            .iter()
            .find(|p| p.rows == rows && p.cols as u64 == m.cols)
        {
            return rate(p).max(1e-6);
        }
        if pts.is_empty() {
            let map = if prefill {
                &self.prefill_gb_s
            } else {
                &self.matvec_gb_s
            };
            return Self::rate(map, &m.ty);
        }
        pts.sort_by_key(|p| p.bytes);
        let x = (m.bytes.max(1) as f64).ln();
        let (first, last) = (pts[0], pts[pts.len() - 1]);
        if x <= (first.bytes as f64).ln() {
            return rate(first).max(1e-6);
        }
        for w in pts.windows(2) {
            let (a, b) = ((w[0].bytes as f64).ln(), (w[1].bytes as f64).ln());
            if x <= b && b > a {
                let f = (x - a) / (b - a);
                return (rate(w[0]) + f * (rate(w[1]) - rate(w[0]))).max(1e-6);
            }
        }
        rate(last).max(1e-6)
    }

    /// β for streamed layers of `layer_bytes`: interpolated between the measured sizes in
    /// log(bytes), held at the ends (`overlap_beta` without sizes).
    pub fn beta_for(&self, layer_bytes: u64) -> f64 {
        let pts: Vec<(u64, f64)> = self
            .overlap_points
            .iter()
            .map(|p| (p.layer_bytes, p.beta))
            .collect();
        let b = log_interp(&pts, layer_bytes).unwrap_or(self.overlap_beta);
        b.clamp(0.0, 1.0)
    }

    /// Seconds of the matrix products `ms` (decode; prefill: per token).
    pub fn products_s(&self, ms: &[MatrixWork], prefill: bool) -> f64 {
        ms.iter()
            .map(|m| m.bytes as f64 / (self.product_gb_s(m, prefill) * 1e9))
            .sum()
    }

    fn rate(map: &BTreeMap<String, f64>, ty: &str) -> f64 {
        map.get(ty)
            .copied()
            .or_else(|| {
                // An unmeasured type: the slowest measured one.
                map.values().copied().reduce(f64::min)
            })
            .unwrap_or(1.0)
            .max(1e-6)
    }
}

#[cfg(test)]
pub(crate) mod tests;
