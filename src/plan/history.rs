//! The machine's recent calibrations, and the one predictions read.
//!
//! A shared machine's speed switches between regimes within minutes (on the 2-core VM this
//! project is benchmarked on, a resident decode step took about 75 ms in one stretch and 180 ms
//! in the next). One calibration that catches a slow stretch while it fits its in-pass compute
//! factor puts every prediction made from it far over the runs that follow. `flashlm calibrate`
//! therefore keeps its last few calibrations of the same adapter and model from the last hour,
//! and saves as the profile the whole calibration (every constant from the same minutes, so
//! that each factor stays paired with the rates it was fitted on) whose machine speed is the
//! median of theirs.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::calibration::Calibration;

/// Calibrations kept.
pub const KEEP: usize = 5;
/// Calibrations older than this, before the newest, are dropped (seconds). The median outvotes
/// a slow stretch of minutes; over hours the machine's speed itself moves (on the VM the
/// benchmarks run on, a resident decode took 60-66 ms/token for hours and then 44-46 from one
/// hour to the next), and calibrations from before such a move would outvote the new ones.
pub const MAX_AGE_S: u64 = 3600;

/// The way `calibrate` measures now; a calibration measured another way (older entries read as
/// 0) is dropped from the history, so that it never outvotes the new ones. 1: flash sweep
/// points read a little outside their range, untimed, before their timed read.
pub const METHOD: u32 = 1;

/// One calibration and the machine's speed while it was measured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    /// When it was measured, seconds since the Unix epoch.
    pub at: u64,
    /// How it was measured ([`METHOD`] when it was).
    #[serde(default)]
    pub method: u32,
    /// The resident decode the in-pass compute factor was fitted on, ms/token (median of the
    /// calibration's runs): the machine's speed while the constants were measured.
    pub resident_ms: f64,
    pub calibration: Calibration,
}

impl Entry {
    /// The calibrated model's file, where the calibration recorded it.
    fn model(&self) -> Option<&str> {
        self.calibration.probe.as_ref().map(|p| p.model.as_str())
    }

    /// The software rasterizer's worker threads while it was measured (None elsewhere).
    fn driver_threads(&self) -> Option<u32> {
        self.calibration.device.and_then(|d| d.driver_threads)
    }

    /// `at` as HH:MM UTC.
    pub fn time_of_day(&self) -> String {
        let s = self.at % 86_400;
        format!("{:02}:{:02}", s / 3600, s % 3600 / 60)
    }
}

/// The recent calibrations, oldest first.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct History {
    pub entries: Vec<Entry>,
}

impl History {
    /// Where the history lives, beside the profile.
    pub fn path() -> PathBuf {
        crate::paths::cache_dir().join("calibration-history.json")
    }

