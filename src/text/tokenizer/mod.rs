//! Text <-> token ids.
//!
//! [`Tokenizer`] wraps a `tokenizers::Tokenizer` plus the few facts the engine
//! needs beside it (BOS, end-of-generation ids). It is built either from a
//! GGUF's embedded vocabulary ([`Tokenizer::from_gguf`]), reproducing what
//! llama.cpp does for that vocabulary so prompt ids match llama.cpp's exactly,
//! or from an already loaded Hugging Face tokenizer ([`Tokenizer::from_hf`]).
//!
//! GGUF vocabularies come in families, one file each: `vocab` reads what
//! they share, `bpe` builds byte-level BPE (GPT-2, Llama 3, Qwen2,
//! Qwen3.5, SmolLM), `spm` SentencePiece (Llama 2, Mistral, Phi-3,
//! Gemma 3) and `gemma4` Gemma 4's BPE over `▁`-spelled text.

mod bpe;
mod gemma4;
mod spm;
mod vocab;

use anyhow::{bail, Result};
use candle_core::quantized::gguf_file::Content;

use vocab::{Fragment, Specials, Vocab};

#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos_ids: Vec<u32>,
    bos_id: Option<u32>,
    add_bos: bool,
    /// EOS appended by `encode`, when the GGUF asks for it.
    eos_suffix: Option<u32>,
    /// The padding and unknown tokens the model's files name: reported to
    /// clients (`/tokenizer_info`), never used by wick itself.
    pad_id: Option<u32>,
    unk_id: Option<u32>,
    /// Longest vocabulary string, in bytes.
    max_piece_bytes: usize,
    /// For a GGUF vocabulary, each id's bytes as llama.cpp renders it
    /// (`token_to_piece`); decoding concatenates them, as llama.cpp does,
    /// rather than going through the `tokenizers` decoder.
    pieces: Option<Vec<Vec<u8>>>,
    /// For a GGUF vocabulary, its special tokens: `encode` finds them in the
    /// text itself, as llama.cpp does, and hands `inner` only the text
    /// between them.
    specials: Option<Specials>,
    /// SentencePiece with `add_space_prefix`: decoding from the start of a
    /// text drops the first token's leading space (llama.cpp's
    /// `llama_detokenize`).
    strip_leading_space: bool,
}

/// What a vocabulary family ([`bpe`], [`spm`]) builds.
struct Family {
    inner: tokenizers::Tokenizer,
    pieces: Vec<Vec<u8>>,
    /// Whether llama.cpp adds BOS when the GGUF does not say.
    add_bos: bool,
    strip_leading_space: bool,
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF's `tokenizer.ggml.*` metadata,
    /// reproducing llama.cpp's tokenizer for it so prompt ids match
    /// llama.cpp's exactly: byte-level BPE (`"gpt2"`) with a pre-type from
    /// `bpe`'s table, SentencePiece (`"llama"`) or Gemma 4's BPE
    /// (`"gemma4"`). Anything else is an error rather than a silently
    /// different tokenization.
    ///
    /// Control (and unknown) tokens become special added tokens and
    /// user-defined ones plain added tokens, so their text always encodes to
    /// the single id, as with llama.cpp's `parse_special`.
    ///
    /// `eos_ids` follows llama.cpp's end-of-generation set: the GGUF EOS first,
    /// then every token whose text llama.cpp recognises as EOG. For SmolLM2
    /// that is `[2 <|im_end|>, 0 <|endoftext|>, 4 <reponame>]`: llama.cpp takes
    /// `<reponame>` for a FIM repo token, so generation stops there too.
    pub fn from_gguf(content: &Content) -> Result<Tokenizer> {
        let model = vocab::model(content)?;
        if !["gpt2", "llama", "gemma4"].contains(&model) {
            bail!(
                "unsupported GGUF tokenizer model {model:?} (wick reads byte-level BPE \"gpt2\", \
                 SentencePiece \"llama\" and \"gemma4\")"
            );
        }
        let vocab = Vocab::read(content)?;
        let family = match model {
            "gpt2" => bpe::build(content, &vocab)?,
            "gemma4" => gemma4::build(content, &vocab)?,
            _ => spm::build(&vocab)?,
        };
        let add_bos = match model {
            // llama.cpp adds BOS to Gemma 4 prompts even where the file says
            // not to: the model misbehaves without it.
            "gemma4" => true,
            _ => vocab.add_bos.unwrap_or(family.add_bos),
        };
        let add_eos = vocab.add_eos.unwrap_or(false);
        let specials = vocab.specials();
        let tok = Self::from_hf(family.inner, vocab.eog, vocab.bos, add_bos)
            .with_pad_and_unk(vocab.pad, vocab.unk);
        Ok(Tokenizer {
            eos_suffix: vocab.eos.filter(|_| add_eos),
            specials: Some(specials),
            pieces: Some(family.pieces),
            strip_leading_space: family.strip_leading_space,
            ..tok
        })
    }

