//! Stop strings matched across token boundaries.
//!
//! Streamed text arrives in arbitrary pieces, so a stop string may begin in
//! one piece and end several pieces later. [`StopMatcher`] holds back the
//! shortest tail that could still grow into a stop string and releases
//! everything before it; once a stop string matches, the text from the match
//! on is never released.

/// What one [`StopMatcher::push`] made safe to emit.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StopResult {
    /// Text that can no longer be part of a stop string.
    pub text: String,
    /// A stop string matched; `text` ends right before it and the stream is over.
    pub stopped: bool,
}

#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Received but not yet released: always a proper prefix of some stop.
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty strings are ignored: they would match before any text.
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        StopMatcher {
            stops,
            held: String::new(),
            stopped: false,
        }
    }

    /// Feeds the next piece of text. After a match, further pushes return
    /// nothing.
    pub fn push(&mut self, text: &str) -> StopResult {
        if self.stopped {
            return StopResult {
                text: String::new(),
                stopped: true,
            };
        }
        self.held.push_str(text);

        // Every position before `held` was already ruled out as a match
        // start, so only `held` needs searching; the earliest start wins.
        let first_match = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first_match {
            self.held.truncate(at);
            self.stopped = true;
            return StopResult {
                text: std::mem::take(&mut self.held),
                stopped: true,
            };
        }

        let keep = self
            .stops
            .iter()
            .map(|s| partial_match_len(&self.held, s))
            .max()
            .unwrap_or(0);
        let released = self.held.len() - keep;
        let rest = self.held.split_off(released);
        StopResult {
            text: std::mem::replace(&mut self.held, rest),
            stopped: false,
        }
    }

    /// Releases the held-back tail at the end of the stream (empty after a
    /// match, whose text is dropped).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`.
/// Compared as bytes: a suffix starting inside a character begins with a
/// continuation byte, which no string starts with, so the result always
/// falls on a character boundary.
fn partial_match_len(text: &str, stop: &str) -> usize {
    let (text, stop) = (text.as_bytes(), stop.as_bytes());
    let max = text.len().min(stop.len() - 1);
    (1..=max)
        .rev()
        .find(|&n| text[text.len() - n..] == stop[..n])
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()).collect())
    }

    fn ok(text: &str) -> StopResult {
        StopResult {
            text: text.into(),
            stopped: false,
        }
    }

    fn stop(text: &str) -> StopResult {
        StopResult {
            text: text.into(),
            stopped: true,
        }
    }

    #[test]
    fn stop_split_across_pushes() {
        let mut m = matcher(&["</answer>"]);
        assert_eq!(m.push("42 </"), ok("42 "));
        assert_eq!(m.push("ans"), ok(""));
        assert_eq!(m.push("wer"), ok(""));
        assert_eq!(m.push("> trailing"), stop(""));
        assert_eq!(m.push("more"), stop(""));
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn false_start_is_released() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("ST"), ok(""));
        assert_eq!(m.push("ART and S"), ok("START and "));
        assert_eq!(m.push("o on"), ok("So on"));
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn overlapping_candidates() {
        // "aab" must be found even though the first "aa" looked like the start.
        let mut m = matcher(&["aab"]);
        assert_eq!(m.push("xa"), ok("x"));
        assert_eq!(m.push("a"), ok(""));
        assert_eq!(m.push("a"), ok("a"));
        assert_eq!(m.push("b!"), stop(""));

        // One stop's partial match ends inside another's.
        let mut m = matcher(&["abcd", "cde"]);
        assert_eq!(m.push("abc"), ok(""));
        assert_eq!(m.push("dx"), stop(""));
        let mut m = matcher(&["abcd", "cde"]);
        assert_eq!(m.push("abc"), ok(""));
        assert_eq!(m.push("e"), ok("abce"));
        let mut m = matcher(&["abcx", "cde"]);
        assert_eq!(m.push("abc"), ok(""));
        assert_eq!(m.push("de"), stop("ab"));
    }

    #[test]
    fn stop_at_the_very_start() {
        let mut m = matcher(&["Human:"]);
        assert_eq!(m.push("Human: hi"), stop(""));
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let mut m = matcher(&["world", "lo"]);
        assert_eq!(m.push("hello world"), stop("hel"));
        let mut m = matcher(&["\n\n", "END"]);
        assert_eq!(m.push("one END two\n\n"), stop("one "));
    }

    #[test]
    fn no_stops_holds_nothing() {
        let mut m = matcher(&[]);
        assert_eq!(m.push("any"), ok("any"));
        assert_eq!(m.push(" text"), ok(" text"));
        assert_eq!(m.flush(), "");
        // Empty stop strings are ignored rather than matching everywhere.
        let mut m = matcher(&[""]);
        assert_eq!(m.push("abc"), ok("abc"));
    }

    #[test]
    fn unicode() {
        let mut m = matcher(&["世界", "🛑"]);
        assert_eq!(m.push("你好世"), ok("你好"));
        assert_eq!(m.push("纪"), ok("世纪"));
        assert_eq!(m.push("é世"), ok("é"));
        assert_eq!(m.push("界 rest"), stop("")); // nothing after 世 was released
        let mut m = matcher(&["🛑"]);
        assert_eq!(m.push("go 🟢 🛑"), stop("go 🟢 "));
    }

    #[test]
    fn held_tail_released_by_flush() {
        let mut m = matcher(&["<|end|>"]);
        assert_eq!(m.push("done <|en"), ok("done "));
        assert_eq!(m.flush(), "<|en");
        assert_eq!(m.flush(), "");
    }
}
