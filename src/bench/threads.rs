//! `bench threads`: the worker threads of Mesa's software rasterizer (`LP_NUM_THREADS`, see
//! [`crate::gpu::softdriver`]) side by side. The driver reads the count once, when it starts,
//! so each run is a child `flashlm run` with the variable set; the rounds run every count and
//! scenario once in turn, so that the VM's drift falls on all of them alike.

use std::path::PathBuf;

use serde::Serialize;

use super::median;
use crate::gpu::softdriver::{self, THREADS_ENV};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// What to compare.
#[derive(Debug, Clone)]
pub struct ThreadsOptions {
    pub model: PathBuf,
    /// Worker thread counts (empty: the CPUs, twice and three times as many).
    pub threads: Vec<usize>,
    /// Device budget of the streamed scenario (None: only all resident).
    pub budget: Option<u64>,
    pub tokens: usize,
    pub rounds: usize,
    pub backend: Option<String>,
    pub adapter: Option<String>,
}

/// One (thread count, scenario) cell: medians over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadsRow {
    pub threads: usize,
    pub scenario: String,
    pub ms_per_token: f64,
    /// Median over the rounds of this row's ms/token over the driver default's in the same
    /// round (the default row reads 1).
    pub vs_driver_default: f64,
    pub prefill_tok_s: f64,
    pub runs_ms: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ThreadsReport {
    pub adapter: String,
    pub cpus: usize,
    /// The driver's own count (one per CPU) and the engine's default.
    pub driver_default: usize,
    pub engine_default: usize,
    pub tokens: usize,
    pub rounds: usize,
    pub rows: Vec<ThreadsRow>,
}

/// The thread counts to compare: the given ones, else the CPUs, twice and three times as many
/// (within the driver's limit), always with the driver's default first.
pub fn counts(given: &[usize], cpus: usize) -> Vec<usize> {
    let cpus = cpus.max(1);
    let mut v = vec![cpus.min(softdriver::MAX_THREADS)];
    let rest: Vec<usize> = if given.is_empty() {
        vec![2 * cpus, 3 * cpus]
    } else {
        given.to_vec()
    };
    for n in rest {
        let n = n.clamp(1, softdriver::MAX_THREADS);
        if !v.contains(&n) {
            v.push(n);
        }
    }
    v
}

/// One child `flashlm run` with `threads` driver workers: its stats JSON.
fn run_child(
    o: &ThreadsOptions,
    threads: usize,
    budget: Option<u64>,
) -> BenchResult<serde_json::Value> {
    super::run_child(&format!("{THREADS_ENV}={threads}"), |c| {
        c.env(THREADS_ENV, threads.to_string())
            .args(["--temp", "0", "--ignore-eos", "--io", "direct"])
            .args(["-p", super::BENCH_TEXT])
            .arg("-n")
            .arg(o.tokens.to_string())
            .arg("-m")
            .arg(&o.model);
        if let Some(b) = budget {
            c.arg("--gpu-budget").arg(b.to_string());
        }
        if let Some(b) = &o.backend {
            c.arg("--backend").arg(b);
        }
        if let Some(a) = &o.adapter {
            c.arg("--adapter").arg(a);
        }
    })
}

fn scenario_name(budget: Option<u64>) -> String {
    match budget {
        None => "all resident".into(),
        Some(b) => format!("{:.0} MiB budget", b as f64 / (1u64 << 20) as f64),
    }
}

pub fn run(o: &ThreadsOptions) -> BenchResult<ThreadsReport> {
    let cpus = softdriver::cpus();
    let counts = counts(&o.threads, cpus);
    let scenarios: Vec<Option<u64>> = std::iter::once(None).chain(o.budget.map(Some)).collect();
    // ms and prefill per (count, scenario), per round.
    let mut ms = vec![vec![Vec::new(); scenarios.len()]; counts.len()];
    let mut prefill = ms.clone();
    let mut adapter = String::new();
    for r in 0..o.rounds.max(1) {
        for (i, &n) in counts.iter().enumerate() {
            for (j, &b) in scenarios.iter().enumerate() {
                let v = run_child(o, n, b)?;
                let m = v["ms_per_token"].as_f64().unwrap_or(f64::NAN);
                let p = v["prefill_tok_s"].as_f64().unwrap_or(f64::NAN);
                if adapter.is_empty() {
                    adapter = v["adapter"].as_str().unwrap_or("").to_string();
                }
                eprintln!(
                    "round {}: {THREADS_ENV}={n}, {}: {m:.1} ms/token, prefill {p:.1} tok/s",
                    r + 1,
                    scenario_name(b)
                );
                ms[i][j].push(m);
                prefill[i][j].push(p);
            }
        }
    }
    let mut rows = Vec::new();
    for (i, &n) in counts.iter().enumerate() {
        for (j, &b) in scenarios.iter().enumerate() {
            let mut ratios: Vec<f64> = ms[i][j].iter().zip(&ms[0][j]).map(|(a, d)| a / d).collect();
            rows.push(ThreadsRow {
                threads: n,
                scenario: scenario_name(b),
                ms_per_token: median(&mut ms[i][j].clone()),
                vs_driver_default: median(&mut ratios),
                prefill_tok_s: median(&mut prefill[i][j].clone()),
                runs_ms: ms[i][j].clone(),
            });
        }
    }
    Ok(ThreadsReport {
        adapter,
        cpus,
        driver_default: counts[0],
        engine_default: softdriver::default_threads(cpus),
        tokens: o.tokens,
        rounds: o.rounds.max(1),
        rows,
    })
}

impl ThreadsReport {
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "adapter {}; {} CPUs; {} rounds, each running every thread count and scenario once in turn (a child `flashlm run` each: {} tokens decoded, direct I/O, greedy); medians over the rounds; \"x driver default\" is the median of the rounds' ratios of decode ms/token to that of the driver's own count ({} workers, one per CPU). The engine's default ({} workers) is marked.\n\n",
            self.adapter,
            self.cpus,
            self.rounds,
            self.tokens,
            self.driver_default,
            self.engine_default
        );
        s.push_str("| LP_NUM_THREADS | default | scenario | decode ms/token | x driver default | prefill tok/s | runs, ms/token |\n|---|---|---|---|---|---|---|\n");
        for r in &self.rows {
            let mark = match (
                r.threads == self.driver_default,
                r.threads == self.engine_default,
            ) {
                (_, true) => "engine",
                (true, false) => "driver",
                _ => "",
            };
            let runs: Vec<String> = r.runs_ms.iter().map(|m| format!("{m:.1}")).collect();
            s.push_str(&format!(
                "| {} | {mark} | {} | {:.1} | {:.2} | {:.1} | {} |\n",
                r.threads,
                r.scenario,
                r.ms_per_token,
                r.vs_driver_default,
                r.prefill_tok_s,
                runs.join(", ")
            ));
        }
        if !self.adapter.contains("llvmpipe") {
            s.push_str("\nThis adapter is not Mesa's software rasterizer: the variable has no effect on it, and the rows differ by noise only.\n");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_start_with_the_driver_default() {
        assert_eq!(counts(&[], 2), vec![2, 4, 6]);
        assert_eq!(
            counts(&[4, 2, 4, 40], 2),
            vec![2, 4, softdriver::MAX_THREADS]
        );
        assert_eq!(counts(&[], 8), vec![8, 16]);
        assert_eq!(counts(&[0], 1), vec![1]);
    }
}
