//! `run --probe`: the speed probe is taken on the calibration's own model, and the probed
//! prediction is the saved one carried to it (here with the ratios at their bounds, so the
//! expected figures do not depend on this machine's speed); without a calibration, or with one
//! from before the probe, the run goes on and says why nothing was probed.
mod common;

use std::path::Path;

use flashlm::gguf::GgmlType;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};
use flashlm::plan::perf::{Calibration, Probe};

fn flashlm(home: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_flashlm"));
    c.env("FLASHLM_HOME", home);
    c
}

/// The shared test machine, with an in-pass factor that a probe's lowest ratio (0.2) leaves
/// inside the factor's own bounds, and `probe` as the calibration's own.
fn calibration(probe: Option<Probe>) -> Calibration {
    Calibration {
        compute_scale: 2.0,
        probe,
        ..common::calibration(1.0, 1.0)
    }
}

#[test]
fn run_probe_predicts_at_the_speed_of_the_moment() {
    if common::gpu().is_none() {
        return;
    }
    let dir = common::scratch("probe");
    let spec = SyntheticSpec {
        n_layers: 2,
        n_embd: 128,
        n_heads: 4,
        n_kv_heads: 2,
        n_ff: 256,
        vocab: 300,
        weight_type: GgmlType::Q8_0,
        ctx: 128,
        untied_output: false,
    };
    let model = dir.join("m.gguf");
    std::fs::write(&model, synthetic_llama(&spec, 5)).unwrap();
    let stats = dir.join("stats.json");
    let run = |home: &Path| {
        let out = flashlm(home)
            .args([
                "run",
                "-p",
                "one two three",
                "--temp",
                "0",
                "-n",
                "3",
                "--probe",
                "-m",
            ])
            .arg(&model)
            .arg("--stats-json")
            .arg(&stats)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{err}");
        let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        (err, j)
    };
    let home_with = |name: &str, cal: Option<Calibration>| {
        let home = dir.join(name);
        std::fs::create_dir_all(&home).unwrap();
        if let Some(c) = cal {
            std::fs::write(
                home.join("calibration.json"),
                serde_json::to_string(&c).unwrap(),
            )
            .unwrap();
        }
        home
    };
    // Not calibrated: nothing to carry, said once; the run goes on.
    let (err, j) = run(&home_with("none", None));
    assert!(
        err.contains("--probe: this machine is not calibrated"),
        "{err}"
    );
    assert!(j["probed"].is_null(), "{j}");
    // A calibration from before the probe: said, no probed prediction.
    let (err, j) = run(&home_with("old", Some(calibration(None))));
    assert!(err.contains("predates the probe"), "{err}");
    assert!(j["probed"].is_null() && !j["predicted"].is_null(), "{j}");
    // A calibration whose probe saw a machine far slower than any: the compute ratio is held
    // at its lower bound, 0.2 (the read ratios at their upper one), so the probed compute is a
    // fifth of the saved one.
    let slow = Probe {
        model: model.display().to_string(),
        resident_ms: 1e9,
        flash_small_gb_s: 1e-9,
        flash_large_gb_s: 1e-9,
    };
    let (err, j) = run(&home_with("probed", Some(calibration(Some(slow)))));
    assert!(err.contains("probe: resident"), "{err}");
    assert!(err.contains("probed prediction:"), "{err}");
    let saved = j["predicted"]["compute_ms"].as_f64().unwrap();
    let probed = j["probed"]["compute_ms"].as_f64().unwrap();
    assert!(saved > 0.0, "{j}");
    assert!(
        (probed / saved - 1.0 / 5.0).abs() < 1e-9,
        "{saved} {probed}"
    );
    // The probe the prediction was carried to is the one just taken, on the calibration's
    // model: a real decode time.
    let p = &j["probed"]["probe"];
    assert_eq!(
        p["model"].as_str(),
        Some(model.display().to_string().as_str())
    );
    let ms = p["resident_ms"].as_f64().unwrap();
    assert!(ms > 0.0 && ms < 1e6, "{p}");
}
