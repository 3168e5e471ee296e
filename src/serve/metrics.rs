//! `/metrics` in the Prometheus text format: the server's own counters and the backend's
//! figures.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::backend::BackendMetrics;

/// Endpoints counted by name; any other path is counted as `other` (hostile paths must not
/// grow the label set).
pub const ENDPOINTS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/health",
    "/metrics",
    "/",
];

/// The server's counters.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

impl ServerMetrics {
    /// The label for a request path.
    pub fn endpoint(path: &str) -> &'static str {
        ENDPOINTS
            .iter()
            .find(|e| **e == path)
            .copied()
            .unwrap_or("other")
    }

    pub fn count_request(&self, path: &str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((Self::endpoint(path), status)).or_default() += 1;
    }

    /// Tokens of a request that was answered (its `usage`).
    pub fn count_tokens(&self, prompt: usize, completion: usize) {
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(completion as u64, Ordering::Relaxed);
    }

    /// The exposition text; `backend` is `None` while the model loads.
    pub fn render(&self, backend: Option<&BackendMetrics>) -> String {
        let mut s = String::new();
        let head = |s: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(s, "# HELP {name} {help}");
            let _ = writeln!(s, "# TYPE {name} {kind}");
        };
        head(
            &mut s,
            "flashlm_requests_total",
            "counter",
            "HTTP requests by endpoint and status code.",
        );
        {
            let m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
            for ((endpoint, status), n) in m.iter() {
                let _ = writeln!(
                    s,
                    "flashlm_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
                );
            }
        }
        head(
            &mut s,
            "flashlm_prompt_tokens_total",
            "counter",
            "Prompt tokens of answered requests.",
        );
        let _ = writeln!(
            s,
            "flashlm_prompt_tokens_total {}",
            self.prompt_tokens.load(Ordering::Relaxed)
        );
        head(
            &mut s,
            "flashlm_generated_tokens_total",
            "counter",
            "Completion tokens of answered requests.",
        );
        let _ = writeln!(
            s,
            "flashlm_generated_tokens_total {}",
            self.completion_tokens.load(Ordering::Relaxed)
        );
        head(
            &mut s,
            "flashlm_model_ready",
            "gauge",
            "1 once the model is loaded, 0 while it loads.",
        );
        let _ = writeln!(s, "flashlm_model_ready {}", u8::from(backend.is_some()));
        let Some(b) = backend else {
            return s;
        };
        let gauges: [(&str, &str, f64); 3] = [
            (
                "flashlm_queue_length",
                "Requests waiting for a sequence slot.",
                b.queued as f64,
            ),
            (
                "flashlm_running_sequences",
                "Sequences being generated now.",
                b.running as f64,
            ),
            (
                "flashlm_sequence_slots",
                "Sequences that can be generated at once.",
                b.capacity as f64,
            ),
        ];
        for (name, help, v) in gauges {
            head(&mut s, name, "gauge", help);
            let _ = writeln!(s, "{name} {v}");
        }
        let counters: [(&str, &str, u64); 5] = [
            (
                "flashlm_prefill_tokens_total",
                "Prompt tokens run through the model (reused cached prefixes excluded).",
                b.prefill_tokens,
            ),
            (
                "flashlm_prefix_cache_tokens_total",
                "Prompt tokens whose KV pages were reused from the prefix cache.",
                b.cached_prompt_tokens,
            ),
            (
                "flashlm_forward_passes_total",
                "Forward passes over the model; each serves every sequence in it.",
                b.passes,
            ),
            (
                "flashlm_backend_generated_tokens_total",
                "Tokens the backend generated, cancelled requests included.",
                b.generated_tokens,
            ),
            (
                "flashlm_flash_read_bytes_total",
                "Bytes read from flash: model weights and KV cache pages.",
                b.flash_bytes_read,
            ),
        ];
        for (name, help, v) in counters {
            head(&mut s, name, "counter", help);
            let _ = writeln!(s, "{name} {v}");
        }
        // Only a backend that drafts tokens has an acceptance ratio to report.
        if let Some(a) = b.draft_acceptance {
            head(
                &mut s,
                "flashlm_draft_acceptance_ratio",
                "gauge",
                "Share of drafted tokens accepted by speculative decoding.",
            );
            let _ = writeln!(s, "flashlm_draft_acceptance_ratio {a}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_lists_counters_and_backend_figures() {
        let m = ServerMetrics::default();
        m.count_request("/v1/completions", 200);
        m.count_request("/v1/completions", 200);
        m.count_request("/v1/completions", 400);
        m.count_request("/../../etc/passwd", 404);
        m.count_tokens(5, 7);
        let loading = m.render(None);
        assert!(loading.contains("flashlm_model_ready 0"));
        assert!(!loading.contains("flashlm_queue_length"));
        let b = BackendMetrics {
            queued: 3,
            running: 1,
            capacity: 1,
            prefill_tokens: 11,
            cached_prompt_tokens: 17,
            passes: 19,
            generated_tokens: 13,
            flash_bytes_read: 4096,
            draft_acceptance: None,
        };
        let t = m.render(Some(&b));
        for line in [
            "flashlm_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2",
            "flashlm_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1",
            "flashlm_requests_total{endpoint=\"other\",status=\"404\"} 1",
            "flashlm_prompt_tokens_total 5",
            "flashlm_generated_tokens_total 7",
            "flashlm_queue_length 3",
            "flashlm_running_sequences 1",
            "flashlm_flash_read_bytes_total 4096",
            "flashlm_prefix_cache_tokens_total 17",
            "flashlm_forward_passes_total 19",
            "flashlm_model_ready 1",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
        // No drafting, no acceptance figure (rather than a made-up 0).
        assert!(!t.contains("draft_acceptance"));
        let with = m.render(Some(&BackendMetrics {
            draft_acceptance: Some(0.75),
            ..b
        }));
        assert!(
            with.lines()
                .any(|l| l == "flashlm_draft_acceptance_ratio 0.75")
        );
        // Every sample line has a HELP and TYPE for its family.
        for l in with.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().unwrap();
            assert!(with.contains(&format!("# TYPE {name} ")), "{name}");
        }
    }
}
