//! Chat templates from arbitrary text: compiled and rendered with a conversation.
//!
//! Input: the template, then NUL-separated message contents (roles alternate user/assistant;
//! the first byte's low bit asks for the generation prompt).
//!
//! Renders run on one long-lived worker thread with the stack `render_here` gives each render
//! ([`RENDER_STACK`]) and a large alternate signal stack, so that a crash there is reported
//! with its input (a thread spawned per render would also cost most of each execution).
#![no_main]

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Mutex, OnceLock};

use flashlm::model::chat::{ChatMessage, ChatTemplate, RENDER_STACK};
use libfuzzer_sys::fuzz_target;

mod common;

fn run(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let mut parts = text.split('\u{0}');
    let source = parts.next().unwrap_or("");
    let messages: Vec<ChatMessage> = parts
        .enumerate()
        .map(|(i, c)| {
            if i % 2 == 0 {
                ChatMessage::user(c)
            } else {
                ChatMessage::assistant(c)
            }
        })
        .collect();
    let Ok(t) = ChatTemplate::new(source, "<s>", "</s>") else {
        return;
    };
    let _ = t.render_on_this_thread(&messages, flags & 1 == 1);
}

type Worker = (SyncSender<Vec<u8>>, Receiver<()>);

fn worker() -> &'static Mutex<Worker> {
    static W: OnceLock<Mutex<Worker>> = OnceLock::new();
    W.get_or_init(|| {
        let (tx, jobs) = sync_channel::<Vec<u8>>(0);
        let (done, rx) = sync_channel::<()>(0);
        std::thread::Builder::new()
            .name("chat template".into())
            .stack_size(RENDER_STACK)
            .spawn(move || {
                common::alt_stack();
                for data in jobs {
                    run(&data);
                    if done.send(()).is_err() {
                        break;
                    }
                }
            })
            .expect("spawning the render thread");
        Mutex::new((tx, rx))
    })
}

fuzz_target!(|data: &[u8]| {
    common::alt_stack();
    let w = worker().lock().unwrap_or_else(|e| e.into_inner());
    w.0.send(data.to_vec()).expect("the render thread is gone");
    w.1.recv().expect("the render thread is gone");
});
