//! `bench summary`: one table of the performance model's predictions against measurement for
//! every scenario, read from the JSON files the other bench commands write (`bench-out/`):
//! `resident.json` (`bench resident`), `stream.json` (`bench stream`: all resident, S1,
//! half-model), `kv.json` (`bench kv`: S2 exact and page selection) and `s3.json` (`bench s3`).
//! A file or field that is missing leaves its scenario "not measured" (or "not predicted"
//! where only the prediction is missing, e.g. an uncalibrated machine).

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

/// The prediction error the performance model aims for, in percent.
pub const GOAL_PERCENT: f64 = 10.0;

/// One scenario's figures (milliseconds).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Figures {
    pub measured_ms: f64,
    /// From the calibration as saved.
    pub predicted_ms: Option<f64>,
    /// From the calibration carried to the speed probe taken before each run (reports from
    /// before the probe have none).
    pub probed_ms: Option<f64>,
    pub measured_ttft_ms: Option<f64>,
    pub predicted_ttft_ms: Option<f64>,
    pub probed_ttft_ms: Option<f64>,
}

impl Figures {
    /// (predicted ÷ measured - 1) in percent, the prediction from the calibration as saved
    /// (the one the goal is judged on: the probe is a few seconds of a machine whose speed
    /// moves within seconds, and it has not made the predictions closer).
    pub fn error_percent(&self) -> Option<f64> {
        pct_error(self.predicted_ms?, self.measured_ms)
    }
    /// The same for the probed prediction.
    pub fn probed_error_percent(&self) -> Option<f64> {
        pct_error(self.probed_ms?, self.measured_ms)
    }
    pub fn ttft_error_percent(&self) -> Option<f64> {
        pct_error(self.predicted_ttft_ms?, self.measured_ttft_ms?)
    }
}

fn pct_error(p: f64, m: f64) -> Option<f64> {
    (m > 0.0).then(|| (p / m - 1.0) * 100.0)
}

/// One row: a scenario and its figures (None: not measured).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub scenario: String,
    /// The file it comes from.
    pub source: String,
    pub figures: Option<Figures>,
}

/// The table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub rows: Vec<Row>,
    /// The speed probes the benches took before their runs: how far the machine's speed moved
    /// while they ran.
    pub probes: Option<ProbeSpread>,
    /// Files that could not be read or parsed.
    pub notes: Vec<String>,
}

/// The range of the probes' figures: (lowest, highest).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ProbeSpread {
    pub count: usize,
    pub resident_ms: (f64, f64),
    pub flash_small_gb_s: (f64, f64),
    pub flash_large_gb_s: (f64, f64),
}

/// The spread of every `probes` list in `files`.
fn probe_spread(files: &[Option<&Value>]) -> Option<ProbeSpread> {
    let probes: Vec<&Value> = files
        .iter()
        .flatten()
        .filter_map(|v| v.get("probes").and_then(Value::as_array))
        .flatten()
        .collect();
    let range = |key: &str| -> Option<(f64, f64)> {
        let v: Vec<f64> = probes.iter().filter_map(|p| num(p, key)).collect();
        let lo = v.iter().copied().reduce(f64::min)?;
        let hi = v.iter().copied().reduce(f64::max)?;
        Some((lo, hi))
    };
    Some(ProbeSpread {
        count: probes.len(),
        resident_ms: range("resident_ms")?,
        flash_small_gb_s: range("flash_small_gb_s")?,
        flash_large_gb_s: range("flash_large_gb_s")?,
    })
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64).filter(|x| x.is_finite())
}

/// The figures of one JSON object with the bench commands' field names: `ms_per_token`
/// (else `decode_tok_s`), `predicted_ms_per_token`, `ttft_ms`, `predicted_ttft_ms`.
fn figures(v: &Value) -> Option<Figures> {
    let measured_ms = num(v, "ms_per_token")
        .filter(|&m| m > 0.0)
        .or_else(|| num(v, "decode_tok_s").filter(|&t| t > 0.0).map(|t| 1e3 / t))?;
    Some(Figures {
        measured_ms,
        predicted_ms: num(v, "predicted_ms_per_token"),
        probed_ms: num(v, "probed_ms_per_token"),
        measured_ttft_ms: num(v, "ttft_ms"),
        predicted_ttft_ms: num(v, "predicted_ttft_ms"),
        probed_ttft_ms: num(v, "probed_ttft_ms"),
    })
}

