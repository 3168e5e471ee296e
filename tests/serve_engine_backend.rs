//! [`EngineBackend`] without HTTP: the bounded queue refuses exactly what does not fit,
//! cancelling frees the worker for the next request, tokens equal a direct greedy
//! `Engine::generate`, end-of-generation ids finish with `Stop` and are not sent.
mod common;
#[path = "serve/harness.rs"]
mod harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use flashlm::engine::{Engine, EngineOptions};
use flashlm::gguf::GgufFile;
use flashlm::sampling::{Sampler, SamplerParams};
use flashlm::serve::{Backend, EngineBackend, EngineBackendOptions, Finish, GenEvent, GenRequest};

fn req(prompt: &[u32], max_tokens: usize) -> GenRequest {
    GenRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling: SamplerParams::greedy(),
        cancel: Arc::new(AtomicBool::new(false)),
    }
}

/// All events until the end: (tokens, how it ended).
fn drain(rx: Receiver<GenEvent>) -> (Vec<u32>, GenEvent) {
    let mut ids = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("an event") {
            GenEvent::Token(id) => ids.push(id),
            end => return (ids, end),
        }
    }
}

fn backend(gguf: &Arc<GgufFile>, queue: usize, end_ids: Vec<u32>) -> EngineBackend {
    let g = gguf.clone();
    EngineBackend::spawn(
        EngineBackendOptions {
            workers: 1,
            queue,
            end_ids,
            reuse_prefix: true,
        },
        move |_| Engine::new(g.clone(), &EngineOptions::default()).map_err(|e| e.to_string()),
    )
    .unwrap()
}

#[test]
fn queue_cancel_and_tokens_of_the_engine_backend() {
    if common::gpu().is_none() {
        return;
    }
    let dir = harness::scratch("engine-backend");
    let gguf = Arc::new(GgufFile::open(harness::model(&dir)).unwrap());
    let prompt: Vec<u32> = (10..40).collect();
    let other: Vec<u32> = (50..60).collect();
    // The oracle: the engine driven directly.
    let mut e = Engine::new(gguf.clone(), &EngineOptions::default()).unwrap();
    let direct = |e: &mut Engine, p: &[u32], n: usize| {
        e.reset();
        let mut s = Sampler::new(SamplerParams::greedy());
        e.generate(p, n, &mut s, |_| false, |_| true).unwrap().0
    };
    let want = direct(&mut e, &prompt, 12);
    let want_other = direct(&mut e, &other, 12);
    drop(e);

    let b = backend(&gguf, 1, Vec::new());
    assert_eq!(b.max_ctx(), harness::CTX);
    let (ids, end) = drain(b.submit(req(&prompt, 12)).unwrap());
    assert_eq!(ids, want);
    assert_eq!(
        end,
        GenEvent::Done {
            finish: Finish::Length
        }
    );

    // One running, one waiting, the third refused.
    let long = req(&other, 200);
    let cancel = long.cancel.clone();
    let rx_long = b.submit(long).unwrap();
    assert!(matches!(rx_long.recv().unwrap(), GenEvent::Token(_)));
    let rx_next = b.submit(req(&prompt, 12)).unwrap();
    let busy = b.submit(req(&prompt, 1)).unwrap_err();
    assert_eq!(busy.queued, 1);
    let m = b.metrics();
    assert_eq!((m.running, m.queued, m.capacity), (1, 1, 1));
    assert_eq!(m.draft_acceptance, None);
    // Cancelling the long one frees the worker: it ends early and the next one runs.
    cancel.store(true, Ordering::Release);
    let (ids, end) = drain(rx_long);
    assert_eq!(
        end,
        GenEvent::Done {
            finish: Finish::Cancelled
        }
    );
    assert!(ids.len() < 100, "{} tokens after the cancel", ids.len());
    // The prompt repeats the first request's: the cached prefix is reused, same tokens.
    let (ids, _) = drain(rx_next);
    assert_eq!(ids, want);
    let m = b.metrics();
    assert_eq!((m.running, m.queued), (0, 0));
    assert!(m.generated_tokens >= 24 && m.flash_bytes_read > 0, "{m:?}");
    // A dropped receiver counts as a cancel too; the worker goes on with the next request.
    drop(b.submit(req(&other, 200)).unwrap());
    let (ids, _) = drain(b.submit(req(&other, 12)).unwrap());
    assert_eq!(ids, want_other);
    drop(b);

    // End-of-generation: the token is not sent and the finish is Stop.
    let stop_id = want[3];
    let first = want.iter().position(|&x| x == stop_id).unwrap();
    let b = backend(&gguf, 1, vec![stop_id]);
    let (ids, end) = drain(b.submit(req(&prompt, 12)).unwrap());
    assert_eq!(ids, want[..first]);
    assert_eq!(
        end,
        GenEvent::Done {
            finish: Finish::Stop
        }
    );
    // A prompt that fills the context is refused by the backend too.
    let (ids, end) = drain(b.submit(req(&vec![1; harness::CTX], 1)).unwrap());
    assert!(
        ids.is_empty() && matches!(end, GenEvent::Error(_)),
        "{end:?}"
    );
}
