//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): GPT-2, Llama 3, Qwen2,
//! Qwen3.5, SmolLM and their kin, told apart by `tokenizer.ggml.pre`.
//!
//! llama.cpp splits text into words with a regex per pre-type (hand-written
//! matchers for the common ones, which agree with the regexes), maps bytes
//! to GPT-2's printable characters and merges each word by the GGUF's merge
//! ranks. The same pipeline here is a `tokenizers` Split per regex, then
//! ByteLevel, then BPE.

use std::collections::HashMap;

use anyhow::{Context, Result};
use candle_core::quantized::gguf_file::Content;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use super::vocab::{meta_array, Vocab};
use super::Family;

/// Letters, numbers and marks Unicode 16 added. llama.cpp classifies
/// characters with its own Unicode 15 tables, where these are unassigned;
/// the regex engine knows Unicode 16, so the patterns take them out of
/// `\p{L}`, `\p{N}` and `\p{M}` (and put them among "other" characters) to
/// split as llama.cpp does.
const UNICODE16_LETTERS: &str = r"\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65}\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{11380}-\x{11389}\x{1138B}\x{1138E}\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{13460}-\x{143FA}\x{16100}-\x{1611D}\x{16D40}-\x{16D6C}\x{18CFF}\x{1E5D0}-\x{1E5ED}\x{1E5F0}";
const UNICODE16_NUMBERS: &str = r"\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{16130}-\x{16139}\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1E5F1}-\x{1E5FA}";
const UNICODE16_MARKS: &str = r"\x{897}\x{10D69}-\x{10D6D}\x{10EFC}\x{113B8}-\x{113C0}\x{113C2}\x{113C5}\x{113C7}-\x{113CA}\x{113CC}-\x{113D0}\x{113D2}\x{113E1}-\x{113E2}\x{11F5A}\x{1611E}-\x{1612F}\x{1E5EE}-\x{1E5EF}";

/// The word-splitting regexes of llama.cpp's `llm_tokenizer_bpe`, in the
/// order applied, spelled as llama.cpp spells them; [`pattern`] makes their
/// classes agree with llama.cpp's Unicode tables.
#[derive(Clone, Copy, Debug)]
enum Splits {
    /// `\p{N}` alone, then GPT-2's split: numbers go digit by digit.
    DigitsThenGpt2,
    Gpt2,
    /// Llama 3's split: letters may take one leading non-letter, numbers go
    /// in threes, newlines stay with the whitespace before them.
    Llama3,
    /// Llama 3's split with single digits.
    Qwen2,
    /// Qwen2's split with combining marks (`\p{M}`) kept in letter runs, so
    /// a decomposed `é` stays one word.
    Qwen35,
    /// Mistral's Tekken split: words also break where lower case turns to
    /// upper (`HelloWorld`), numbers go digit by digit.
    Tekken,
}

/// GPT-2's word split. llama.cpp lists it without the final `|\s+`, but its
/// hand-written GPT-2 matcher (which stands in for this exact pattern) falls
/// back to "all remaining whitespace" just like that alternative.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// As llama.cpp spells it: tokenizer.json's upper- and lower-case letter
/// classes as "a letter other than a-z" and "a letter other than A-Z".
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl Splits {
    fn patterns(self) -> &'static [&'static str] {
        match self {
            Splits::DigitsThenGpt2 => &[r"\p{N}", GPT2],
            Splits::Gpt2 => &[GPT2],
            Splits::Llama3 => &[LLAMA3],
            Splits::Qwen2 => &[QWEN2],
            Splits::Qwen35 => &[QWEN35],
            Splits::Tekken => &[TEKKEN],
        }
    }
}

