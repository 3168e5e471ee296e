//! [`EngineBackend`] without HTTP: the bounded queue refuses exactly what does not fit,
//! cancelling frees the sequence for the next request, tokens equal token-by-token greedy
//! decoding of the engine driven directly, end-of-generation ids finish with `Stop` and are not
//! sent. With several sequences: concurrent requests (prefill chunks sharing passes with
//! decodes) each get exactly their solo tokens; prompts that share pages reuse them (the
//! prefix cache); lookup drafts leave the tokens unchanged.
mod common;
#[path = "serve/harness.rs"]
mod harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use flashlm::engine::draft::DraftConfig;
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

fn engine_opts() -> EngineOptions {
    EngineOptions {
        kv_page: Some(16),
        ..Default::default()
    }
}

fn spawn(
    gguf: &Arc<GgufFile>,
    parallel: usize,
    queue: usize,
    end_ids: Vec<u32>,
    draft: Option<DraftConfig>,
    ubatch: usize,
) -> EngineBackend {
    let g = gguf.clone();
    EngineBackend::spawn(
        EngineBackendOptions {
            parallel,
            queue,
            end_ids,
            reuse_prefix: true,
            draft,
        },
        move || {
            let o = EngineOptions {
                max_seqs: parallel,
                ubatch,
                logit_rows: ubatch,
                ..engine_opts()
            };
            Engine::new(g, &o).map_err(|e| e.to_string())
        },
    )
    .unwrap()
}

fn backend(gguf: &Arc<GgufFile>, queue: usize, end_ids: Vec<u32>) -> EngineBackend {
    spawn(gguf, 1, queue, end_ids, None, 32)
}

/// The oracle: greedy decoding, one token per pass, of the engine driven directly.
fn direct(e: &mut Engine, p: &[u32], n: usize) -> Vec<u32> {
    e.reset();
    let mut logits = Vec::new();
    for &t in p {
        logits = e.forward(&[t]).unwrap();
    }
    let mut s = Sampler::new(SamplerParams::greedy());
    let mut out = Vec::new();
    let mut hist = p.to_vec();
    loop {
        let id = s.sample(&logits, &hist);
        out.push(id);
        hist.push(id);
        if out.len() == n {
            return out;
        }
        logits = e.forward(&[id]).unwrap();
    }
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
    let mut e = Engine::new(gguf.clone(), &engine_opts()).unwrap();
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
    // Cancelling the long one frees the sequence: it ends early and the next one runs.
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
    // A dropped receiver counts as a cancel too; the engine goes on with the next request.
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

#[test]
fn concurrent_requests_share_passes_and_cached_prefixes() {
    if common::gpu().is_none() {
        return;
    }
    let dir = harness::scratch("engine-batch");
    let gguf = Arc::new(GgufFile::open(harness::model(&dir)).unwrap());
    // Four prompts, two of them sharing their first 40 tokens (two and a half 16-token pages).
    let shared: Vec<u32> = (0..40).map(|i| (i * 13 + 5) % 300).collect();
    let mut prompts: Vec<Vec<u32>> = vec![
        (10..60).collect(),
        (100..107).collect(),
        shared.iter().copied().chain([7, 8, 9]).collect(),
        shared.iter().copied().chain([70, 71]).collect(),
    ];
    let n = [14, 20, 9, 11];
    let mut e = Engine::new(gguf.clone(), &engine_opts()).unwrap();
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .zip(n)
        .map(|(p, n)| direct(&mut e, p, n))
        .collect();

    // Four sequences, passes of 24 tokens: the 50-token prompt prefills in chunks beside the
    // decode rows of the others.
    let b = spawn(&gguf, 4, 8, Vec::new(), None, 24);
    let rxs: Vec<_> = prompts
        .iter()
        .zip(n)
        .map(|(p, n)| b.submit(req(p, n)).unwrap())
        .collect();
    for (k, rx) in rxs.into_iter().enumerate() {
        let (ids, end) = drain(rx);
        assert_eq!(ids, want[k], "request {k}");
        assert_eq!(
            end,
            GenEvent::Done {
                finish: Finish::Length
            }
        );
    }
    // Fewer passes than the requests alone would take (they shared passes).
    let alone: usize = prompts
        .iter()
        .zip(n)
        .map(|(p, n)| p.len().div_ceil(24) + n - 1)
        .sum();
    assert!((b.passes() as usize) < alone, "{} passes", b.passes());
    // The fourth prompt shares whole pages with the third: at least two pages came from the
    // cache whichever of them ran first.
    assert!(b.reused_tokens() >= 32, "{} reused", b.reused_tokens());

    // Finished sequences stay cached: a prompt extending a finished request's prompt reuses
    // its pages (in place, to the token), and its tokens are still the oracle's.
    let reused = b.reused_tokens();
    let longer: Vec<u32> = prompts[0].iter().copied().chain([1, 2, 3]).collect();
    let want_longer = direct(&mut e, &longer, 8);
    let (ids, _) = drain(b.submit(req(&longer, 8)).unwrap());
    assert_eq!(ids, want_longer);
    assert!(
        b.reused_tokens() - reused >= 50,
        "{}",
        b.reused_tokens() - reused
    );

    // The same prompt as a running request: its pages are copied while it runs.
    prompts.truncate(1);
    let long_run = b.submit(req(&prompts[0], 60)).unwrap();
    let first = long_run.recv().unwrap();
    assert_eq!(first, GenEvent::Token(want[0][0]));
    let reused = b.reused_tokens();
    let (ids, _) = drain(b.submit(req(&prompts[0], 14)).unwrap());
    assert_eq!(ids, want[0]);
    assert!(
        b.reused_tokens() - reused >= 48,
        "{}",
        b.reused_tokens() - reused
    );
    let (ids, _) = drain(long_run);
    assert_eq!(ids[..13], want[0][1..]);
    let m = b.metrics();
    assert_eq!((m.running, m.queued, m.capacity), (0, 0, 4));
    assert_eq!(m.draft_acceptance, None);
}

#[test]
fn lookup_drafts_in_shared_passes_keep_the_tokens() {
    if common::gpu().is_none() {
        return;
    }
    let dir = harness::scratch("engine-draft");
    let gguf = Arc::new(GgufFile::open(harness::model(&dir)).unwrap());
    // Repetitive prompts give the drafter matches.
    let prompts: Vec<Vec<u32>> = vec![
        [5u32, 6, 7, 8, 9].repeat(6),
        [40u32, 41, 42].repeat(7),
        (200..230).collect(),
    ];
    let mut e = Engine::new(gguf.clone(), &engine_opts()).unwrap();
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| direct(&mut e, p, 24)).collect();
    drop(e);
    let b = spawn(
        &gguf,
        3,
        4,
        Vec::new(),
        Some(DraftConfig { ngram: 3, max: 4 }),
        24,
    );
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| b.submit(req(p, 24)).unwrap())
        .collect();
    for (k, rx) in rxs.into_iter().enumerate() {
        assert_eq!(drain(rx).0, want[k], "request {k}");
    }
    let m = b.metrics();
    let acc = m.draft_acceptance.expect("drafting reports its acceptance");
    // The synthetic model repeats itself, so some drafts are right.
    assert!(acc > 0.0 && acc <= 1.0, "{acc}");
    assert_eq!(m.generated_tokens, 72);
}
