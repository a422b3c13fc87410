//! A GGUF's vocabulary (`tokenizer.ggml.*`) completed the way llama.cpp's
//! `llama_vocab::load` completes it: token kinds adjusted by text, special
//! ids defaulted, the end-of-generation set found. The families
//! ([`super::bpe`], [`super::spm`]) build their tokenizers from this.

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::AddedToken;

/// Token texts llama.cpp (the build behind `tests/fixtures/llama-cpp`) treats as
/// end-of-generation wherever they occur in a vocabulary: its text-based EOG
/// list plus its FIM pad/repo/separator candidates, which it also adds. (It
/// keeps only the first FIM candidate found per kind and has a few
/// per-family exceptions for vocabularies wick does not load; not mirrored.
/// Gemma 4's, which `read` mirrors, is that `</s>` is no EOG there.)
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

/// FIM prefix/suffix/middle texts: llama.cpp makes them control tokens (so
/// their text is parsed as the token) without ending generation there.
const FIM_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<\u{ff5c}fim\u{2581}begin\u{ff5c}>",
    "<PRE>",
    "\u{2581}<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<\u{ff5c}fim\u{2581}hole\u{ff5c}>",
    "<SUF>",
    "\u{2581}<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<\u{ff5c}fim\u{2581}end\u{ff5c}>",
    "<MID>",
    "\u{2581}<MID>",
    "<|code_middle|>",
    "<|middle|>",
];

/// Special tokens Phi-3 vocabularies keep the whitespace after (llama.cpp
/// strips it after every other special token of a model named Phi-3).
const PHI3_KEEP_SPACE_AFTER: &[&str] = &["<unk>", "<s>", "<|endoftext|>"];

/// What a token is, from GGUF `tokenizer.ggml.token_type` (llama.cpp's
/// `llama_token_type`) after llama.cpp's by-text adjustments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    /// SentencePiece's byte fallback, `<0xAB>`.
    Byte,
    Undefined,
}

impl Kind {
    fn from_gguf(t: i32) -> Kind {
        match t {
            1 => Kind::Normal,
            2 => Kind::Unknown,
            3 => Kind::Control,
            4 => Kind::UserDefined,
            5 => Kind::Unused,
            6 => Kind::Byte,
            _ => Kind::Undefined,
        }
    }

    /// Matched in text before the model runs, and rendered as its text.
    pub(super) fn is_special(self) -> bool {
        matches!(self, Kind::Unknown | Kind::Control | Kind::UserDefined)
    }
}

pub(super) struct Vocab {
    /// `tokenizer.ggml.pre`, absent for older files.
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// SentencePiece scores; 0 when the file has none.
    pub scores: Vec<f32>,
    pub kinds: Vec<Kind>,
    /// Whether whitespace after the special token is dropped from the text.
    pub rstrip: Vec<bool>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// End-of-generation ids, EOS first.
    pub eog: Vec<u32>,
}

/// `tokenizer.ggml.model`, read before anything else so an unsupported
/// vocabulary is refused by name.
pub(super) fn model(content: &Content) -> Result<&str> {
    meta_str(content, "tokenizer.ggml.model")
}

impl Vocab {
    pub(super) fn read(content: &Content) -> Result<Vocab> {
        let pre = match content.metadata.get("tokenizer.ggml.pre") {
            Some(v) => Some(v.to_string().context("tokenizer.ggml.pre")?.clone()),
            None => None,
        };
        let tokens: Vec<String> = meta_array(content, "tokenizer.ggml.tokens")?
            .iter()
            .enumerate()
            .map(|(id, v)| {
                let t = v.to_string().context("tokenizer.ggml.tokens")?;
                // As llama.cpp does, so every id has a distinct, matchable text.
                Ok(match t.is_empty() {
                    true => format!("[EMPTY_{id}]"),
                    false => t.clone(),
                })
            })
            .collect::<Result<_>>()?;
        let n = tokens.len();
        let scores = match content.metadata.get("tokenizer.ggml.scores") {
            Some(v) => v
                .to_vec()?
                .iter()
                .map(|s| match s {
                    Value::F32(x) => Ok(*x),
                    Value::I32(x) => Ok(*x as f32),
                    other => bail!("tokenizer.ggml.scores holds {other:?}"),
                })
                .collect::<Result<Vec<f32>>>()?,
            None => vec![0.0; n],
        };
        let mut kinds = match content.metadata.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()?
                .iter()
                .map(|t| Ok(Kind::from_gguf(t.to_i32()?)))
                .collect::<candle_core::Result<Vec<Kind>>>()
                .context("tokenizer.ggml.token_type")?,
            None => vec![Kind::Normal; n],
        };
        if scores.len() < n || kinds.len() < n {
            bail!(
                "GGUF vocabulary has {n} tokens but {} scores and {} token types",
                scores.len(),
                kinds.len()
            );
        }
        kinds.truncate(n);