fn row(scenario: impl Into<String>, source: &str, figures: Option<Figures>) -> Row {
    Row {
        scenario: scenario.into(),
        source: source.into(),
        figures,
    }
}

/// Rows of a report with a `rows` list (`stream.json`, `kv.json`), each named by `name_key`
/// (prefixed); then each of `expected` that no row's name starts with, "not measured".
fn list_rows(
    v: Option<&Value>,
    source: &str,
    name_key: &str,
    prefix: &str,
    expected: &[&str],
) -> Vec<Row> {
    let list = v.and_then(|v| v.get("rows")).and_then(Value::as_array);
    let mut rows: Vec<Row> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (i, r) in list.into_iter().flatten().enumerate() {
        let name = r
            .get(name_key)
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("row {}", i + 1));
        rows.push(row(format!("{prefix}{name}"), source, figures(r)));
        names.push(name);
    }
    for e in expected {
        if !names.iter().any(|n| n.starts_with(e)) {
            rows.push(row(format!("{prefix}{e}"), source, None));
        }
    }
    rows
}

/// The table from the parsed files (None: absent).
pub fn build(
    resident: Option<&Value>,
    stream: Option<&Value>,
    kv: Option<&Value>,
    s3: Option<&Value>,
) -> Summary {
    let mut rows = vec![row("resident", "resident.json", resident.and_then(figures))];
    rows.extend(list_rows(
        stream,
        "stream.json",
        "scenario",
        "",
        &["S1", "half-model"],
    ));
    rows.extend(list_rows(kv, "kv.json", "mode", "S2 ", &["exact", "quest"]));
    rows.push(row("S3", "s3.json", s3.and_then(figures)));
    Summary {
        rows,
        probes: probe_spread(&[resident, stream, kv, s3]),
        notes: Vec::new(),
    }
}

/// Read `dir`'s JSON files and build the table.
pub fn load(dir: &Path) -> Summary {
    let mut notes = Vec::new();
    let mut read = |name: &str| -> Option<Value> {
        let p = dir.join(name);
        let text = std::fs::read_to_string(&p).ok()?;
        match serde_json::from_str(&text) {
            Ok(v) => Some(v),
            Err(e) => {
                notes.push(format!("{}: not valid JSON ({e})", p.display()));
                None
            }
        }
    };
    let (r, s, k, s3) = (
        read("resident.json"),
        read("stream.json"),
        read("kv.json"),
        read("s3.json"),
    );
    let mut sum = build(r.as_ref(), s.as_ref(), k.as_ref(), s3.as_ref());
    sum.notes = notes;
    sum
}

impl Summary {
    /// The row with the largest |ms/token error| (the calibration as saved), and that error
    /// in percent.
    pub fn worst(&self) -> Option<(&Row, f64)> {
        self.worst_by(Figures::error_percent)
    }

    /// The same for the probed predictions.
    pub fn worst_probed(&self) -> Option<(&Row, f64)> {
        self.worst_by(Figures::probed_error_percent)
    }

    fn worst_by(&self, f: impl Fn(&Figures) -> Option<f64>) -> Option<(&Row, f64)> {
        self.rows
            .iter()
            .filter_map(|r| f(r.figures.as_ref()?).map(|e| (r, e)))
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
    }

