//! Stop strings matched across token boundaries.
//!
//! Streamed text arrives in arbitrary pieces, so a stop string may begin in
//! one piece and end several pieces later. [`StopMatcher`] holds back the
//! shortest tail that could still grow into a stop string and releases
//! everything before it; once a stop string matches, the text from the match
//! on is never released.

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Most stop strings one request may give. OpenAI takes 4 and TGI 4 by
/// default; vLLM sets no bound, and clients for code completion send a
/// dozen or more. Every generated piece is checked against each one, so
/// the count is bounded; their length needs no bound (matching is linear).
pub const MAX_STOPS: usize = 64;

/// A request's stop strings, each with its KMP border table, built once
/// and shared by every choice of the request (a clone is a reference).
#[derive(Clone, Default)]
pub struct StopStrings(Arc<[Pattern]>);

struct Pattern {
    text: String,
    /// `border[i]`: the length of the longest proper prefix of
    /// `text[..=i]` that is also its suffix.
    border: Vec<u32>,
}

impl Pattern {
    fn new(text: String) -> Self {
        let b = text.as_bytes();
        let mut border = vec![0u32; b.len()];
        let mut k = 0usize;
        for i in 1..b.len() {
            while k > 0 && b[i] != b[k] {
                k = border[k - 1] as usize;
            }
            if b[i] == b[k] {
                k += 1;
            }
            border[i] = k as u32;
        }
        Pattern { text, border }
    }

    /// The matched length after `byte`, given `k` bytes matched before it.
    fn advance(&self, mut k: usize, byte: u8) -> usize {
        let b = self.text.as_bytes();
        if k == b.len() {
            k = self.border[k - 1] as usize;
        }
        while k > 0 && b[k] != byte {
            k = self.border[k - 1] as usize;
        }
        k + (b[k] == byte) as usize
    }
}

impl StopStrings {
    pub fn new(stops: Vec<String>) -> Self {
        StopStrings(stops.into_iter().map(Pattern::new).collect())
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|p| p.text.as_str())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Vec<String>> for StopStrings {
    fn from(stops: Vec<String>) -> Self {
        StopStrings::new(stops)
    }
}

impl PartialEq for StopStrings {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl std::fmt::Debug for StopStrings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for StopStrings {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for StopStrings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<String>::deserialize(d).map(StopStrings::new)
    }
}

/// What one [`StopMatcher::push`] made safe to emit.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StopResult {
    /// Text that can no longer be part of a stop string.
    pub text: String,
    /// A stop string matched; `text` ends right before it and the stream is over.
    pub stopped: bool,
}

/// Scans the text once, byte by byte, keeping for each stop string how
/// much of it the text so far ends with (KMP), so a piece costs its
/// length times the number of stops, however long the stops are.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: StopStrings,
    /// Per stop string, the bytes of it the text so far ends with.
    matched: Vec<usize>,
    /// Received but not yet released: the longest of those matched tails.
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty strings are ignored: they would match before any text.
    pub fn new(stops: StopStrings) -> Self {
        let stops = if stops.iter().any(str::is_empty) {
            StopStrings::new(
                stops
                    .iter()
                    .filter(|s| !s.is_empty())
                    .map(Into::into)
                    .collect(),
            )
        } else {
            stops
        };
        StopMatcher {
            matched: vec![0; stops.len()],
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
        let from = self.held.len();
        self.held.push_str(text);

        // `held` holds no match yet, so any match ends in `text`; the
        // earliest start wins.
        let mut first_match: Option<usize> = None;
        for (p, k) in self.stops.0.iter().zip(&mut self.matched) {
            for (i, &byte) in text.as_bytes().iter().enumerate() {
                *k = p.advance(*k, byte);
                if *k == p.text.len() {
                    let start = from + i + 1 - p.text.len();
                    first_match = Some(first_match.map_or(start, |m| m.min(start)));
                    break;
                }
            }
        }
        if let Some(at) = first_match {
            self.held.truncate(at);
            self.stopped = true;
            return StopResult {
                text: std::mem::take(&mut self.held),
                stopped: true,
            };
        }

        // A matched tail starts with a stop's first byte, never inside a
        // character, so the split falls on a character boundary.
        let keep = self.matched.iter().copied().max().unwrap_or(0);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(StopStrings::new(
            stops.iter().map(|s| s.to_string()).collect(),
        ))
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

    /// Against a reference that searches the whole text after each piece:
    /// the first piece after which any stop occurs ends the stream at the
    /// earliest occurrence, and until then exactly the text that no stop
    /// can still begin in is released.
    #[test]
    fn matches_a_search_of_the_whole_text() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for _ in 0..2000 {
            let mut word = |max: usize| -> String {
                let len = 1 + next(max);
                (0..len).map(|_| ['a', 'b', 'é'][next(3)]).collect()
            };
            let stops: Vec<String> = (0..3).map(|_| word(5)).collect();
            let pieces: Vec<String> = (0..8).map(|_| word(4)).collect();
            let mut m = matcher(&stops.iter().map(String::as_str).collect::<Vec<_>>());
            let (mut text, mut released) = (String::new(), String::new());
            for piece in &pieces {
                text.push_str(piece);
                let r = m.push(piece);
                released.push_str(&r.text);
                let first = stops.iter().filter_map(|s| text.find(s.as_str())).min();
                if let Some(at) = first {
                    assert!(r.stopped, "{stops:?} {pieces:?}");
                    assert_eq!(released, text[..at], "{stops:?} {pieces:?}");
                    break;
                }
                let held = (0..text.len())
                    .filter(|&i| text.is_char_boundary(i))
                    .find(|&i| stops.iter().any(|s| s.starts_with(&text[i..])))
                    .unwrap_or(text.len());
                assert!(!r.stopped);
                assert_eq!(released, text[..held], "{stops:?} {pieces:?}");
            }
        }
    }

    #[test]
    fn held_tail_released_by_flush() {
        let mut m = matcher(&["<|end|>"]);
        assert_eq!(m.push("done <|en"), ok("done "));
        assert_eq!(m.flush(), "<|en");
        assert_eq!(m.flush(), "");
    }
}