        // llama.cpp's defaults where the file names no id; SentencePiece
        // vocabularies fix them by convention. (For byte-level BPE llama.cpp
        // defaults to id 11, a Falcon-era leftover wick does not copy.)
        let spm = model(content)? == "llama";
        let id = |key: &str, default: Option<u32>| -> Result<Option<u32>> {
            let default = default.filter(|&id| (id as usize) < n);
            Ok(match meta_u32(content, key)? {
                Some(id) if (id as usize) < n => Some(id),
                // llama.cpp ignores an out-of-range id for the default.
                _ => default,
            })
        };
        let bos = id("tokenizer.ggml.bos_token_id", spm.then_some(1))?;
        let eos = id("tokenizer.ggml.eos_token_id", spm.then_some(2))?;
        let unk = id("tokenizer.ggml.unknown_token_id", spm.then_some(0))?;
        let pad = id("tokenizer.ggml.padding_token_id", None)?;
        let flag = |key: &str| -> Result<Option<bool>> {
            content
                .metadata
                .get(key)
                .map(|v| v.to_bool().with_context(|| key.to_string()))
                .transpose()
        };

        // llama.cpp forces tokens whose text looks like a control token to
        // control, whatever the file says.
        for (text, kind) in tokens.iter().zip(kinds.iter_mut()) {
            if EOG_TEXTS.contains(&text.as_str()) || FIM_TEXTS.contains(&text.as_str()) {
                *kind = Kind::Control;
            }
        }
        let mut eog: Vec<u32> = eos.into_iter().collect();
        eog.extend(
            (0..n as u32)
                .filter(|&id| Some(id) != eos && EOG_TEXTS.contains(&tokens[id as usize].as_str())),
        );
        // Gemma 4's `</s>` is ordinary text: llama.cpp tells such a
        // vocabulary by its `<|tool_response>` and makes `</s>` normal again.
        if tokens.iter().any(|t| t == "<|tool_response>") {
            for (id, text) in tokens.iter().enumerate() {
                if text == "</s>" {
                    kinds[id] = Kind::Normal;
                    eog.retain(|&e| e != id as u32);
                }
            }
        }

        harmony_markers(&tokens, &mut kinds, &mut eog);

        let name = match content.metadata.get("general.name") {
            Some(Value::String(s)) => s.to_lowercase(),
            _ => String::new(),
        };
        let phi3 = name.contains("phi-3") || name.contains("phi3");
        let rstrip = tokens
            .iter()
            .zip(&kinds)
            .map(|(text, kind)| {
                phi3 && kind.is_special() && !PHI3_KEEP_SPACE_AFTER.contains(&text.as_str())
            })
            .collect();

        Ok(Vocab {
            pre,
            tokens,
            scores,
            kinds,
            rstrip,
            bos,
            eos,
            unk,
            pad,
            add_bos: flag("tokenizer.ggml.add_bos_token")?,
            add_eos: flag("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?,
            eog,
        })
    }

    /// The special tokens as `tokenizers` added tokens, so the exported
    /// `tokenizer.json` and grammar tries know them.
    pub(super) fn added_tokens(&self) -> Vec<AddedToken> {
        self.tokens
            .iter()
            .zip(&self.kinds)
            .zip(&self.rstrip)
            .filter(|((_, kind), _)| kind.is_special())
            .map(|((text, kind), &rstrip)| {
                AddedToken::from(text.clone(), *kind != Kind::UserDefined)
                    .normalized(false)
                    .rstrip(rstrip)
            })
            .collect()
    }

    /// The special tokens as wick's encoder matches them.
    pub(super) fn specials(&self) -> Specials {
        let mut tokens: Vec<(String, u32, bool)> = (0..self.tokens.len())
            .filter(|&id| self.kinds[id].is_special())
            .map(|id| (self.tokens[id].clone(), id as u32, self.rstrip[id]))
            .collect();
        // Longest first, as llama.cpp tries them.
        tokens.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Specials(tokens)
    }

