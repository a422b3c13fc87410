//! Gemma 4's BPE (`tokenizer.ggml.model = "gemma4"`): SentencePiece's
//! spelling, byte-level BPE's merge table.
//!
//! llama.cpp spells each space `▁` (prepending none), cuts the text into
//! lines and runs of newlines, and merges each piece's UTF-8 characters by
//! the GGUF's merge ranks; a character outside the vocabulary becomes its
//! `<0xAB>` byte tokens. Here that is a `▁` normalizer, a Split for the
//! lines, and a `tokenizers` BPE with byte fallback (no merge involves a
//! byte token or an unknown character, so falling back before merging
//! rather than after changes nothing). llama.cpp also takes a run of
//! newlines found whole in the vocabulary as that token without merging;
//! Gemma 4's merges build each such run (1 to 31 newlines) anyway.

use anyhow::{Context, Result};
use candle_core::quantized::gguf_file::Content;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::Replace;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::SplitDelimiterBehavior;

use super::bpe::merges;
use super::spm::{decoder, SPACE};
use super::vocab::Vocab;
use super::Family;

pub(super) fn build(content: &Content, vocab: &Vocab) -> Result<Family> {
    // Later duplicates win, as in llama.cpp's token_to_id map.
    let ids = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), id as u32))
        .collect::<tokenizers::models::bpe::Vocab>();
    let bpe = BPE::builder()
        .vocab_and_merges(ids, merges(content)?)
        .byte_fallback(true)
        .build()
        .map_err(anyhow::Error::msg)
        .context("building Gemma 4 BPE from GGUF vocabulary")?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_normalizer(Some(Replace::new(" ", SPACE).map_err(anyhow::Error::msg)?));
    inner.with_pre_tokenizer(Some(
        Split::new(
            SplitPattern::Regex(r"[^\n]+|\n+".into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(anyhow::Error::msg)?,
    ));
    inner.with_decoder(Some(decoder(false)?));
    inner.add_tokens(&vocab.added_tokens());

    Ok(Family {
        inner,
        pieces: vocab.pieces(|text| text.replace(SPACE, " ").into_bytes()),
        add_bos: true,
        strip_leading_space: false,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};

    use crate::text::tokenizer::Tokenizer;

    /// A tiny Gemma 4 vocabulary: specials, the 256 byte tokens (4..=259),
    /// then `a\n` (260), `a`, `b`, `\n`, `\n\n`, `▁`, `▁a` and `ab` (267),
    /// `a\n` first among the merges so a merge across a line break would
    /// show.
    fn tokenizer() -> Tokenizer {
        let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
            .map(String::from)
            .into();
        tokens.extend((0..=255).map(|b| format!("<0x{b:02X}>")));
        tokens.extend(
            ["a\n", "a", "b", "\n", "\n\n", "\u{2581}", "\u{2581}a", "ab"].map(String::from),
        );
        let types = (0..tokens.len())
            .map(|id| match id {
                0..=3 => 3,
                4..=259 => 6,
                _ => 1,
            })
            .map(Value::I32)
            .collect();
        let merges = ["a \n", "\u{2581} a", "a b", "\n \n"];
        let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
        let metadata = HashMap::from([
            (
                "tokenizer.ggml.model".into(),
                Value::String("gemma4".into()),
            ),
            ("tokenizer.ggml.tokens".into(), strings(tokens)),
            ("tokenizer.ggml.token_type".into(), Value::Array(types)),
            (
                "tokenizer.ggml.merges".into(),
                strings(merges.map(String::from).into()),
            ),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(2)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
            ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        ]);
        let content = Content {
            magic: VersionedMagic::GgufV3,
            metadata,
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        };
        Tokenizer::from_gguf(&content).unwrap()
    }

    #[test]
    fn spaces_lines_and_bytes() {
        let tok = tokenizer();
        // BOS although the file says no; no space prepended.
        assert_eq!(tok.encode("ab a").unwrap(), [2, 267, 266]);
        assert_eq!(tok.encode(" a").unwrap(), [2, 266]);
        // `a\n` is a token, but lines are merged apart.
        assert_eq!(tok.encode("a\n\nb").unwrap(), [2, 261, 264, 262]);
        // é is not in the vocabulary: its UTF-8 bytes.
        assert_eq!(tok.encode("a\u{e9}").unwrap(), [2, 261, 4 + 0xC3, 4 + 0xA9]);
        assert_eq!(
            tok.decode(&[267, 266, 264, 4 + 0xC3, 4 + 0xA9]).unwrap(),
            "ab a\n\n\u{e9}"
        );
    }
}