    /// Wraps an already configured tokenizer. `encode` never runs its
    /// post-processor: BOS is added by `add_bos` alone, so the caller decides
    /// it once (e.g. from `tokenizer_config.json`).
    pub fn from_hf(
        inner: tokenizers::Tokenizer,
        eos_ids: Vec<u32>,
        bos_id: Option<u32>,
        add_bos: bool,
    ) -> Tokenizer {
        let max_piece_bytes = inner
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(1);
        Tokenizer {
            inner,
            eos_ids,
            bos_id,
            add_bos,
            eos_suffix: None,
            pad_id: None,
            unk_id: None,
            max_piece_bytes,
            pieces: None,
            specials: None,
            strip_leading_space: false,
        }
    }

    /// Names the padding and unknown tokens.
    pub fn with_pad_and_unk(self, pad_id: Option<u32>, unk_id: Option<u32>) -> Tokenizer {
        Tokenizer {
            pad_id,
            unk_id,
            ..self
        }
    }

    /// Bytes of text beyond which the text surely encodes to more than
    /// `tokens` tokens, so it can be refused without encoding it. A token
    /// covers at most as many input bytes as its vocabulary string has
    /// (byte-level pieces spell each byte as one or two bytes, SentencePiece
    /// pieces add `▁`); the factor 4 leaves room for normalizers that
    /// shorten text.
    pub fn max_text_bytes(&self, tokens: usize) -> usize {
        tokens
            .saturating_mul(self.max_piece_bytes)
            .saturating_mul(4)
    }