    /// The byte a `<0xAB>` token stands for.
    pub(super) fn byte_of(text: &str) -> Option<u8> {
        let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
        (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
    }

    /// llama.cpp's `token_to_piece` with `special = true`, given how the
    /// family spells a normal token's text.
    pub(super) fn pieces(&self, normal: impl Fn(&str) -> Vec<u8>) -> Vec<Vec<u8>> {
        self.tokens
            .iter()
            .zip(&self.kinds)
            .map(|(text, kind)| match kind {
                Kind::Normal => normal(text),
                k if k.is_special() => text.as_bytes().to_vec(),
                Kind::Byte => Self::byte_of(text).into_iter().collect(),
                // llama.cpp renders unused and undefined tokens as nothing.
                _ => Vec::new(),
            })
            .collect()
    }
}

/// gpt-oss's harmony vocabulary (and Solar Open's kin): a message ends at
/// `<|end|>`, but the reply goes on with the next message, so, as llama.cpp
/// does, `<|end|>` is no end of generation where `<|return|>` and `<|call|>`
/// (or `<|calls|>` and `<|flush|>`) end replies. The markers a reply is read
/// by become user-defined, as llama.cpp makes them so its output shows
/// them (wick renders every special token's text anyway).
fn harmony_markers(tokens: &[String], kinds: &mut [Kind], eog: &mut Vec<u32>) {
    let ends = |text: &str| eog.iter().any(|&id| tokens[id as usize] == text);
    let harmony = ends("<|end|>")
        && (ends("<|call|>") || ends("<|calls|>"))
        && (ends("<|return|>") || ends("<|flush|>"));
    for (id, text) in tokens.iter().enumerate() {
        let marker = ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];
        if marker.contains(&text.as_str()) || (harmony && text == "<|end|>") {
            kinds[id] = Kind::UserDefined;
        }
    }
    if harmony {
        eog.retain(|&id| tokens[id as usize] != "<|end|>");
    }
}

/// Special tokens (text, id, whether whitespace after it is dropped),
/// longest first.
#[derive(Clone, Debug)]
pub(super) struct Specials(Vec<(String, u32, bool)>);

/// A stretch of text between special tokens, or one of them.
#[derive(Debug, PartialEq)]
pub(super) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

impl Specials {
    /// Splits `text` around special-token text the way llama.cpp's
    /// `tokenizer_st_partition` does (`tokenizers`' added-token matching
    /// differs in two details: it prefers the leftmost match over the
    /// longest token, and strips Unicode whitespace where llama.cpp strips
    /// only ASCII `isspace`): every occurrence of the longest token first,
    /// then the next longest in what is left, and so on.
    pub(super) fn partition<'a>(&self, text: &'a str) -> Vec<Fragment<'a>> {
        let mut fragments = Vec::new();
        if !text.is_empty() {
            fragments.push(Fragment::Text(text));
        }
        for (special, id, rstrip) in &self.0 {
            if !fragments
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(special.as_str())))
            {
                continue;
            }
            let mut split = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(mut rest) = fragment else {
                    split.push(fragment);
                    continue;
                };
                while let Some(at) = rest.find(special.as_str()) {
                    if at > 0 {
                        split.push(Fragment::Text(&rest[..at]));
                    }
                    split.push(Fragment::Token(*id));
                    rest = &rest[at + special.len()..];
                    if *rstrip {
                        rest = rest.trim_start_matches(|c| {
                            matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r')
                        });
                    }
                }
                if !rest.is_empty() {
                    split.push(Fragment::Text(rest));
                }
            }
            fragments = split;
        }
        fragments
    }
}

pub(super) fn meta_str<'a>(content: &'a Content, key: &str) -> Result<&'a str> {
    let v = content
        .metadata
        .get(key)
        .with_context(|| format!("GGUF metadata has no {key}"))?;
    Ok(v.to_string().with_context(|| key.to_string())?.as_str())
}

