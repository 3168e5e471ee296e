//! Chat templates from arbitrary text: compiled and rendered with a conversation.
//!
//! Input: the template, then NUL-separated message contents (roles alternate user/assistant;
//! the first byte's low bit asks for the generation prompt).
#![no_main]

use flashlm::model::chat::{ChatMessage, ChatTemplate};
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    common::alt_stack();
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
    let _ = t.render(&messages, flags & 1 == 1);
});
