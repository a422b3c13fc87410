//! SentencePiece BPE (`tokenizer.ggml.model = "llama"`): Llama 2, Mistral,
//! TinyLlama, Phi-3, Gemma 3.
//!
//! llama.cpp tokenizes each stretch of text between special tokens on its
//! own: a space is prepended (`add_space_prefix`), spaces become `▁`, and
//! then, starting from single characters, the adjacent pair whose
//! concatenation is the highest-scoring vocabulary entry is merged, the
//! leftmost pair first among equals, until nothing merges. Characters left
//! outside the vocabulary become `<0xAB>` byte tokens.
//!
//! Here that is a `tokenizers` BPE whose merge ranks come from those scores
//! (as transformers converts a SentencePiece model), with byte fallback, and
//! a normalizer doing the `▁` spelling. `tokenizers` applies the normalizer
//! to each stretch between added tokens separately, which is where llama.cpp
//! prepends its space too.

use std::collections::HashMap;

use anyhow::{Context, Result};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper};

use super::vocab::Vocab;
use super::Family;

/// SentencePiece's visible space.
pub(super) const SPACE: &str = "\u{2581}";

pub(super) fn build(vocab: &Vocab) -> Result<Family> {
    // Later duplicates win, as in llama.cpp's token_to_id map.
    let ids: HashMap<&str, u32> = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.as_str(), id as u32))
        .collect();
    let merges = merges_by_score(vocab, &ids);
    let mut builder = BPE::builder()
        .vocab_and_merges(
            ids.iter()
                .map(|(t, id)| (t.to_string(), *id))
                .collect::<tokenizers::models::bpe::Vocab>(),
            merges,
        )
        .byte_fallback(true);
    // Only reached for a character whose bytes have no `<0xAB>` token.
    if let Some(unk) = vocab.unk {
        builder = builder.unk_token(vocab.tokens[unk as usize].clone());
    }
    let bpe = builder
        .build()
        .map_err(anyhow::Error::msg)
        .context("building SentencePiece BPE from GGUF vocabulary")?;

    let add_space_prefix = vocab.add_space_prefix.unwrap_or(true);
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        normalizers.push(Prepend::new(SPACE.into()).into());
    }
    normalizers.push(Replace::new(" ", SPACE).map_err(anyhow::Error::msg)?.into());

    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    inner.with_decoder(Some(decoder(add_space_prefix)?));
    inner.add_tokens(&vocab.added_tokens());

    Ok(Family {
        inner,
        pieces: vocab.pieces(|text| text.replace(SPACE, " ").into_bytes()),
        add_bos: true,
        strip_leading_space: add_space_prefix,
    })
}

/// The `tokenizers` decoder for `▁`-spelled pieces with `<0xAB>` byte
/// tokens, dropping the space the normalizer prepended if it did.
pub(super) fn decoder(add_space_prefix: bool) -> Result<DecoderWrapper> {
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE, " ").map_err(anyhow::Error::msg)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    Ok(DecoderSequence::new(decoders).into())
}

/// Every split of a vocabulary entry into two entries, best first: by the
/// entry's score, as llama.cpp picks merges. Where scores tie (Llama's `▁`
/// runs all score -1e9) llama.cpp takes the leftmost pair, so a run grows
/// from its left end; ranking the longer left part first does the same.
fn merges_by_score(vocab: &Vocab, ids: &HashMap<&str, u32>) -> Vec<(String, String)> {
    let mut found: Vec<(f32, usize, u32, &str, &str)> = Vec::new();
    for (id, text) in vocab.tokens.iter().enumerate() {
        let id = id as u32;
        if ids.get(text.as_str()) != Some(&id) {
            continue;
        }
        for (at, _) in text.char_indices().skip(1) {
            let (left, right) = text.split_at(at);
            if ids.contains_key(left) && ids.contains_key(right) {
                found.push((vocab.scores[id as usize], left.len(), id, left, right));
            }
        }
    }
    found.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    found
        .into_iter()
        .map(|(_, _, _, l, r)| (l.to_string(), r.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::gguf_file::Value;

    use crate::text::tokenizer::{vocab_fixture, Tokenizer};

    fn llama2() -> Tokenizer {
        Tokenizer::from_gguf(&vocab_fixture("llama-spm")).unwrap()
    }

    // Expected ids are llama.cpp's (llama_tokenize with add_special and
    // parse_special, as wick always encodes) on the same vocabulary.

    #[test]
    fn space_prefix_and_bos() {
        let tok = llama2();
        assert_eq!(tok.encode("Hello world").unwrap(), [1, 15043, 3186]);
        // A prefix is added after every special token, not just at the start.
        assert_eq!(
            tok.encode("<s>[INST] Hi [/INST]").unwrap(),
            [1, 1, 518, 25580, 29962, 6324, 518, 29914, 25580, 29962]
        );
        assert_eq!(tok.encode("<unk>x").unwrap(), [1, 0, 921]);
        assert_eq!(tok.encode("Hi</s>").unwrap(), [1, 6324, 2]);
        assert_eq!(tok.decode(&[1, 6324, 2]).unwrap(), "<s> Hi</s>");
    }

    #[test]
    fn without_space_prefix() {
        let mut content = vocab_fixture("llama-spm");
        content
            .metadata
            .insert("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false));
        let tok = Tokenizer::from_gguf(&content).unwrap();
        // `Hello`, not `▁Hello`.
        assert_eq!(tok.encode("Hello world").unwrap(), [1, 10994, 3186]);
        assert_eq!(
            tok.encode("<s>Hi</s> there").unwrap(),
            [1, 1, 18567, 2, 727]
        );
        // Nothing was prepended, so nothing is dropped.
        assert_eq!(tok.decode(&[3186]).unwrap(), " world");
    }

    #[test]
    fn byte_fallback() {
        let tok = llama2();
        // No piece for a tab: <0x09>.
        assert_eq!(tok.encode("Hello\tworld").unwrap(), [1, 15043, 12, 11526]);
        // 🦙 is four byte tokens after the prefix space.
        let ids = tok.encode("\u{1F999}").unwrap();
        assert_eq!(ids, [1, 29871, 243, 162, 169, 156]);
        assert_eq!(tok.decode(&ids[1..]).unwrap(), "\u{1F999}");
        // A partial character decodes to U+FFFD until its last byte.
        assert_eq!(tok.decode(&ids[1..4]).unwrap(), "\u{FFFD}");
    }

    /// Phi-3 drops ASCII whitespace after its chat tokens, and only that.
    #[test]
    fn phi3_strips_whitespace_after_special_tokens() {
        let tok = Tokenizer::from_gguf(&vocab_fixture("phi-3")).unwrap();
        assert_eq!(
            tok.encode("<|user|>\n Hi<|end|>\n<|assistant|>").unwrap(),
            [1, 32010, 6324, 32007, 32001]
        );
        // U+00A0 stays: `▁\u{a0}` then `Hi`.
        assert_eq!(
            tok.encode("<|user|>\u{a0}Hi").unwrap(),
            [1, 32010, 20246, 18567]
        );
        // Not after <s>.
        assert_eq!(tok.encode("<s> Hi").unwrap(), [1, 1, 29871, 6324]);
    }

    /// Llama's runs of `▁` all score the same; llama.cpp grows a run from
    /// its left end, 16 at a time.
    #[test]
    fn space_runs_split_from_the_left() {
        let tok = llama2();
        let ids = tok.encode(&format!("{}x", " ".repeat(20))).unwrap();
        // 21 spaces with the prefix: 16, then 4, then ▁x.
        assert_eq!(ids, [1, 462, 268, 921]);
    }
}