pub(super) fn meta_array<'a>(content: &'a Content, key: &str) -> Result<&'a Vec<Value>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenizer::vocab_fixture;

    /// llama.cpp tries the longest special token first, wherever it is;
    /// leftmost-first matching would take `ab` out of `abcd` instead.
    #[test]
    fn partition_tries_longest_first() {
        let specials = Specials(vec![("bcd".into(), 1, false), ("ab".into(), 2, false)]);
        assert_eq!(
            specials.partition("abcd ab"),
            [
                Fragment::Text("a"),
                Fragment::Token(1),
                Fragment::Text(" "),
                Fragment::Token(2)
            ]
        );
        assert_eq!(specials.partition(""), []);
    }

    /// Stripping after a token takes C `isspace` characters only.
    #[test]
    fn partition_strips_ascii_whitespace() {
        let specials = Specials(vec![("<t>".into(), 7, true)]);
        assert_eq!(
            specials.partition("<t> \t\n\x0b\x0c\rx<t>\u{a0}y<t>  "),
            [
                Fragment::Token(7),
                Fragment::Text("x"),
                Fragment::Token(7),
                Fragment::Text("\u{a0}y"),
                Fragment::Token(7)
            ]
        );
    }

    #[test]
    fn kinds_follow_llama_cpp() {
        let qwen2 = Vocab::read(&vocab_fixture("qwen2")).unwrap();
        // A normal token in the file, control by its text.
        assert_eq!(qwen2.tokens[128247], "</s>");
        assert_eq!(qwen2.kinds[128247], Kind::Control);
        // `[PAD151646]` and the like are user-defined: matched, not control.
        assert_eq!(qwen2.kinds[151646], Kind::UserDefined);
        assert!(qwen2.rstrip.iter().all(|r| !r));

        let phi3 = Vocab::read(&vocab_fixture("phi-3")).unwrap();
        let rstrip = |text: &str| phi3.rstrip[phi3.tokens.iter().position(|t| t == text).unwrap()];
        assert!(rstrip("<|user|>") && rstrip("</s>") && rstrip("[PAD32011]"));
        assert!(!rstrip("<s>") && !rstrip("<|endoftext|>") && !rstrip("<unk>"));
        assert_eq!(phi3.kinds[3], Kind::Byte);
    }

    /// With `<|tool_response>` in the vocabulary (Gemma 4), `</s>` is
    /// ordinary text, neither control nor EOG.
    #[test]
    fn tool_response_makes_end_of_sentence_text() {
        let mut content = vocab_fixture("qwen2");
        let Some(Value::Array(tokens)) = content.metadata.get_mut("tokenizer.ggml.tokens") else {
            panic!("tokens");
        };
        tokens[151646] = Value::String("<|tool_response>".into());
        let vocab = Vocab::read(&content).unwrap();
        assert_eq!(vocab.tokens[128247], "</s>");
        assert_eq!(vocab.kinds[128247], Kind::Normal);
        assert_eq!(vocab.eog, [151643, 151645, 151646]);
    }

    /// gpt-oss's markers: `<|end|>` goes on to the next message, so only
    /// `<|return|>` and `<|call|>` end the reply; all are shown as text.
    #[test]
    fn harmony_replies_end_at_return_and_call() {
        let mut content = vocab_fixture("qwen2");
        let Some(Value::Array(tokens)) = content.metadata.get_mut("tokenizer.ggml.tokens") else {
            panic!("tokens");
        };
        let markers = [
            "<|return|>",
            "<|call|>",
            "<|end|>",
            "<|channel|>",
            "<|message|>",
            "<|start|>",
            "<|constrain|>",
        ];
        for (k, text) in markers.iter().enumerate() {
            tokens[151646 + k] = Value::String(text.to_string());
        }
        let vocab = Vocab::read(&content).unwrap();
        assert_eq!(vocab.eog, [151643, 128247, 151645, 151646, 151647]);
        assert!((151648..151653).all(|id| vocab.kinds[id] == Kind::UserDefined));
        let pieces = vocab.pieces(|_| Vec::new());
        assert_eq!(pieces[151649], b"<|channel|>");

        // `<|end|>` without `<|call|>` still ends generation.
        let Some(Value::Array(tokens)) = content.metadata.get_mut("tokenizer.ggml.tokens") else {
            panic!("tokens");
        };
        tokens[151647] = Value::String("<|not_call|>".into());
        let vocab = Vocab::read(&content).unwrap();
        assert_eq!(vocab.eog, [151643, 128247, 151645, 151646, 151648]);
    }

    #[test]
    fn pieces_render_as_llama_cpp() {
        let spm = Vocab::read(&vocab_fixture("llama-spm")).unwrap();
        let pieces = spm.pieces(|t| t.replace('\u{2581}', " ").into_bytes());
        assert_eq!(pieces[15043], b" Hello");
        assert_eq!(pieces[1], b"<s>");
        assert_eq!(pieces[13], b"\n");
        assert_eq!(Vocab::byte_of("<0xE2>"), Some(0xE2));
        assert_eq!(Vocab::byte_of("<0xE2"), None);
    }
}
