//! What `bench io` reports ([`IoReport`], with its [`Point`]s and [`RingPoint`]s) and how it
//! is written out: a Markdown summary and sweep grid, and an SVG plot of the sweep.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::{SWEEP_CHUNKS, SWEEP_THREADS};
use crate::flash::{Residency, format_size};

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
