//! Progress lines on stderr for long work (writing a file, a long prompt's prefill): redrawn in
//! place a few times a second on a terminal, one line per tenth of the work otherwise.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::flash::format_size;

/// What the counts are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    /// Prompt tokens through the prefill.
    Tokens,
}

pub struct Progress {
    unit: Unit,
    start: Instant,
    /// Nothing is drawn before this much time has passed (short work stays quiet).
    quiet_for: Duration,
    last_draw: Option<Instant>,
    tty: bool,
    last_tenth: u64,
}

impl Progress {
    pub fn new(unit: Unit) -> Self {
        Self {
            unit,
            start: Instant::now(),
            quiet_for: Duration::ZERO,
            last_draw: None,
            tty: std::io::stderr().is_terminal(),
            last_tenth: 0,
        }
    }

    /// Draw nothing until `d` has passed (the line appears only for work that takes longer).
    pub fn quiet_for(mut self, d: Duration) -> Self {
        self.quiet_for = d;
        self
    }

    pub fn update(&mut self, done: u64, total: u64) {
        let now = Instant::now();
        let elapsed = now.duration_since(self.start);
        let finished = done >= total;
        if !should_draw(
            self.tty,
            elapsed,
            self.quiet_for,
            self.last_draw.map(|t| now.duration_since(t)),
            &mut self.last_tenth,
            done,
            total,
        ) {
            return;
        }
        self.last_draw = Some(now);
        let line = progress_line(self.unit, done, total, elapsed);
        let mut err = std::io::stderr().lock();
        let _ = if self.tty {
            write!(err, "\r{line}\x1b[K{}", if finished { "\n" } else { "" })
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
    }
}

/// Whether to draw now: never while quiet (but for the end of work that was drawn before); on
/// a terminal at most every 200 ms and at the end; elsewhere once per tenth reached.
fn should_draw(
    tty: bool,
    elapsed: Duration,
    quiet_for: Duration,
    since_draw: Option<Duration>,
    last_tenth: &mut u64,
    done: u64,
    total: u64,
) -> bool {
    let finished = done >= total;
    if elapsed < quiet_for && !(finished && since_draw.is_some()) {
        return false;
    }
    if finished {
        // The end line only closes a line that was drawn (or work that was never quiet).
        return since_draw.is_some() || quiet_for.is_zero();
    }
    if tty {
        return since_draw.is_none_or(|d| d >= Duration::from_millis(200));
    }
    let tenth = done.saturating_mul(10) / total.max(1);
    if tenth <= *last_tenth && since_draw.is_some() {
        return false;
    }
    *last_tenth = tenth;
    true
}

/// `[#####.....]  52.3%  1.6 GiB / 3.1 GiB  210.4 MiB/s  ETA 0:07` (bytes), or
/// `prefill [#####.....]  52.3%  1071 / 2048 tokens  41.9 tok/s  ETA 0:23` (tokens).
pub fn progress_line(unit: Unit, done: u64, total: u64, elapsed: Duration) -> String {
    let frac = if total == 0 {
        1.0
    } else {
        (done as f64 / total as f64).min(1.0)
    };
    const WIDTH: usize = 30;
    let filled = (frac * WIDTH as f64) as usize;
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
    let eta = if rate > 0.0 && done < total {
        let left = ((total - done) as f64 / rate) as u64;
        format!("  ETA {}:{:02}", left / 60, left % 60)
    } else {
        String::new()
    };
    let bar = format!(
        "[{}{}] {:5.1}%",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled),
        frac * 100.0
    );
    match unit {
        Unit::Bytes => format!(
            "{bar}  {} / {}  {}/s{eta}",
            format_size(done),
            format_size(total),
            format_size(rate as u64),
        ),
        Unit::Tokens => format!("prefill {bar}  {done} / {total} tokens  {rate:.1} tok/s{eta}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_lines() {
        let l = progress_line(Unit::Bytes, 1 << 29, 1 << 30, Duration::from_secs(2));
        assert!(
            l.starts_with(&format!("[{}{}]", "#".repeat(15), ".".repeat(15))),
            "{l}"
        );
        assert!(l.contains(" 50.0%") && l.contains("512 MiB / 1 GiB"), "{l}");
        assert!(l.contains("256 MiB/s") && l.contains("ETA 0:02"), "{l}");
        let l = progress_line(Unit::Bytes, 10, 10, Duration::ZERO);
        assert!(l.contains("100.0%") && !l.contains("ETA"), "{l}");
    }

    #[test]
    fn token_lines() {
        // 640 of 2048 tokens in 16 s: 40 tok/s, 1408 left = 35 s.
        let l = progress_line(Unit::Tokens, 640, 2048, Duration::from_secs(16));
        assert!(l.starts_with("prefill [#########....."), "{l}");
        assert!(
            l.contains(" 31.2%") && l.contains("640 / 2048 tokens"),
            "{l}"
        );
        assert!(l.contains("40.0 tok/s") && l.contains("ETA 0:35"), "{l}");
    }

    #[test]
    fn quiet_then_tenths() {
        let s = Duration::from_secs(1);
        let q = Duration::from_secs(2);
        let mut tenth = 0;
        // Quiet: nothing drawn, not even the end of short work.
        assert!(!should_draw(false, s, q, None, &mut tenth, 3, 10));
        assert!(!should_draw(false, s, q, None, &mut tenth, 10, 10));
        // Past the quiet time: the first update draws, then once per tenth.
        let late = Duration::from_secs(3);
        assert!(should_draw(false, late, q, None, &mut tenth, 31, 100));
        assert_eq!(tenth, 3);
        assert!(!should_draw(false, late, q, Some(s), &mut tenth, 39, 100));
        assert!(should_draw(false, late, q, Some(s), &mut tenth, 40, 100));
        // The end closes a drawn line.
        assert!(should_draw(false, late, q, Some(s), &mut tenth, 100, 100));
        // On a terminal: at most every 200 ms, and the end always once drawn.
        let ms = Duration::from_millis;
        assert!(!should_draw(
            true,
            late,
            q,
            Some(ms(50)),
            &mut tenth,
            50,
            100
        ));
        assert!(should_draw(
            true,
            late,
            q,
            Some(ms(250)),
            &mut tenth,
            51,
            100
        ));
        assert!(should_draw(
            true,
            late,
            q,
            Some(ms(10)),
            &mut tenth,
            100,
            100
        ));
        // Without a quiet time, the end of work is drawn even if nothing was.
        assert!(should_draw(true, s, Duration::ZERO, None, &mut tenth, 5, 5));
    }
}