/// `pattern` with its letter, number and mark classes narrowed to
/// llama.cpp's Unicode 15 tables (`onig` classes with the Unicode 16
/// additions taken out of `\p{L}`/`\p{N}`/`\p{M}` and put into their
/// complements). Whole bracket classes come first, so their `\p{..}` are
/// not rewritten on their own.
fn pattern(llama_cpp: &str) -> String {
    let new = format!("{UNICODE16_LETTERS}{UNICODE16_NUMBERS}");
    let classes = [
        (r"[^\s\p{L}\p{N}]", format!(r"[[^\s\p{{L}}\p{{N}}]{new}]")),
        (
            r"[^\s\p{L}\p{M}\p{N}]",
            format!(r"[[^\s\p{{L}}\p{{M}}\p{{N}}]{new}{UNICODE16_MARKS}]"),
        ),
        (
            r"[^\r\n\p{L}\p{N}]",
            format!(r"[[^\r\n\p{{L}}\p{{N}}]{new}]"),
        ),
        (
            r"[\p{L}\p{M}]",
            format!(r"[[\p{{L}}\p{{M}}]&&[^{UNICODE16_LETTERS}{UNICODE16_MARKS}]]"),
        ),
        (r"\p{L}", format!(r"[\p{{L}}&&[^{UNICODE16_LETTERS}]]")),
        (r"\p{N}", format!(r"[\p{{N}}&&[^{UNICODE16_NUMBERS}]]")),
    ];
    // Through placeholders, so no expansion is rewritten again.
    let mut out = llama_cpp.to_string();
    for (i, (from, _)) in classes.iter().enumerate() {
        out = out.replace(from, &format!("\u{0}{i}"));
    }
    for (i, (_, to)) in classes.iter().enumerate() {
        out = out.replace(&format!("\u{0}{i}"), to);
    }
    out
}

/// How a pre-type tokenizes: its splits, whether a word found whole in the
/// vocabulary skips merging (`ignore_merges`), and whether BOS is added when
/// the GGUF does not say.
struct PreType {
    names: &'static [&'static str],
    splits: Splits,
    ignore_merges: bool,
    add_bos: bool,
}

/// `tokenizer.ggml.pre` values by llama.cpp's handling. Only names whose
/// every llama.cpp setting is mirrored here are listed (not, say, those that
/// also add a separator token or strip around `<mask>`). llama.cpp's
/// `clean_spaces` only affects its `llama_detokenize`, not the text
/// llama-server returns, so it is not mirrored either.
const PRE_TYPES: &[PreType] = &[
    PreType {
        names: &[
            "smollm",
            "starcoder",
            "refact",
            "command-r",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        splits: Splits::DigitsThenGpt2,
        ignore_merges: false,
        add_bos: false,
    },
    PreType {
        names: &[
            "gpt-2",
            "phi-2",
            "gigachat",
            "a.x-4.0",
            "mellum",
            "exaone4",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
        ],
        splits: Splits::Gpt2,
        ignore_merges: false,
        add_bos: false,
    },
    PreType {
        names: &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        splits: Splits::Llama3,
        ignore_merges: true,
        add_bos: true,
    },
    PreType {
        names: &["dbrx", "smaug-bpe"],
        splits: Splits::Llama3,
        ignore_merges: false,
        add_bos: false,
    },
    PreType {
        names: &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
        ],
        splits: Splits::Qwen2,
        ignore_merges: false,
        add_bos: false,
    },
    PreType {
        names: &["tekken"],
        splits: Splits::Tekken,
        ignore_merges: true,
        add_bos: true,
    },
    PreType {
        names: &["qwen35"],
        splits: Splits::Qwen35,
        ignore_merges: false,
        add_bos: false,
    },
];

/// The supported pre-type named `pre`, or an error naming it.
fn pre_type(pre: Option<&str>) -> Result<&'static PreType> {
    let Some(pre) = pre else {
        anyhow::bail!("unsupported GGUF pre-tokenizer: tokenizer.ggml.pre is missing");
    };
    PRE_TYPES
        .iter()
        .find(|p| p.names.contains(&pre))
        .with_context(|| format!("unsupported GGUF pre-tokenizer {pre:?}"))
}

/// `tokenizer.ggml.merges`, best first: each a pair of vocabulary strings.
pub(super) fn merges(content: &Content) -> Result<Vec<(String, String)>> {
    meta_array(content, "tokenizer.ggml.merges")?
        .iter()
        .map(|v| {
            let m = v.to_string()?;
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .with_context(|| format!("malformed merge {m:?}"))
        })
        .collect()
}

pub(super) fn build(content: &Content, vocab: &Vocab) -> Result<Family> {
    let pre = pre_type(vocab.pre.as_deref())?;
    let merges = merges(content)?;

    // Later duplicates win, as in llama.cpp's token_to_id map.
    let ids = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), id as u32))
        .collect::<tokenizers::models::bpe::Vocab>();
    let bpe = BPE::builder()
        .vocab_and_merges(ids, merges)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(anyhow::Error::msg)
        .context("building BPE from GGUF vocabulary")?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    let mut steps = pre
        .splits
        .patterns()
        .iter()
        .map(|p| {
            Ok(Split::new(
                SplitPattern::Regex(pattern(p)),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(anyhow::Error::msg)?
            .into())
        })
        .collect::<Result<Vec<PreTokenizerWrapper>>>()?;
    // Splitting is done above; this only maps bytes to BPE symbols.
    steps.push(ByteLevel::new(false, false, false).into());
    inner.with_pre_tokenizer(Some(Sequence::new(steps)));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    inner.add_tokens(&vocab.added_tokens());

    Ok(Family {
        inner,
        pieces: {
            let alphabet = byte_alphabet();
            vocab.pieces(|text| unbyte(text, &alphabet))
        },
        add_bos: pre.add_bos,
        strip_leading_space: false,
    })
}