    pub fn to_markdown(&self) -> String {
        let mut s = String::from(
            "Performance model (`flashlm calibrate` constants) against measurement, every scenario (medians of the bench commands' runs). \
             Predicted from the calibration as saved, and from it carried to the speed probe taken before each run\n\n\
             | scenario | measured ms/token | predicted | error % | predicted, probed | error % | measured TTFT, ms | predicted TTFT, ms | TTFT error % |\n\
             |---|---|---|---|---|---|---|---|---|\n",
        );
        let pct = |e: Option<f64>| e.map_or("-".to_string(), |e| format!("{e:+.1}"));
        for r in &self.rows {
            let Some(f) = &r.figures else {
                s.push_str(&format!(
                    "| {} | not measured ({}) | - | - | - | - | - | - | - |\n",
                    r.scenario, r.source
                ));
                continue;
            };
            s.push_str(&format!(
                "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {} |\n",
                r.scenario,
                f.measured_ms,
                f.predicted_ms
                    .map_or("not predicted".to_string(), |p| format!("{p:.1}")),
                pct(f.error_percent()),
                f.probed_ms
                    .map_or("not probed".to_string(), |p| format!("{p:.1}")),
                pct(f.probed_error_percent()),
                f.measured_ttft_ms
                    .map_or("-".to_string(), |p| format!("{p:.0}")),
                f.predicted_ttft_ms
                    .map_or("-".to_string(), |p| format!("{p:.0}")),
                pct(f.ttft_error_percent()),
            ));
        }
        s.push('\n');
        let unmeasured = self.rows.iter().filter(|r| r.figures.is_none()).count();
        let unpredicted = self
            .rows
            .iter()
            .filter(|r| r.figures.as_ref().is_some_and(|f| f.predicted_ms.is_none()))
            .count();
        match self.worst() {
            Some((r, e)) => s.push_str(&format!(
                "Worst ms/token error: {e:+.1}% ({}) over the {} predicted scenarios, against the goal of {GOAL_PERCENT:.0}%: {}.",
                r.scenario,
                self.rows
                    .iter()
                    .filter(|r| r.figures.as_ref().is_some_and(|f| f.error_percent().is_some()))
                    .count(),
                if e.abs() <= GOAL_PERCENT {
                    "met"
                } else {
                    "NOT met"
                }
            )),
            None => s.push_str(
                "Worst ms/token error: none to state, no scenario has both a prediction and a measurement (run `flashlm calibrate`, then the bench commands).",
            ),
        }
        let probed = self
            .rows
            .iter()
            .filter(|r| r.figures.as_ref().is_some_and(|f| f.probed_ms.is_some()))
            .count();
        if probed > 0
            && let Some((r, e)) = self.worst_probed()
        {
            s.push_str(&format!(
                " Probed predictions ({probed} scenarios): worst {e:+.1}% ({}).",
                r.scenario
            ));
        }
        if unmeasured + unpredicted > 0 {
            s.push_str(&format!(
                " {unmeasured} scenarios not measured, {unpredicted} measured without a prediction."
            ));
        }
        s.push('\n');
        if let Some(p) = &self.probes {
            s.push_str(&format!(
                "\nThe machine's speed while the benches ran, by the {} speed probes taken before their runs: \
                 resident decode {:.1} to {:.1} ms/token ({:.2}x), cold direct reads {:.2} to {:.2} GB/s in 1 MiB pieces \
                 and {:.2} to {:.2} GB/s in 64 KiB pieces.\n",
                p.count,
                p.resident_ms.0,
                p.resident_ms.1,
                p.resident_ms.1 / p.resident_ms.0.max(1e-9),
                p.flash_large_gb_s.0,
                p.flash_large_gb_s.1,
                p.flash_small_gb_s.0,
                p.flash_small_gb_s.1,
            ));
        }
        for n in &self.notes {
            s.push_str(&format!("\n{n}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_from_hand_written_reports() {
        // resident.json of an older build: no ms_per_token, decode 12.5 tok/s = 80 ms/token.
        let resident: Value = serde_json::from_str(
            r#"{"decode_tok_s": 12.5, "ttft_ms": 300, "predicted_ms_per_token": 84.0}"#,
        )
        .unwrap();
        let stream: Value = serde_json::from_str(
            r#"{"rows": [
                {"scenario": "all resident", "ms_per_token": 80.0, "ttft_ms": 400.0,
                 "predicted_ms_per_token": 77.0, "predicted_ttft_ms": 440.0},
                {"scenario": "S1", "ms_per_token": 200.0, "ttft_ms": 900.0,
                 "predicted_ms_per_token": 250.0, "predicted_ttft_ms": null,
                 "probed_ms_per_token": 206.0, "probed_ttft_ms": 990.0},
                {"scenario": "half-model", "ms_per_token": 120.0}
            ], "probes": [
                {"model": "m", "resident_ms": 80.0, "flash_small_gb_s": 0.5, "flash_large_gb_s": 1.1},
                {"model": "m", "resident_ms": 120.0, "flash_small_gb_s": 0.7, "flash_large_gb_s": 0.9}
            ]}"#,
        )
        .unwrap();
        // kv.json without rows: its scenarios are not measured.
        let kv: Value = serde_json::from_str(r#"{"adapter": "x"}"#).unwrap();
        let s = build(Some(&resident), Some(&stream), Some(&kv), None);
        let names: Vec<&str> = s.rows.iter().map(|r| r.scenario.as_str()).collect();
        assert_eq!(
            names,
            [
                "resident",
                "all resident",
                "S1",
                "half-model",
                "S2 exact",
                "S2 quest",
                "S3"
            ]
        );
        let f = s.rows[0].figures.as_ref().unwrap();
        assert!((f.measured_ms - 80.0).abs() < 1e-12);
        assert!((f.error_percent().unwrap() - 5.0).abs() < 1e-9);
        let f = s.rows[1].figures.as_ref().unwrap();
        assert!((f.error_percent().unwrap() + 3.75).abs() < 1e-9);
        assert!((f.ttft_error_percent().unwrap() - 10.0).abs() < 1e-9);
        // S1: 250 against 200 is the worst, +25%; probed, 206 against 200, +3% (the only
        // probed row, so the worst probed); its TTFT has no saved prediction: no error.
        let f = s.rows[2].figures.as_ref().unwrap();
        assert!((f.error_percent().unwrap() - 25.0).abs() < 1e-9);
        assert!((f.probed_error_percent().unwrap() - 3.0).abs() < 1e-9);
        assert_eq!(f.ttft_error_percent(), None);
        let (w, e) = s.worst().unwrap();
        assert_eq!(w.scenario, "S1");
        assert!((e - 25.0).abs() < 1e-9);
        let (w, e) = s.worst_probed().unwrap();
        assert_eq!(w.scenario, "S1");
        assert!((e - 3.0).abs() < 1e-9);
        let md = s.to_markdown();
        assert!(
            md.contains("| S1 | 200.0 | 250.0 | +25.0 | 206.0 | +3.0 | 900 | - | - |"),
            "{md}"
        );
        assert!(
            md.contains("| half-model | 120.0 | not predicted | - | not probed | - | - | - | - |"),
            "{md}"
        );
        assert!(md.contains(
            "| all resident | 80.0 | 77.0 | -3.7 | not probed | - | 400 | 440 | +10.0 |"
        ));
        assert!(md.contains("| S2 exact | not measured (kv.json) |"), "{md}");
        assert!(md.contains("| S3 | not measured (s3.json) |"), "{md}");
        assert!(
            md.contains(
                "Worst ms/token error: +25.0% (S1) over the 3 predicted scenarios, against the goal of 10%: NOT met. \
                 Probed predictions (1 scenarios): worst +3.0% (S1)."
            ),
            "{md}"
        );
        assert!(md.contains("3 scenarios not measured, 1 measured without a prediction"));
        // The probes' spread: 80 to 120 ms/token is 1.5x.
        assert!(
            md.contains(
                "by the 2 speed probes taken before their runs: resident decode 80.0 to 120.0 ms/token (1.50x), \
                 cold direct reads 0.90 to 1.10 GB/s in 1 MiB pieces and 0.50 to 0.70 GB/s in 64 KiB pieces."
            ),
            "{md}"
        );
        // A report without one of the scenarios: it is listed, not measured.
        let only_s1: Value =
            serde_json::from_str(r#"{"rows": [{"scenario": "S1", "ms_per_token": 1.0}]}"#).unwrap();
        let s = build(None, Some(&only_s1), None, None);
        let r = s.rows.iter().find(|r| r.scenario == "half-model").unwrap();
        assert!(r.figures.is_none());
        // Nothing at all: every scenario not measured, no worst error.
        let empty = build(None, None, None, None);
        assert_eq!(empty.probes, None);
        assert_eq!(empty.rows.len(), 6);
        assert!(empty.rows.iter().all(|r| r.figures.is_none()));
        assert!(empty.to_markdown().contains("none to state"));
    }

    #[test]
    fn missing_directory_is_not_an_error() {
        let s = load(Path::new("/nonexistent/flashlm-bench-out"));
        assert!(s.rows.iter().all(|r| r.figures.is_none()));
        assert!(s.notes.is_empty());
    }
}
