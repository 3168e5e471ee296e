//! From token ids to the text a client gets: streaming detokenization, then stop sequences
//! matched on the decoded text (across token boundaries) and cut from the output.

use crate::model::tokenizer::{StreamDecoder, Tokenizer};

/// Holds back text that could be the start of a stop sequence until it is known not to be.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
            stopped: false,
        }
    }

    /// True once a stop sequence was seen; later text is ignored.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds decoded text; returns the text that can be sent now. The output ends right before
    /// the earliest-starting stop sequence of the whole text: a complete stop is acted on once
    /// no stop that starts earlier can still complete. After it, [`stopped`](Self::stopped)
    /// turns true.
    pub fn push(&mut self, text: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.pending.push_str(text);
        let done = self.first_complete();
        let open = self.first_open();
        match (done, open) {
            // No stop that starts earlier can still complete.
            (Some(p), None) => self.stop_at(p),
            (Some(p), Some(o)) if o >= p => self.stop_at(p),
            // Hold back from where a stop may still complete.
            (_, Some(o)) => {
                let rest = self.pending.split_off(o);
                std::mem::replace(&mut self.pending, rest)
            }
            (None, None) => std::mem::take(&mut self.pending),
        }
    }

    /// The end of the text: whatever is held back, up to a stop sequence in it.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        match self.first_complete() {
            Some(p) => self.stop_at(p),
            None => std::mem::take(&mut self.pending),
        }
    }

    fn stop_at(&mut self, p: usize) -> String {
        self.stopped = true;
        let mut out = std::mem::take(&mut self.pending);
        out.truncate(p);
        out
    }

    /// Where the earliest complete stop sequence in the held text starts.
    fn first_complete(&self) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
    }

    /// Where the longest tail of the held text that is a proper prefix of a stop sequence
    /// starts (a stop that may still complete).
    fn first_open(&self) -> Option<usize> {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let from = self.pending.len().saturating_sub(longest.saturating_sub(1));
        (from..self.pending.len())
            .filter(|&i| self.pending.is_char_boundary(i))
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops
                    .iter()
                    .any(|s| s.len() > tail.len() && s.starts_with(tail))
            })
    }
}

/// Token ids in, client text out.
pub struct TextStream<'a> {
    decoder: StreamDecoder<'a>,
    stop: StopMatcher,
}

impl<'a> TextStream<'a> {
    pub fn new(tokenizer: &'a Tokenizer, stops: Vec<String>) -> Self {
        TextStream {
            decoder: tokenizer.stream_decoder(true),
            stop: StopMatcher::new(stops),
        }
    }

    /// The text token `id` completes (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        // An id outside the vocabulary has no text (the engine never produces one).
        let text = self.decoder.push(id).unwrap_or_default();
        self.stop.push(&text)
    }

    /// True once a stop sequence was seen.
    pub fn stopped(&self) -> bool {
        self.stop.stopped()
    }

    /// The rest of the text at the end of the generation.
    pub fn finish(&mut self) -> String {
        let tail = self.decoder.finish();
        let mut out = self.stop.push(&tail);
        out.push_str(&self.stop.finish());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`, returns (all text out, stopped).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            out.push_str(&m.push(p));
        }
        out.push_str(&m.finish());
        (out, m.stopped())
    }

    /// The oracle: the whole text up to the earliest-starting occurrence of any stop, found
    /// by trying every start position.
    fn expected(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let all: String = pieces.concat();
        for start in 0..all.len() {
            if all.is_char_boundary(start) && stops.iter().any(|s| all[start..].starts_with(s)) {
                return (all[..start].to_string(), true);
            }
        }
        (all, false)
    }

    #[test]
    fn stops_across_pieces_are_cut() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "D tail"]),
            ("abc ".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
        assert_eq!(run(&["xyz"], &["x", "y", "q"]), ("xyq".into(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
        // Text after the stop is dropped even in the same piece.
        assert_eq!(run(&["b"], &["abc", "d"]), ("a".into(), true));
    }

    #[test]
    fn held_text_is_released_once_it_cannot_match() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("hello S"), "hello ");
        assert_eq!(m.push("T"), "");
        assert_eq!(m.push("x"), "STx");
        assert!(!m.stopped());
    }

    #[test]
    fn random_pieces_match_the_whole_text_search() {
        let mut g = crate::sampling::SplitMix64(11);
        let alphabet = ['a', 'b', 'é', '\n'];
        for _ in 0..2000 {
            let n = (g.next_u64() % 6) as usize;
            let pieces: Vec<String> = (0..n)
                .map(|_| {
                    let len = (g.next_u64() % 4) as usize;
                    (0..len)
                        .map(|_| alphabet[(g.next_u64() % 4) as usize])
                        .collect()
                })
                .collect();
            let stops: Vec<String> = (0..(g.next_u64() % 3))
                .map(|_| {
                    let len = 1 + (g.next_u64() % 3) as usize;
                    (0..len)
                        .map(|_| alphabet[(g.next_u64() % 4) as usize])
                        .collect()
                })
                .collect();
            let p: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let s: Vec<&str> = stops.iter().map(String::as_str).collect();
            assert_eq!(run(&s, &p), expected(&s, &p), "stops {s:?} pieces {p:?}");
        }
    }
}
