//! SentencePiece BPE (`tokenizer.ggml.model = "llama"`): Llama 2, Mistral,
//! TinyLlama, Phi-3.
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
const SPACE: &str = "\u{2581}";

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
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE, " ").map_err(anyhow::Error::msg)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }

    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    inner.add_tokens(&vocab.added_tokens());

    Ok(Family {
        inner,
        pieces: vocab.pieces(|text| text.replace(SPACE, " ").into_bytes()),
        add_bos: true,
        strip_leading_space: add_space_prefix,
    })
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