    /// The history at `path`; none (empty) where the file does not exist.
    pub fn load(path: &Path) -> Result<Self, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(format!("reading {}: {e}", path.display())),
        }
    }

    pub fn save(&self, path: &Path) -> Result<(), String> {
        super::calibration::save_json(self, path)
    }

    /// Add `e` as the newest, keeping the last [`KEEP`] calibrations of its adapter, model and
    /// driver threads measured at most [`MAX_AGE_S`] before it (a calibration with no speed of
    /// its own is dropped: it cannot be ranked).
    pub fn push(&mut self, e: Entry) {
        let newest = e.at;
        self.entries.retain(|o| {
            o.calibration.adapter == e.calibration.adapter
                && o.model() == e.model()
                && o.driver_threads() == e.driver_threads()
                && o.method == e.method
                && o.at <= newest
                && newest - o.at <= MAX_AGE_S
                && o.resident_ms.is_finite()
                && o.resident_ms > 0.0
        });
        self.entries.push(e);
        let extra = self.entries.len().saturating_sub(KEEP);
        self.entries.drain(..extra);
    }

    /// The calibration whose machine speed is the median of the kept ones (of the two middle
    /// ones, the faster); the newest where none has a speed.
    pub fn median(&self) -> Option<&Entry> {
        let mut ranked: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.resident_ms.is_finite() && e.resident_ms > 0.0)
            .collect();
        if ranked.is_empty() {
            return self.entries.last();
        }
        ranked.sort_by(|a, b| a.resident_ms.total_cmp(&b.resident_ms));
        Some(ranked[(ranked.len() - 1) / 2])
    }

    /// One markdown line: which calibration is saved and the speeds it was chosen among.
    pub fn describe(&self, saved: &Entry) -> String {
        let all: Vec<String> = self
            .entries
            .iter()
            .map(|e| format!("{:.1} ({})", e.resident_ms, e.time_of_day()))
            .collect();
        if self.entries.len() <= 1 {
            return format!(
                "Saved for predictions: this calibration, the first of this adapter and model in the history (resident decode while it fitted its compute factor, ms/token: {}).",
                all.join(", ")
            );
        }
        format!(
            "Saved for predictions: the calibration of {} UTC{}, the median by machine speed of the last {} of this adapter and model (resident decode while each fitted its compute factor, ms/token: {}).",
            saved.time_of_day(),
            if self.entries.last() == Some(saved) {
                " (the one above)"
            } else {
                " (below)"
            },
            self.entries.len(),
            all.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::calibration::tests::cal;

    fn entry(at: u64, resident_ms: f64, adapter: &str) -> Entry {
        let mut c = cal();
        c.adapter = adapter.into();
        c.compute_scale = resident_ms / 100.0;
        Entry {
            at,
            method: METHOD,
            resident_ms,
            calibration: c,
        }
    }

    #[test]
    fn calibrations_measured_another_way_are_dropped() {
        let mut h = History::default();
        let mut old = entry(1000, 50.0, "a");
        old.method = 0;
        h.push(old);
        h.push(entry(1100, 60.0, "a"));
        assert_eq!(h.entries.len(), 1);
        assert_eq!(h.entries[0].method, METHOD);
        // An entry saved before the field existed reads as method 0.
        let text = serde_json::to_string(&entry(1, 1.0, "a")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut m = v.as_object().unwrap().clone();
        m.remove("method");
        let e: Entry = serde_json::from_value(serde_json::Value::Object(m)).unwrap();
        assert_eq!(e.method, 0);
    }

    #[test]
    fn the_median_speed_is_saved_and_a_slow_stretch_is_outvoted() {
        let mut h = History::default();
        assert!(h.median().is_none());
        h.push(entry(1_000, 75.0, "a"));
        assert_eq!(h.median().unwrap().resident_ms, 75.0);
        // Two: the faster of the middle ones.
        h.push(entry(1_600, 180.0, "a"));
        assert_eq!(h.median().unwrap().resident_ms, 75.0);
        h.push(entry(2_200, 80.0, "a"));
        let m = h.median().unwrap();
        assert_eq!((m.resident_ms, m.at), (80.0, 2_200));
        // The whole calibration of that entry, not a mix.
        assert_eq!(m.calibration.compute_scale, 0.8);
        h.push(entry(2_800, 200.0, "a"));
        h.push(entry(3_400, 190.0, "a"));
        assert_eq!(h.median().unwrap().resident_ms, 180.0);
        // Only the last KEEP stay: the 75 ms one goes.
        h.push(entry(4_000, 70.0, "a"));
        assert_eq!(h.entries.len(), KEEP);
        assert_eq!(h.entries[0].at, 1_600);
        assert_eq!(h.median().unwrap().resident_ms, 180.0);
    }

    #[test]
    fn other_adapters_old_and_unranked_calibrations_are_dropped() {
        let mut h = History::default();
        h.push(entry(1_000, 90.0, "a"));
        h.push(entry(1_100, f64::NAN, "a"));
        h.push(entry(1_200, 80.0, "b"));
        // The other adapter's go; the unranked one goes with the next push.
        assert_eq!(h.entries.len(), 1);
        assert_eq!(h.entries[0].calibration.adapter, "b");
        h.push(entry(1_300, 100.0, "b"));
        h.push(entry(1_300 + MAX_AGE_S + 1, 120.0, "b"));
        assert_eq!(h.entries.len(), 1, "an hour-old calibration is dropped");
        // A calibration of another model file goes too.
        let mut other = entry(1_400 + MAX_AGE_S, 60.0, "b");
        other.calibration.probe = Some(crate::plan::calibration::Probe {
            model: "other.gguf".into(),
            resident_ms: 60.0,
            flash_small_gb_s: 1.0,
            flash_large_gb_s: 1.0,
        });
        h.push(other);
        assert_eq!(h.entries.len(), 1);
        assert_eq!(h.median().unwrap().resident_ms, 60.0);
    }

    #[test]
    fn calibrations_with_other_driver_threads_are_dropped() {
        let with = |at, ms, threads| {
            let mut e = entry(at, ms, "a");
            e.calibration.device = Some(crate::plan::calibration::DeviceFacts {
                max_binding: 1 << 27,
                auto_in_place: true,
                fuse_norms: true,
                fuse_rope: true,
                bind_align: 256,
                driver_threads: threads,
            });
            e
        };
        let mut h = History::default();
        h.push(with(1_000, 90.0, Some(2)));
        h.push(with(1_100, 95.0, Some(2)));
        assert_eq!(h.entries.len(), 2);
        // The driver's workers changed: the earlier speeds say nothing of the new ones.
        h.push(with(1_200, 60.0, Some(4)));
        assert_eq!(h.entries.len(), 1);
        assert_eq!(h.median().unwrap().resident_ms, 60.0);
        h.push(with(1_300, 65.0, Some(4)));
        assert_eq!(h.entries.len(), 2);
        // A profile that did not record them (another adapter kind, or older) neither.
        h.push(with(1_400, 70.0, None));
        assert_eq!(h.entries.len(), 1);
    }

    #[test]
    fn history_round_trips_and_a_missing_file_is_empty() {
        let dir = std::env::temp_dir().join(format!("flashlm-history-{}", std::process::id()));
        let p = dir.join("h.json");
        assert_eq!(History::load(&p).unwrap(), History::default());
        let mut h = History::default();
        h.push(entry(86_400 + 3_600 * 13 + 60 * 7, 80.0, "a"));
        h.save(&p).unwrap();
        let back = History::load(&p).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.entries[0].time_of_day(), "13:07");
        assert!(back.describe(&back.entries[0]).contains("80.0 (13:07)"));
        assert!(back.describe(&back.entries[0]).contains("the first"));
        h.push(entry(86_400 + 3_600 * 14, 90.0, "a"));
        let d = h.describe(h.median().unwrap());
        assert!(
            d.contains("13:07 UTC (below)") && d.contains("last 2"),
            "{d}"
        );
        std::fs::write(&p, b"{not json").unwrap();
        assert!(History::load(&p).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
