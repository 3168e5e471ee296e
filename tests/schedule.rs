//! The per-token schedule, checked on the order of its events in a trace: the next pass's
//! first streamed layers are queued once the pass has submitted its last use of their slots
//! (its output head), before the logits are read back; the output head's first chunks are
//! queued with the last streamed layers, before the head begins; and the tokens stay those of
//! the all-resident run.
mod common;

use std::sync::Arc;

use flashlm::engine::{Engine, EngineOptions};
use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::gpu::GpuOptions;
use flashlm::model::reference::argmax;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};

fn opts(budget: Option<u64>) -> EngineOptions {
    EngineOptions {
        gpu: GpuOptions {
            budget,
            ..Default::default()
        },
        ctx: Some(128),
        ring_slots: 3,
        ring_chunk: 8192,
        // The output head streams through the layer slots (pieces as large as a slot).
        head_chunk: None,
        trace: true,
        ..Default::default()
    }
}

/// Greedy ids of `steps` decode steps after `prompt`, and the engine.
fn decode(
    gguf: &Arc<GgufFile>,
    o: &EngineOptions,
    prompt: &[u32],
    steps: usize,
) -> (Vec<u32>, Engine) {
    let mut e = Engine::new(gguf.clone(), o).unwrap();
    let mut logits = e.forward(prompt).unwrap();
    e.tracer.clear();
    let mut ids = Vec::new();
    for _ in 0..steps {
        let id = argmax(&logits);
        ids.push(id);
        logits = e.forward(&[id]).unwrap();
    }
    (ids, e)
}

#[test]
fn the_next_passs_first_layers_are_queued_before_the_logits_come_back() {
    if common::gpu().is_none() {
        return;
    }
    let spec = SyntheticSpec {
        n_layers: 5,
        n_embd: 128,
        n_heads: 4,
        n_kv_heads: 2,
        n_ff: 352,
        vocab: 700,
        weight_type: GgmlType::Q4_1,
        ctx: 128,
        untied_output: true,
    };
    let gguf = Arc::new(GgufFile::from_bytes(synthetic_llama(&spec, 31)).unwrap());
    let mut o = opts(None);
    let min = common::min_budget(&gguf, &o);
    let prompt = [4, 77, 12, 230, 9];
    let steps = 6;
    let (want, _) = decode(&gguf, &opts(None), &prompt, steps);
    o.gpu.budget = Some(min);
    let (ids, mut e) = decode(&gguf, &o, &prompt, steps);
    assert!(e.placement.streaming, "{}", e.placement);
    assert_eq!(ids, want, "streamed ids differ from the resident run's");
    let first = (0..spec.n_layers)
        .find(|&l| !e.placement.resident_layers[l])
        .expect("a streamed layer");
    let dir = common::scratch("schedule-next-pass");
    let trace = dir.join("trace.json");
    e.write_trace(&trace).unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    // The host row's events: (start, name).
    let mut host: Vec<(f64, String)> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|ev| ev["ph"] == "X" && ev["tid"] == 3)
        .map(|ev| {
            (
                ev["ts"].as_f64().unwrap(),
                ev["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    host.sort_by(|a, b| a.0.total_cmp(&b.0));
    let queued = format!("queue read+upload layer {first}");
    let embeds: Vec<f64> = host
        .iter()
        .filter(|h| h.1 == "embed")
        .map(|h| h.0)
        .collect();
    let waits: Vec<f64> = host
        .iter()
        .filter(|h| h.1 == "wait for logits")
        .map(|h| h.0)
        .collect();
    assert_eq!(embeds.len(), steps, "{host:?}");
    assert_eq!(waits.len(), steps, "{host:?}");
    // Every pass but the last (whose next pass never ran, so its job was never waited for)
    // queues the next pass's first streamed layer after its embedding and before it waits for
    // its logits.
    for k in 0..steps - 1 {
        let (a, b) = (embeds[k], waits[k]);
        assert!(a < b, "pass {k}: {host:?}");
        let n = host
            .iter()
            .filter(|h| h.1 == queued && h.0 >= a && h.0 <= b)
            .count();
        assert_eq!(
            n, 1,
            "pass {k} should queue the next pass's layer {first} between its embedding and its \
             wait for the logits: {host:?}"
        );
    }
    // Every pass queues its head's first chunk (which streams through a layer slot) before it
    // submits the head's first work, so its read follows the last layer's.
    let heads: Vec<f64> = host
        .iter()
        .filter(|h| h.1 == "submit output norm")
        .map(|h| h.0)
        .collect();
    assert_eq!(heads.len(), steps, "{host:?}");
    for k in 0..steps {
        let chunk0 = host
            .iter()
            .filter(|h| h.1 == "queue read+upload output head chunk 0" && h.0 >= embeds[k])
            .map(|h| h.0)
            .next()
            .unwrap_or_else(|| panic!("pass {k} queued no head chunk 0: {host:?}"));
        assert!(
            chunk0 <= heads[k],
            "pass {k} should queue the head's first chunk before the head begins: {host:?}"
        );
    }
}
