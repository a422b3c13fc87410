//! Per-request text output: incremental detokenizing plus stop-string
//! hold-back. Runs with whoever consumes engine events, never on the
//! scheduler's hot path.

use crate::text::detokenizer::IncrementalDecoder;
use crate::text::stop::{StopMatcher, StopStrings};
use crate::text::tokenizer::Tokenizer;

pub struct TextStream {
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    stopped: bool,
}

/// Text that became visible with one token.
#[derive(Debug, Default, PartialEq)]
pub struct TextDelta {
    pub text: String,
    /// A stop string matched: the request is over and the match is not in `text`.
    pub stopped: bool,
}

impl TextStream {
    pub fn new(stops: StopStrings) -> Self {
        TextStream {
            decoder: IncrementalDecoder::new(),
            stop: StopMatcher::new(stops),
            stopped: false,
        }
    }

    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> anyhow::Result<TextDelta> {
        if self.stopped {
            return Ok(TextDelta {
                text: String::new(),
                stopped: true,
            });
        }
        let piece = self.decoder.push(tokenizer, id)?;
        let r = self.stop.push(&piece);
        self.stopped = r.stopped;
        Ok(TextDelta {
            text: r.text,
            stopped: r.stopped,
        })
    }

    /// What is still held back once the request ended without a stop string.
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> anyhow::Result<String> {
        if self.stopped {
            return Ok(String::new());
        }
        let tail = self.decoder.flush(tokenizer)?;
        let r = self.stop.push(&tail);
        self.stopped = r.stopped;
        if r.stopped {
            return Ok(r.text);
        }
        Ok(r.text + &self.stop.flush())
    }
}
