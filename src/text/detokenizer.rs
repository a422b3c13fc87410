//! Incremental, UTF-8 safe detokenizing for streaming.
//!
//! Decoding each token on its own is wrong in general: a character can be
//! split across byte-level tokens, and some decoders (SentencePiece's
//! leading-space strip, cleanup rules) render a token differently depending
//! on its neighbours. So, as HF TGI and vLLM do, every step decodes a short
//! window of recent tokens twice — without and with the new tokens — and
//! emits the difference, but only once it no longer ends in an incomplete
//! character (U+FFFD).

use anyhow::Result;

use crate::text::tokenizer::Tokenizer;

#[derive(Debug, Default)]
pub struct IncrementalDecoder {
    /// The decode window: already emitted context tokens, then pending ones.
    ids: Vec<u32>,
    /// `ids[..read_offset]` has been emitted; it is decoded again only so the
    /// following tokens render as they would mid-text.
    read_offset: usize,
}

impl IncrementalDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token; returns the text it completes (possibly empty, e.g.
    /// while a multi-byte character is still partial).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let prefix = tok.decode_continuation(&self.ids[..self.read_offset])?;
        let full = tok.decode_continuation(&self.ids)?;
        let new = text_after(&prefix, &full);
        if new.is_empty() || new.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(String::new());
        }
        let new = new.to_string();
        // What was just emitted becomes the next window's context; older
        // tokens are no longer needed, which keeps each step's decode short.
        self.ids.drain(..self.read_offset);
        self.read_offset = self.ids.len();
        Ok(new)
    }

    /// Releases what is still held back at the end of generation. A character
    /// left incomplete for good is rendered as U+FFFD rather than dropped, so
    /// the streamed text equals decoding all ids at once.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String> {
        let prefix = tok.decode_continuation(&self.ids[..self.read_offset])?;
        let full = tok.decode_continuation(&self.ids)?;
        let rest = text_after(&prefix, &full).to_string();
        *self = Self::default();
        Ok(rest)
    }
}

/// `full` minus the already emitted `prefix`. Byte-level decoding only ever
/// appends, so `prefix` is a prefix of `full`; a decoder that rewrites earlier
/// text gets vLLM's treatment (cut at `prefix`'s length, moved forward to a
/// character boundary) since emitted text cannot be taken back.
fn text_after<'a>(prefix: &str, full: &'a str) -> &'a str {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest;
    }
    let mut cut = prefix.len().min(full.len());
    while !full.is_char_boundary(cut) {
        cut += 1;
    }
    &full[cut..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenizer::test_tokenizer;

    /// Streams `ids` one by one; returns the pieces (flush last).
    fn stream(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
        let mut dec = IncrementalDecoder::new();
        let mut pieces: Vec<String> = ids.iter().map(|&id| dec.push(tok, id).unwrap()).collect();
        pieces.push(dec.flush(tok).unwrap());
        pieces
    }

    #[test]
    fn multibyte_text_streams_exactly() {
        let tok = test_tokenizer();
        for text in [
            "大语言模型推理：预填充和解码，KV cache 缓存优化",
            "Emoji: 🙂🚀👍🏽 and accents: café naïve Zürich",
            "Ünïcödé ßtrasse ΑΒΓ абв",
            "  leading spaces and   multiple   gaps  ",
            "<|im_start|>assistant\nHi 👋<|im_end|>",
        ] {
            let ids = tok.encode(text).unwrap();
            let pieces = stream(&tok, &ids);
            for p in &pieces {
                assert!(!p.contains('\u{FFFD}'), "{text:?}: piece {p:?}");
            }
            assert_eq!(pieces.concat(), text);
            assert_eq!(pieces.concat(), tok.decode(&ids).unwrap());
            assert_eq!(
                pieces.last().unwrap(),
                "",
                "{text:?}: nothing left to flush"
            );
        }
    }

    #[test]
    fn split_character_waits_for_its_last_byte() {
        let tok = test_tokenizer();
        // 🙂 is a single character spread over several byte-level tokens.
        let ids = tok.encode("🙂").unwrap();
        assert!(ids.len() > 1);
        let pieces = stream(&tok, &ids);
        assert!(pieces[..ids.len() - 1].iter().all(String::is_empty));
        assert_eq!(pieces[ids.len() - 1], "🙂");
    }

    /// SentencePiece: the space a token carries is streamed from the first
    /// generated token on, as llama-server streams it (generated text
    /// continues the prompt; it is not the start of a text).
    #[test]
    fn sentencepiece_streams_its_spaces() {
        let content = crate::text::tokenizer::vocab_fixture("llama-spm");
        let tok = Tokenizer::from_gguf(&content).unwrap();
        // ▁Hello ▁world ▁🦙 (four byte tokens) ▁!
        let ids = tok.encode("Hello world \u{1F999} !").unwrap()[1..].to_vec();
        let pieces = stream(&tok, &ids);
        assert_eq!(pieces[0], " Hello");
        assert_eq!(pieces[1], " world");
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
        assert_eq!(pieces.concat(), " Hello world \u{1F999} !");
        assert_eq!(pieces.concat(), tok.decode_continuation(&ids).unwrap());
    }

    #[test]
    fn incomplete_tail_is_flushed_as_replacement() {
        let tok = test_tokenizer();
        let ids = tok.encode("a🙂").unwrap();
        let cut = &ids[..ids.len() - 1];
        let pieces = stream(&tok, cut);
        assert!(pieces[..cut.len()].iter().all(|p| !p.contains('\u{FFFD}')));
        assert_eq!(pieces.concat(), tok.decode(cut).unwrap());
        assert!(pieces.last().unwrap().ends_with('\u{FFFD}'));
    }
}