/// A byte-level token's bytes: each character stands for one byte
/// (`alphabet`). A character outside that alphabet is kept as its UTF-8.
fn unbyte(text: &str, alphabet: &HashMap<char, u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match alphabet.get(&c) {
            Some(&b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

/// GPT-2's byte-to-character table, inverted: printable bytes stand for
/// themselves, the other 68 are shifted to U+0100 onwards in byte order.
fn byte_alphabet() -> HashMap<char, u8> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut shifted = 0x100;
    (0u32..0x100)
        .filter_map(|b| {
            let c = match printable(b) {
                true => b,
                false => {
                    shifted += 1;
                    shifted - 1
                }
            };
            Some((char::from_u32(c)?, b as u8))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(splits: Splits, text: &str) -> Vec<String> {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        let mut s = PreTokenizedString::from(text);
        for p in splits.patterns() {
            Split::new(
                SplitPattern::Regex(pattern(p)),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .unwrap()
            .pre_tokenize(&mut s)
            .unwrap();
        }
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(w, _, _)| w.to_string())
            .collect()
    }

    #[test]
    fn llama3_splits() {
        assert_eq!(
            split(Splits::Llama3, "I'M 12345 (x)\n\n  hi"),
            ["I", "'M", " ", "123", "45", " (", "x", ")\n\n", " ", " hi"]
        );
        assert_eq!(split(Splits::Qwen2, "12 ab"), ["1", "2", " ab"]);
        assert_eq!(split(Splits::DigitsThenGpt2, "ab12"), ["ab", "1", "2"]);
    }

    /// Qwen3.5 keeps combining marks in letter runs, where Qwen2 splits a
    /// decomposed `é` after its `e`; Unicode 16's new marks are no marks to
    /// llama.cpp.
    #[test]
    fn qwen35_keeps_marks() {
        assert_eq!(
            split(Splits::Qwen35, "e\u{301}x 1"),
            ["e\u{301}x", " ", "1"]
        );
        assert_eq!(split(Splits::Qwen2, "e\u{301}x"), ["e", "\u{301}x"]);
        // U+0897 ARABIC PEPET (Unicode 16).
        assert_eq!(split(Splits::Qwen35, "a\u{897}"), ["a", "\u{897}"]);
        assert_eq!(split(Splits::Qwen35, "a\u{300}"), ["a\u{300}"]);
    }

    /// Unicode 16's new letters are not letters to llama.cpp, which splits
    /// them off as "other" characters.
    #[test]
    fn unicode16_letters_are_not_letters() {
        // U+1C89 CYRILLIC CAPITAL LETTER TJE (Unicode 16) after Latin letters.
        assert_eq!(split(Splits::Gpt2, "ab\u{1C89}"), ["ab", "\u{1C89}"]);
        assert_eq!(split(Splits::Gpt2, "ab\u{0416}"), ["ab\u{0416}"]);
        // U+16130 GURUNG KHEMA DIGIT ZERO is no digit to llama.cpp either.
        assert_eq!(split(Splits::Qwen2, "1\u{16130}"), ["1", "\u{16130}"]);
    }

    #[test]
    fn byte_alphabet_inverts() {
        let alphabet = byte_alphabet();
        assert_eq!(alphabet.len(), 256);
        assert_eq!(unbyte("\u{120}hi\u{10a}", &alphabet), b" hi\n");
        assert_eq!(alphabet.get(&'\u{100}'), Some(&0));
        assert_eq!(alphabet.get(&'\u{143}'), Some(&0xad));
        assert_eq!(alphabet.get(&' '), None);
        // Outside the alphabet: the character's own UTF-8.
        assert_eq!(unbyte("\u{2581}", &alphabet), "\u{2581}".as_bytes());
    }

    #[test]
    fn unknown_pre_type_is_named() {
        let e = pre_type(Some("chameleon")).err().unwrap().to_string();
        assert_eq!(e, "unsupported GGUF pre-tokenizer \"chameleon\"");
        assert!(pre_type(Some("qwen2")).is_ok());
    }
}
