//! Text <-> token ids.
//!
//! [`Tokenizer`] wraps a `tokenizers::Tokenizer` plus the few facts the engine
//! needs beside it (BOS, end-of-generation ids). It is built either from a
//! GGUF's embedded vocabulary ([`Tokenizer::from_gguf`]), reproducing what
//! llama.cpp does for that vocabulary so prompt ids match llama.cpp's exactly,
//! or from an already loaded Hugging Face tokenizer ([`Tokenizer::from_hf`]).

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// llama.cpp's `\p{N}` pass for the SmolLM/StarCoder family: every numeric
/// character becomes its own piece, so numbers are tokenized digit by digit.
const DIGIT_PATTERN: &str = r"\p{N}";

/// The GPT-2 word split llama.cpp uses for these vocabularies. llama.cpp lists
/// it without the final `|\s+`, but its hand-written GPT-2 splitter (which
/// replaces the regex for this exact pattern) falls back to "all remaining
/// whitespace" just like that alternative, so it is spelled out here.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.pre` values llama.cpp maps to the pre-type whose splits are
/// [`DIGIT_PATTERN`] then [`GPT2_PATTERN`] (`LLAMA_VOCAB_PRE_TYPE_SMOLLM` and the
/// pre-types sharing its `case` in `llm_tokenizer_bpe`).
const DIGITS_THEN_GPT2_PRE: &[&str] = &[
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
    "mellum2",
];

/// Token texts llama.cpp (the build behind `tests/fixtures/llama-cpp`) treats as
/// end-of-generation wherever they occur in a vocabulary: its text-based EOG
/// list plus its FIM pad/repo/separator candidates, which it also adds. (It
/// keeps only the first FIM candidate found per kind and has a few
/// per-family exceptions for vocabularies wick does not load; not mirrored.)
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
    // FIM pad
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    // FIM repo
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    // FIM file separator
    "<|file_sep|>",
];

// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_UNKNOWN: i32 = 2;
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos_ids: Vec<u32>,
    bos_id: Option<u32>,
    add_bos: bool,
    /// The padding and unknown tokens the model's files name: reported to
    /// clients (`/tokenizer_info`), never used by wick itself.
    pad_id: Option<u32>,
    unk_id: Option<u32>,
    /// Longest vocabulary string, in bytes.
    max_piece_bytes: usize,
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF's `tokenizer.ggml.*` metadata.
    ///
    /// Only byte-level BPE (`tokenizer.ggml.model = "gpt2"`) with a pre-type
    /// from [`DIGITS_THEN_GPT2_PRE`] is supported; anything else is an error
    /// rather than a silently different tokenization.
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
        let model = meta_str(content, "tokenizer.ggml.model")?;
        if model != "gpt2" {
            bail!("unsupported GGUF tokenizer model {model:?} (only byte-level BPE \"gpt2\")");
        }
        let pre = meta_str(content, "tokenizer.ggml.pre").unwrap_or("default");
        if !DIGITS_THEN_GPT2_PRE.contains(&pre) {
            bail!("unsupported GGUF pre-tokenizer {pre:?}");
        }

        let tokens = meta_array(content, "tokenizer.ggml.tokens")?
            .iter()
            .map(|v| v.to_string().cloned())
            .collect::<candle_core::Result<Vec<String>>>()
            .context("tokenizer.ggml.tokens")?;
        let token_types = match content.metadata.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()?
                .iter()
                .map(|t| t.to_i32())
                .collect::<candle_core::Result<Vec<i32>>>()
                .context("tokenizer.ggml.token_type")?,
            None => Vec::new(),
        };
        let merges = meta_array(content, "tokenizer.ggml.merges")?
            .iter()
            .map(|v| {
                let m = v.to_string()?;
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .with_context(|| format!("malformed merge {m:?}"))
            })
            .collect::<Result<Vec<_>>>()?;

        // Later duplicates win, as in llama.cpp's token_to_id map.
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.clone(), id as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(anyhow::Error::msg)
            .context("building BPE from GGUF vocabulary")?;

        let mut inner = tokenizers::Tokenizer::new(bpe);
        let split = |pattern: &str| -> Result<PreTokenizerWrapper> {
            Ok(Split::new(
                SplitPattern::Regex(pattern.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(anyhow::Error::msg)?
            .into())
        };
        inner.with_pre_tokenizer(Some(Sequence::new(vec![
            split(DIGIT_PATTERN)?,
            split(GPT2_PATTERN)?,
            // Splitting is done above; this only maps bytes to BPE symbols.
            ByteLevel::new(false, false, false).into(),
        ])));
        inner.with_decoder(Some(ByteLevelDecoder::default()));

        let added: Vec<AddedToken> = tokens
            .iter()
            .enumerate()
            .filter_map(|(id, text)| {
                // llama.cpp forces EOG-looking tokens to control type.
                let ty = if EOG_TEXTS.contains(&text.as_str()) {
                    TOKEN_TYPE_CONTROL
                } else {
                    token_types.get(id).copied()?
                };
                match ty {
                    TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN => {
                        Some(AddedToken::from(text.clone(), true))
                    }
                    TOKEN_TYPE_USER_DEFINED => Some(AddedToken::from(text.clone(), false)),
                    _ => None,
                }
            })
            .collect();
        inner.add_tokens(&added);

        let eos = meta_u32(content, "tokenizer.ggml.eos_token_id")?;
        let bos_id = meta_u32(content, "tokenizer.ggml.bos_token_id")?;
        let add_bos = match content.metadata.get("tokenizer.ggml.add_bos_token") {
            Some(v) => v.to_bool().context("tokenizer.ggml.add_bos_token")?,
            // llama.cpp's default for BPE vocabularies without the key.
            None => false,
        };
        let mut eog: Vec<u32> = tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| EOG_TEXTS.contains(&t.as_str()))
            .map(|(id, _)| id as u32)
            .collect();
        eog.retain(|id| Some(*id) != eos);
        let eos_ids = eos.into_iter().chain(eog).collect();

        Ok(
            Self::from_hf(inner, eos_ids, bos_id, add_bos).with_pad_and_unk(
                meta_u32(content, "tokenizer.ggml.padding_token_id")?,
                meta_u32(content, "tokenizer.ggml.unknown_token_id")?,
            ),
        )
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
            pad_id: None,
            unk_id: None,
            max_piece_bytes,
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
    /// special token, and prepending BOS only when `add_bos` is set.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(anyhow::Error::msg)?;
        let bos = self.bos_id.filter(|_| self.add_bos);
        Ok(bos
            .into_iter()
            .chain(enc.get_ids().iter().copied())
            .collect())
    }

    /// Decodes `ids` to text, rendering special tokens' text too (llama.cpp's
    /// `special = true`, HF's `skip_special_tokens = false`): nothing the model
    /// produced is hidden. Callers stop before EOG ids, so those never show up
    /// in generated text. Incomplete UTF-8 at the end becomes U+FFFD; streaming
    /// goes through [`crate::detokenizer::IncrementalDecoder`] instead.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(anyhow::Error::msg)
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

fn meta_str<'a>(content: &'a Content, key: &str) -> Result<&'a str> {
    let v = content
        .metadata
        .get(key)
        .with_context(|| format!("GGUF metadata has no {key}"))?;
    Ok(v.to_string().with_context(|| key.to_string())?.as_str())
}

fn meta_array<'a>(content: &'a Content, key: &str) -> Result<&'a Vec<Value>> {
    let v = content
        .metadata
        .get(key)
        .with_context(|| format!("GGUF metadata has no {key}"))?;
    v.to_vec().with_context(|| key.to_string())
}

/// A token id, whichever integer type the converter stored it as.
fn meta_u32(content: &Content, key: &str) -> Result<Option<u32>> {
    let Some(v) = content.metadata.get(key) else {
        return Ok(None);
    };
    let id: i64 = match v {
        Value::U8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::I64(x) => *x,
        Value::U64(x) => i64::try_from(*x).unwrap_or(-1),
        other => bail!("{key} is not an integer: {other:?}"),
    };
    // Negative ids mean "none" in llama.cpp's converters.
    Ok(u32::try_from(id).ok())
}

/// The default model's tokenizer, for unit tests here and in sibling modules.
#[cfg(test)]
pub(crate) fn test_tokenizer() -> Tokenizer {
    let path = crate::model_fetch::default_model_path().expect("default model");
    let mut f = std::fs::File::open(path).unwrap();
    let content = Content::read(&mut f).expect("read gguf");
    Tokenizer::from_gguf(&content).expect("tokenizer")
}

#[cfg(test)]
mod tests {
    use super::*;

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