    /// Encodes `text`, parsing special-token text (e.g. `<|im_start|>`) as the
    /// special token, prepending BOS only when `add_bos` is set (and
    /// appending EOS when the GGUF asks for that).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .encode_within(text, usize::MAX)?
            .expect("no text passes usize::MAX tokens"))
    }

    /// [`Tokenizer::encode`], giving up (`None`) once the ids pass `limit`,
    /// so a prompt far past the context costs about what one that fills
    /// it does: the special tokens cut text into pieces, and no piece after
    /// the limit is encoded.
    pub fn encode_within(&self, text: &str, limit: usize) -> Result<Option<Vec<u32>>> {
        let mut ids: Vec<u32> = self.bos_id.filter(|_| self.add_bos).into_iter().collect();
        let fragments = match &self.specials {
            Some(specials) => specials.partition(text),
            None => vec![Fragment::Text(text)],
        };
        for fragment in fragments {
            match fragment {
                Fragment::Text(t) => {
                    let enc = self.inner.encode(t, false).map_err(anyhow::Error::msg)?;
                    ids.extend_from_slice(enc.get_ids());
                }
                Fragment::Token(id) => ids.push(id),
            }
            if ids.len() > limit {
                return Ok(None);
            }
        }
        ids.extend(self.eos_suffix);
        Ok((ids.len() <= limit).then_some(ids))
    }

    /// Decodes `ids` to text, rendering special tokens' text too (llama.cpp's
    /// `special = true`, HF's `skip_special_tokens = false`): nothing the model
    /// produced is hidden. Callers stop before EOG ids, so those never show up
    /// in generated text. Incomplete UTF-8 at the end becomes U+FFFD; streaming
    /// goes through [`crate::text::detokenizer::IncrementalDecoder`] instead.
    ///
    /// The ids are taken as the start of a text: a SentencePiece vocabulary
    /// drops the space its tokenizer prepended (`▁Hello` is `Hello`).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.pieces {
            Some(pieces) => Ok(render(pieces, ids, self.strip_leading_space)),
            None => self.inner.decode(ids, false).map_err(anyhow::Error::msg),
        }
    }

    /// [`Tokenizer::decode`] for ids that continue earlier text, such as
    /// generated tokens after a prompt: every token reads as it does
    /// mid-text (`▁Hello` is ` Hello`), as in llama-server's output.
    pub fn decode_continuation(&self, ids: &[u32]) -> Result<String> {
        match &self.pieces {
            Some(pieces) => Ok(render(pieces, ids, false)),
            None => self.inner.decode(ids, false).map_err(anyhow::Error::msg),
        }
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The token's vocabulary string (byte-level form, e.g. `Ġhello`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a vocabulary string (byte-level form, e.g. `Ġhello`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Whether `encode` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.eos_suffix.is_some()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Ids that end generation (EOS first).
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.unk_id
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// llama.cpp's `llama_detokenize` over a piece table: the pieces' bytes in
/// order, the first one's leading space dropped if `strip_leading_space`.
/// Unknown ids render as nothing, as with `tokenizers`.
fn render(pieces: &[Vec<u8>], ids: &[u32], strip_leading_space: bool) -> String {
    let mut bytes = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        let Some(piece) = pieces.get(id as usize) else {
            continue;
        };
        let piece = match i == 0 && strip_leading_space {
            true => piece.strip_prefix(b" ").unwrap_or(piece),
            false => piece,
        };
        bytes.extend_from_slice(piece);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The default model's tokenizer, for unit tests here and in sibling modules.
#[cfg(test)]
pub(crate) fn test_tokenizer() -> Tokenizer {
    let path = crate::load::model_fetch::default_model_path().expect("default model");
    let mut f = std::fs::File::open(path).unwrap();
    let content = Content::read(&mut f).expect("read gguf");
    Tokenizer::from_gguf(&content).expect("tokenizer")
}

/// A vocabulary-only GGUF from llama.cpp's test vectors
/// (`tests/fixtures/llama-cpp/vocab`), for unit tests: `llama-spm`, `phi-3`,
/// `llama-bpe`, `qwen2`, `qwen35` or `gpt-2`; or `gemma-3`, written here
/// (`tests/fixtures/gemma3-vocab`).
#[cfg(test)]
pub(crate) fn vocab_fixture(name: &str) -> Content {
    let dir = match name {
        "gemma-3" => "tests/fixtures/gemma3-vocab",
        _ => "tests/fixtures/llama-cpp/vocab",
    };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(dir)
        .join(format!("ggml-vocab-{name}.gguf"));
    let mut f = std::fs::File::open(&path).unwrap();
    Content::read(&mut f).expect("read gguf")
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::Value;

    fn fixture_tokenizer(name: &str) -> Tokenizer {
        Tokenizer::from_gguf(&vocab_fixture(name)).unwrap()
    }

    /// BOS, EOS, whether they are added and the EOG set, as llama.cpp
    /// reports them for each vocabulary (`llama_vocab_bos`, `_get_add_bos`,
    /// `_is_eog` over all ids).
    #[test]
    fn special_ids_as_llama_cpp() {
        for (name, bos, add_bos, eog) in [
            ("llama-spm", 1, true, &[2][..]),
            ("phi-3", 1, true, &[32000, 2, 32007][..]),
            ("llama-bpe", 128000, true, &[128001, 128009][..]),
            // The file's `</s>` (128247) is a normal token, but its text
            // makes it EOG for llama.cpp.
            ("qwen2", 151643, false, &[151643, 128247, 151645][..]),
            ("gpt-2", 50256, false, &[50256][..]),
            // EOS is `<end_of_turn>`; `<eos>` and the HTML `</s>` end
            // generation by their text.
            ("gemma-3", 2, true, &[106, 1, 212][..]),
        ] {
            let tok = fixture_tokenizer(name);
            assert_eq!(tok.bos_id(), Some(bos), "{name}");
            assert_eq!(tok.add_bos(), add_bos, "{name}");
            assert!(!tok.add_eos(), "{name}");
            assert_eq!(tok.eos_ids(), eog, "{name}: EOS first, then by id");
        }
    }

    /// `add_eos_token` appends EOS, as llama.cpp does with add_special.
    #[test]
    fn add_eos_appends() {
        let mut content = vocab_fixture("llama-spm");
        content
            .metadata
            .insert("tokenizer.ggml.add_eos_token".into(), Value::Bool(true));
        let tok = Tokenizer::from_gguf(&content).unwrap();
        assert!(tok.add_eos());
        assert_eq!(tok.encode("Hello world").unwrap(), [1, 15043, 3186, 2]);
    }

    /// SentencePiece's prepended space is dropped at the start of a text
    /// only (llama.cpp's llama_detokenize), never mid-text.
    #[test]
    fn leading_space_dropped_only_at_the_start() {
        let tok = fixture_tokenizer("llama-spm");
        // ▁Hello ▁world
        assert_eq!(tok.decode(&[15043, 3186]).unwrap(), "Hello world");
        assert_eq!(
            tok.decode_continuation(&[15043, 3186]).unwrap(),
            " Hello world"
        );
        // After BOS the space stays, as llama.cpp renders it.
        assert_eq!(tok.decode(&[1, 15043]).unwrap(), "<s> Hello");
        // Byte-level vocabularies have nothing to drop.
        let tok = fixture_tokenizer("llama-bpe");
        let ids = tok.encode(" Hi").unwrap();
        assert_eq!(tok.decode(&ids[1..]).unwrap(), " Hi");
    }

    /// Within its limit the bounded encoding is the whole one; one token
    /// short of it, there is none.
    #[test]
    fn encode_within_gives_up_past_its_limit() {
        let tok = test_tokenizer();
        let text = "<|im_start|>user\nhi there<|im_end|>\n".repeat(50);
        let all = tok.encode(&text).unwrap();
        assert_eq!(
            tok.encode_within(&text, all.len()).unwrap(),
            Some(all.clone())
        );
        assert_eq!(tok.encode_within(&text, all.len() - 1).unwrap(), None);
        assert_eq!(tok.encode_within(&text, 3).unwrap(), None);
    }

    /// The bound holds on text made of the longest pieces, the worst case.
    #[test]
    fn max_text_bytes_bounds_real_text() {
        let tok = test_tokenizer();
        let longest = (0..tok.vocab_size() as u32)
            .map(|id| tok.decode(&[id]).unwrap())
            .max_by_key(String::len)
            .unwrap();
        let text = longest.repeat(50);
        let n = tok.encode(&text).unwrap().len();
        assert!(
            text.len() <= tok.max_text_bytes(n),
            "{} bytes, {n} tokens",
            text.len()
        );
        assert!(
            tok.max_text_bytes(8192) < 8 << 20,
            "an 8 MB prompt is refused unread"
        );
    }

    #[test]
    fn special_tokens_and_eog() {
        let tok = test_tokenizer();
        assert_eq!(tok.vocab_size(), 49152);
        assert_eq!(tok.bos_id(), Some(1));
        assert_eq!(tok.eos_ids(), &[2, 0, 4]);
        assert_eq!((tok.pad_id(), tok.unk_id()), (Some(2), Some(0)));
        assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
        assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
        let ids = tok.encode("<|im_start|>user\nHi<|im_end|>\n").unwrap();
        assert_eq!(ids[0], 1);
        assert!(ids.contains(&2));
        // Special text survives decoding, and the round trip is exact.
        assert_eq!(
            tok.decode(&ids).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn add_bos_prepends() {
        let tok = test_tokenizer();
        let plain = tok.encode("Hello").unwrap();
        let with_bos = Tokenizer::from_hf(tok.inner().clone(), vec![2], Some(1), true);
        let ids = with_bos.encode("Hello").unwrap();
        assert_eq!(ids[0], 1);
        assert_eq!(&ids[1..], &plain[..]);
    }

    #[test]
    fn decode_roundtrips_unicode() {
        let tok = test_tokenizer();
        let text = "naïve 大语言模型 🙂🚀 x²";
        assert_eq!(tok.decode(&tok.encode(text).unwrap()).unwrap(), text);
    }
}
