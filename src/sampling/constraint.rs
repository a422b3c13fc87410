//! Constrained decoding with llguidance: a grammar (JSON, a JSON schema, or
//! Lark) turns into a per-sequence matcher that says, before each sample,
//! which tokens may come next.
//!
//! The token trie llguidance walks is built once per model from wick's own
//! tokenizer: every id's bytes, with special tokens marked as toktrie
//! expects (a 0xFF byte before their text), so grammars never produce them
//! by accident. Compiling a grammar can take a while for a large schema, so
//! the server does it on a blocking thread before the request reaches the
//! scheduler.
//!
//! A grammar comes from a client, so its size is bounded before llguidance
//! sees it ([`LIMITS`]), its compiler runs on a thread with a stack of its
//! own (it recurses through `$ref` chains), and its errors carry no parser
//! internals.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use tokenizers::DecoderWrapper;
use toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie};

use super::schema_rules::close_schema;
use crate::text::tokenizer::Tokenizer;

/// What a client's grammar may hold; past these it is refused before it
/// is compiled, the limit named.
pub struct GrammarLimits {
    /// Nesting of a JSON schema's objects and arrays, or of a Lark
    /// grammar's brackets.
    pub max_depth: usize,
    /// `$ref`s in a JSON schema: each resolves through the compiler's
    /// stack, and a chain of them nests as deep as it is long.
    pub max_refs: usize,
    /// Bytes of the schema (as JSON) or of the Lark text.
    pub max_bytes: usize,
}

/// A schema OpenAI's structured outputs accept (5 levels of nesting, 5,000
/// properties) stays well inside these.
pub const LIMITS: GrammarLimits = GrammarLimits {
    max_depth: 64,
    max_refs: 256,
    max_bytes: 256 << 10,
};

/// The compiler's stack: a 300-deep `$ref` chain overflowed a 2 MiB one.
const COMPILE_STACK_BYTES: usize = 64 << 20;

/// Characters of an llguidance error kept: the start says what failed.
const MAX_ERROR_CHARS: usize = 200;

/// What a sequence's output must follow.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A value valid against this JSON schema, read under wick's rules
    /// for what it leaves open ([`close_schema`]).
    JsonSchema(Value),
    /// A Lark grammar, in llguidance's dialect.
    Lark(String),
    /// Either a JSON value valid against this schema (read as for
    /// `JsonSchema`) or plain text that does not open like one: a tool
    /// call list, or an answer, for models whose template has no tool
    /// format of its own.
    JsonOrText(Value),
    /// Either a JSON value valid against the first schema (a call list,
    /// as for `JsonOrText`) or one valid against the second (the answer a
    /// `response_format` asks for), both read as for `JsonSchema`.
    CallsOrJson(Value, Value),
    /// A reply in gpt-oss's harmony format: an analysis message if the
    /// model wants one, then the JSON the request asks for, in the message
    /// it belongs in ([`crate::text::harmony`]).
    Harmony(HarmonyReply),
}

/// What a constrained harmony reply may end in: a final message of JSON,
/// a call, or either.
#[derive(Debug, Clone, PartialEq)]
pub struct HarmonyReply {
    /// The final message's schema (read as for [`Grammar::JsonSchema`]): a
    /// `response_format`. None: the reply must be a call.
    pub answer: Option<Value>,
    /// Functions the reply may call instead, one call, its arguments valid
    /// against the function's parameter schema.
    pub calls: Vec<(String, Value)>,
}

impl Grammar {
    /// Refuses a grammar past [`LIMITS`]. Walks the schema with a stack of
    /// its own, so no depth of JSON can overflow this thread's.
    pub fn check_limits(&self) -> Result<()> {
        let l = &LIMITS;
        match self {
            Grammar::JsonObject => Ok(()),
            Grammar::CallsOrJson(calls, answer) => {
                Grammar::JsonSchema(Value::Array(vec![calls.clone(), answer.clone()]))
                    .check_limits()
            }
            // All schemas at once, as the call list of a required
            // `tool_choice` elsewhere.
            Grammar::Harmony(reply) => {
                let schemas = reply
                    .answer
                    .iter()
                    .chain(reply.calls.iter().map(|(_, s)| s));
                Grammar::JsonSchema(Value::Array(schemas.cloned().collect())).check_limits()
            }
            Grammar::JsonSchema(schema) | Grammar::JsonOrText(schema) => {
                let bytes = serde_json::to_vec(schema)?.len();
                if bytes > l.max_bytes {
                    bail!("the schema is {bytes} bytes; the limit is {}", l.max_bytes);
                }
                let (mut refs, mut stack) = (0, vec![(schema, 1)]);
                while let Some((v, depth)) = stack.pop() {
                    if depth > l.max_depth {
                        bail!("the schema nests deeper than {} levels", l.max_depth);
                    }
                    match v {
                        Value::Object(o) => {
                            refs += o.contains_key("$ref") as usize;
                            stack.extend(o.values().map(|v| (v, depth + 1)));
                        }
                        Value::Array(a) => stack.extend(a.iter().map(|v| (v, depth + 1))),
                        _ => {}
                    }
                }
                if refs > l.max_refs {
                    bail!("the schema has {refs} $refs; the limit is {}", l.max_refs);
                }
                Ok(())
            }
            Grammar::Lark(text) => {
                if text.len() > l.max_bytes {
                    bail!(
                        "the grammar is {} bytes; the limit is {}",
                        text.len(),
                        l.max_bytes
                    );
                }
                let mut depth = 0usize;
                for c in text.chars() {
                    match c {
                        '(' | '[' | '{' => depth += 1,
                        ')' | ']' | '}' => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                    if depth > l.max_depth {
                        bail!("the grammar nests deeper than {} brackets", l.max_depth);
                    }
                }
                Ok(())
            }
        }
    }

    /// The schema of a `response_format`'s grammar (`JsonObject` or
    /// `JsonSchema`), to join with calls; None for any other.
    pub fn answer_schema(&self) -> Option<Value> {
        match self {
            // Said open, stays open ([`close_schema`]).
            Grammar::JsonObject => Some(serde_json::json!({"type": "object",
                                                            "additionalProperties": true})),
            Grammar::JsonSchema(schema) => Some(schema.clone()),
            _ => None,
        }
    }

    fn top_level(&self, harmony_tokens: bool) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(guided(serde_json::json!({"type": "object"})))
            }
            Grammar::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(guided(close_schema(schema)))
            }
            Grammar::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            // The text branch may not open with what opens the JSON (or
            // with whitespace before it), so the first character decides.
            Grammar::JsonOrText(schema) => TopLevelGrammar::from_lark(format!(
                "start: json | text\njson: %json {}\ntext: /[^\\[{{\\s](.|\\n)*/\n",
                guided(close_schema(schema))
            )),
            Grammar::CallsOrJson(calls, answer) => TopLevelGrammar::from_lark(format!(
                "start: calls | answer\ncalls: %json {}\nanswer: %json {}\n",
                guided(close_schema(calls)),
                guided(close_schema(answer))
            )),
            Grammar::Harmony(reply) => {
                TopLevelGrammar::from_lark(harmony_lark(reply, harmony_tokens))
            }
        }
    }
}

/// JSON as Python's json.dumps writes it, not whatever whitespace the
/// model drifts into (a schema's own x-guidance wins).
fn guided(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert(serde_json::json!({
            "whitespace_flexible": false,
            "item_separator": ", ",
            "key_separator": ": ",
        }));
    }
    schema
}

/// harmony's markers, each a special token in gpt-oss's vocabulary.
const HARMONY_MARKERS: [&str; 7] = [
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
];

/// A harmony reply as Lark over its markers: special tokens where the
/// vocabulary has them (`tokens`), else their text, as a model without
/// them would write it and the harmony parser reads it. The prompt ends at
/// `<|start|>assistant`; with marker tokens an analysis message may come
/// first, its text free (text never matches a special token, so `<|end|>`
/// ends it; as text it could not, and there is none). A call is written in
/// either of the header orders gpt-oss uses (its chat template's, or
/// `<|channel|>commentary to=...`), with or without its content type.
fn harmony_lark(reply: &HarmonyReply, tokens: bool) -> String {
    let json = |schema: &Value| guided(close_schema(schema));
    let answer = reply.answer.iter().map(|schema| {
        format!(
            "<|channel|> \"final\" <|message|> %json {} <|return|>",
            json(schema)
        )
    });
    // Function names are letters, digits, `_` and `-` (checked with the
    // tools), nothing a Lark string must escape.
    let calls = reply.calls.iter().map(|(name, schema)| {
        format!(
            "(\" to=functions.{name}\" <|channel|> \"commentary\" \
             | <|channel|> \"commentary to=functions.{name}\") \
             content_type <|message|> %json {} <|call|>",
            json(schema)
        )
    });
    let reply = answer.chain(calls).collect::<Vec<_>>().join("\n    | ");
    let rules = "content_type: (\" \" <|constrain|>? \"json\")?\n";
    match tokens {
        true => format!(
            "start: analysis? ({reply})\n{rules}\
             analysis: <|channel|> \"analysis\" <|message|> TEXT <|end|> <|start|> \"assistant\"\n\
             TEXT: /(.|\\n)*/\n"
        ),
        false => HARMONY_MARKERS
            .iter()
            .fold(format!("start: {reply}\n{rules}"), |l, m| {
                l.replace(m, &format!("\"{m}\""))
            }),
    }
}

/// Compiles grammars against one model's vocabulary; shared by all
/// requests.
pub struct ConstraintFactory {
    factory: ParserFactory,
    /// harmony's markers are special tokens of the vocabulary.
    harmony_tokens: bool,
}

impl ConstraintFactory {
    pub fn new(tok: &Tokenizer) -> Result<Self> {
        let eos = *tok
            .eos_ids()
            .first()
            .context("the tokenizer has no EOS token")?;
        let words = token_bytes(tok)?;
        let harmony_tokens = HARMONY_MARKERS.iter().all(|m| {
            let special = [&[TokTrie::SPECIAL_TOKEN_MARKER][..], m.as_bytes()].concat();
            words.contains(&special)
        });
        let info = TokRxInfo {
            tok_bos: tok.bos_id(),
            tok_pad: tok.pad_id(),
            tok_unk: tok.unk_id(),
            ..TokRxInfo::new(words.len() as u32, eos)
        };
        let env: toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env)?;
        // Grammar errors reach the client; nothing for stderr, and no
        // parser state or grammar dump in them.
        factory.quiet();
        factory.limits_mut().verbose_errors = false;
        Ok(ConstraintFactory {
            factory,
            harmony_tokens,
        })
    }

    /// A fresh matcher for one sequence; an invalid grammar is an error
    /// whose message names what is wrong. The first mask is computed here
    /// too, so a grammar that cannot even start fails now, not mid-stream.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint> {
        grammar.check_limits()?;
        let compiled = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("grammar-compile".into())
                .stack_size(COMPILE_STACK_BYTES)
                .spawn_scoped(scope, || -> Result<Matcher> {
                    let parser = self
                        .factory
                        .create_parser(grammar.top_level(self.harmony_tokens))?;
                    let mut matcher = Matcher::new(Ok(parser));
                    matcher.compute_mask_or_eos()?;
                    match matcher.get_error() {
                        Some(e) => bail!("{e}"),
                        None => Ok(matcher),
                    }
                })?
                .join()
                .map_err(|_| anyhow::anyhow!("the grammar compiler failed on this grammar"))
        });
        let matcher = compiled?.map_err(terse)?;
        Ok(Constraint {
            grammar: grammar.clone(),
            matcher,
            cost: Duration::ZERO,
        })
    }
}

/// An llguidance error as a client may see it: on one line, without any
/// parser state or markup, bounded, and the failures a client's grammar can
/// cause said in words it can act on ([`PLAIN_WORDS`]).
pub fn terse(e: anyhow::Error) -> anyhow::Error {
    let text = e.to_string();
    let text = text.split("<state>").next().unwrap_or_default();
    let line = text
        .split_whitespace()
        .filter(|w| *w != "<non-verbose/>")
        .collect::<Vec<_>>()
        .join(" ");
    let line = match PLAIN_WORDS.iter().find(|(marker, _)| line.contains(marker)) {
        Some((_, words)) => words.to_string(),
        None => line,
    };
    match line.char_indices().nth(MAX_ERROR_CHARS) {
        Some((at, _)) => anyhow::anyhow!("{}…", &line[..at]),
        None => anyhow::anyhow!("{line}"),
    }
}

/// llguidance's words for what a grammar did wrong (matched in order), and
/// what a client is told instead.
const PLAIN_WORDS: &[(&str, &str)] = &[
    (
        "too many expressions constructed",
        "the pattern is too complex: matching it needs more regular expressions than the \
         limit (nested repetitions such as (.{1,100}){1,100} do this); simplify it",
    ),
    (
        "too many states",
        "the pattern is too complex: matching it needs more lexer states than the limit; \
         simplify it",
    ),
    (
        "Unable to determine if regex is empty",
        "the pattern is too complex: whether any string matches it could not be decided within \
         the limit; simplify it",
    ),
    (
        "Regex is empty",
        "no string can satisfy the schema: a string's pattern, format and length bounds \
         contradict each other",
    ),
    (
        "NoExtension",
        "no output can satisfy the grammar: it admits no first token (a schema that refers \
         to itself without end does this)",
    ),
];

/// One sequence's position in its grammar.
#[derive(Clone)]
pub struct Constraint {
    grammar: Grammar,
    matcher: Matcher,
    /// What its masks have recently taken to compute, averaged.
    cost: Duration,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint({:?})", self.grammar)
    }
}

/// Two constraints are alike when they follow the same grammar.
impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        self.grammar == other.grammar
    }
}

impl Constraint {
    /// The tokens allowed next; once the grammar is complete, EOS alone.
    pub fn mask(&mut self) -> Result<TokenMask> {
        let start = Instant::now();
        let mask = self.matcher.compute_mask_or_eos().map_err(terse)?;
        self.cost = (self.cost + start.elapsed()) / 2;
        Ok(TokenMask(mask))
    }

    /// What the next mask is expected to take: the recent ones, averaged.
    pub fn cost(&self) -> Duration {
        self.cost
    }

    /// Advances past a sampled token.
    pub fn commit(&mut self, token: u32) -> Result<()> {
        self.matcher.consume_token(token).map_err(terse)
    }

    /// The grammar is complete: nothing but EOS may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// Which tokens a constrained row may sample.
#[derive(Debug, Clone)]
pub struct TokenMask(SimpleVob);

impl TokenMask {
    /// The allowed ids of a row of `vocab` logits as bits, bit `i % 32` of
    /// word `i / 32` (ids past the mask: disallowed), for the device
    /// sampler.
    pub fn allowed_bits(&self, vocab: usize) -> Vec<u32> {
        let mut words = vec![0u32; vocab.div_ceil(32)];
        let known = self.0.len().min(vocab);
        for (w, &bits) in words.iter_mut().zip(self.0.as_slice()) {
            *w = bits;
        }
        for id in known..words.len() * 32 {
            words[id / 32] &= !(1 << (id % 32));
        }
        words
    }

    /// Sets every disallowed logit to -inf (ids past the vocabulary too:
    /// a model's head may be padded).
    pub fn apply(&self, logits: &mut [f32]) {
        for (id, l) in logits.iter_mut().enumerate() {
            if id >= self.0.len() || !self.0.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// Every id's bytes as generated text, special tokens marked.
fn token_bytes(tok: &Tokenizer) -> Result<Vec<Vec<u8>>> {
    let inner = tok.inner();
    let byte_level = matches!(inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
    let unicode_to_byte: HashMap<char, u8> = gpt2_byte_chars()
        .into_iter()
        .enumerate()
        .map(|(b, c)| (c, b as u8))
        .collect();
    let added = inner.get_added_tokens_decoder();
    let mut words = vec![Vec::new(); tok.vocab_size()];
    for (id, word) in words.iter_mut().enumerate() {
        let id = id as u32;
        if let Some(t) = added.get(&id) {
            *word = if t.special {
                [&[TokTrie::SPECIAL_TOKEN_MARKER][..], t.content.as_bytes()].concat()
            } else {
                t.content.as_bytes().to_vec()
            };
            continue;
        }
        let Some(piece) = inner.id_to_token(id) else {
            continue;
        };
        *word = if byte_level {
            piece
                .chars()
                .map(|c| unicode_to_byte.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .with_context(|| format!("token {id} ({piece:?}) is not byte-level text"))?
        } else if let Some(b) = sentencepiece_byte(&piece) {
            vec![b]
        } else {
            piece.replace('\u{2581}', " ").into_bytes()
        };
    }
    Ok(words)
}

/// `<0xAB>`: SentencePiece's byte-fallback pieces.
fn sentencepiece_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2)
        .then(|| u8::from_str_radix(hex, 16).ok())
        .flatten()
}

/// GPT-2's byte-to-character table: printable bytes stand for themselves,
/// the rest for characters from U+0100 on, in byte order.
fn gpt2_byte_chars() -> Vec<char> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut next = 0x100;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap_or('?')
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenizer::vocab_fixture;
    use serde_json::json;

    /// A SentencePiece vocabulary's tokens carry their `▁` as a space and
    /// byte-fallback tokens their byte, so a grammar sees the text the model
    /// writes.
    #[test]
    fn sentencepiece_tokens_are_their_text() {
        let tok = Tokenizer::from_gguf(&vocab_fixture("llama-spm")).unwrap();
        let factory = ConstraintFactory::new(&tok).unwrap();
        let mut c = factory
            .compile(&Grammar::Lark("start: \"Hi there\"".into()))
            .unwrap();
        let allowed = |c: &mut Constraint, id: u32| c.mask().unwrap().0.is_allowed(id);
        // `Hi` (18567) and the byte <0x48> `H` (75) fit; `▁Hi` (6324) does not.
        assert!(allowed(&mut c, 18567) && allowed(&mut c, 75));
        assert!(!allowed(&mut c, 6324));
        c.commit(18567).unwrap();
        // `▁there` (727).
        assert!(allowed(&mut c, 727));
        c.commit(727).unwrap();
        assert!(c.is_finished() || allowed(&mut c, 2));
    }

    /// A client's grammar that cannot work is told so in words, without
    /// llguidance's markup or its internal expression dumps.
    #[test]
    fn grammar_failures_read_as_sentences() {
        let tok = Tokenizer::from_gguf(&vocab_fixture("llama-spm")).unwrap();
        let factory = ConstraintFactory::new(&tok).unwrap();
        let refused = |schema: Value| {
            factory
                .compile(&Grammar::JsonSchema(schema))
                .expect_err("refused")
                .to_string()
        };
        let self_ref = refused(json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}));
        assert!(self_ref.starts_with("no output can satisfy"), "{self_ref}");
        let empty = refused(json!({"type": "string", "pattern": "^a$", "minLength": 5}));
        assert!(empty.starts_with("no string can satisfy"), "{empty}");
        // Nested repetition outgrows the lexer's limit while it is matched,
        // at the latest a few hundred characters in.
        let nested =
            Grammar::JsonSchema(json!({"type": "string", "pattern": "^(.{1,100}){1,100}$"}));
        let byte = |b: u8| tok.token_to_id(&format!("<0x{b:02X}>")).unwrap();
        let complex = match factory.compile(&nested) {
            Err(e) => e,
            Ok(mut c) => (0..2000)
                .map(|i| byte(if i == 0 { b'"' } else { b'a' }))
                .find_map(|t| c.mask().err().or_else(|| c.commit(t).err()))
                .expect("the nested repetition was matched to the end"),
        }
        .to_string();
        assert!(
            complex.starts_with("the pattern is too complex"),
            "{complex}"
        );
        for e in [&self_ref, &empty, &complex] {
            assert!(!e.contains('<') && !e.contains("(And"), "{e}");
        }
    }

    /// Whether `text`, fed byte by byte, is a complete value of `schema`.
    fn accepts(schema: Value, text: &str) -> bool {
        accepts_grammar(&Grammar::JsonSchema(schema), text)
    }

    /// Whether `text`, fed byte by byte, is a complete output of `grammar`.
    fn accepts_grammar(grammar: &Grammar, text: &str) -> bool {
        static SPM: std::sync::OnceLock<(Tokenizer, ConstraintFactory)> =
            std::sync::OnceLock::new();
        let (tok, factory) = SPM.get_or_init(|| {
            let tok = Tokenizer::from_gguf(&vocab_fixture("llama-spm")).unwrap();
            let factory = ConstraintFactory::new(&tok).unwrap();
            (tok, factory)
        });
        let mut c = factory.compile(grammar).unwrap();
        let bytes: Vec<u32> = text
            .bytes()
            .map(|b| tok.token_to_id(&format!("<0x{b:02X}>")).unwrap())
            .collect();
        c.matcher.consume_tokens(&bytes).is_ok() && c.matcher.is_accepting().unwrap()
    }

    /// A pydantic-style schema, compiled: no invented keys, no endless
    /// digits; what it lists still fits.
    #[test]
    fn open_schemas_compile_closed() {
        let city = json!({"type": "object", "required": ["name", "population"],
            "properties": {"name": {"type": "string"}, "population": {"type": "integer"},
                           "area": {"type": "number"}}});
        assert!(accepts(
            city.clone(),
            r#"{"name": "Oslo", "population": 709037}"#
        ));
        assert!(accepts(
            city.clone(),
            r#"{"name": "Oslo", "population": -9007199254740991, "area": 454.03}"#
        ));
        assert!(accepts(
            city.clone(),
            r#"{"name": "O", "population": 1, "area": 0.1234567890}"#
        ));
        for refused in [
            r#"{"name": "Oslo", "population": 709037, "population_growth_rate": 1}"#,
            r#"{"name": "Oslo", "population": 9007199254740992}"#,
            r#"{"name": "Oslo", "population": 12345678901234567}"#,
            r#"{"name": "Oslo", "population": 1, "area": 12345678901234567.5}"#,
            r#"{"name": "Oslo", "population": 1, "area": 0.12345678901}"#,
            r#"{"name": "Oslo", "population": 1, "area": 0.10000000000}"#,
            r#"{"name": "Oslo", "population": 1, "area": 1e400}"#,
        ] {
            assert!(!accepts(city.clone(), refused), "{refused}");
        }
        // Said open, stays open.
        let open = json!({"type": "object", "properties": {"a": {"type": "integer"}},
                          "additionalProperties": true});
        assert!(accepts(open, r#"{"a": 1, "b": [true]}"#));
    }

    /// gpt-oss's harmony around the JSON asked for: an analysis message or
    /// none, then the final message or one call, in its marker tokens; the
    /// JSON valid, and nothing else.
    #[test]
    fn harmony_replies_keep_their_messages() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/gpt-oss-tiny/tokenizer.json"
        );
        let inner = tokenizers::Tokenizer::from_file(path).unwrap();
        let ret = inner.token_to_id("<|return|>").unwrap();
        let tok = Tokenizer::from_hf(inner, vec![ret], None, false);
        let factory = ConstraintFactory::new(&tok).unwrap();
        let accepts = |g: &Grammar, text: &str| {
            let mut c = factory.compile(g).unwrap();
            let ids = tok.inner().encode(text, false).unwrap().get_ids().to_vec();
            c.matcher.consume_tokens(&ids).is_ok() && c.matcher.is_accepting().unwrap()
        };
        let a =
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        let answer = Grammar::Harmony(HarmonyReply {
            answer: Some(a.clone()),
            calls: Vec::new(),
        });
        let analysis = "<|channel|>analysis<|message|>a is 1, so:\n{\"a\"<|end|><|start|>assistant";
        for ok in [
            "<|channel|>final<|message|>{\"a\": 1}<|return|>".to_string(),
            format!("{analysis}<|channel|>final<|message|>{{\"a\": 1}}<|return|>"),
        ] {
            assert!(accepts(&answer, &ok), "{ok}");
        }
        for refused in [
            "{\"a\": 1}",
            "<|channel|>final<|message|>{\"b\": 1}<|return|>",
            "<|channel|>final<|message|>{\"a\": 1}<|end|>",
            "<|channel|>commentary<|message|>{\"a\": 1}<|return|>",
            "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>",
        ] {
            assert!(!accepts(&answer, refused), "{refused}");
        }
        // A vocabulary without the markers (gpt-oss's template on another
        // model) writes them as text, and no analysis.
        assert!(accepts_grammar(
            &answer,
            "<|channel|>final<|message|>{\"a\": 1}<|return|>"
        ));
        assert!(!accepts_grammar(
            &answer,
            "<|channel|>final<|message|>{\"a\": 1}"
        ));
        let object = Grammar::Harmony(HarmonyReply {
            answer: Grammar::JsonObject.answer_schema(),
            calls: Vec::new(),
        });
        assert!(accepts(
            &object,
            "<|channel|>final<|message|>{\"any\": [1]}<|return|>"
        ));
        let city = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        let call = Grammar::Harmony(HarmonyReply {
            answer: None,
            calls: vec![
                ("get_weather".into(), city.clone()),
                ("add".into(), a.clone()),
            ],
        });
        // Either, as `auto` tools with a `response_format` ask.
        let either = Grammar::Harmony(HarmonyReply {
            answer: Some(a.clone()),
            calls: vec![("get_weather".into(), city)],
        });
        for ok in [
            "<|channel|>final<|message|>{\"a\": 1}<|return|>",
            "<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"Oslo\"}<|call|>",
        ] {
            assert!(accepts(&either, ok), "{ok}");
        }
        assert!(!accepts(
            &either,
            "<|channel|>final<|message|>{\"city\": \"Oslo\"}<|return|>"
        ));
        for ok in [
            " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}<|call|>".to_string(),
            format!("{analysis}<|channel|>commentary to=functions.add <|constrain|>json<|message|>{{\"a\": 2}}<|call|>"),
            "<|channel|>commentary to=functions.add<|message|>{\"a\": 2}<|call|>".to_string(),
        ] {
            assert!(accepts(&call, &ok), "{ok}");
        }
        for refused in [
            " to=functions.sub<|channel|>commentary json<|message|>{\"a\": 2}<|call|>",
            " to=functions.add<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}<|call|>",
            " to=functions.add<|channel|>commentary json<|message|>{\"a\": 2}<|return|>",
            "<|channel|>final<|message|>{\"a\": 2}<|return|>",
        ] {
            assert!(!accepts(&call, refused), "{refused}");
        }
    }

    /// The generic tool format: a call list valid against the schema, or
    /// text that does not open like one; nothing in between.
    #[test]
    fn json_or_text_takes_a_valid_value_or_plain_text() {
        let calls = json!({"type": "array", "minItems": 1, "items": {"type": "object",
            "properties": {"name": {"const": "add"},
                           "parameters": {"type": "object",
                               "properties": {"a": {"type": "integer"}}, "required": ["a"]}},
            "required": ["name", "parameters"]}});
        // With a `response_format`: the calls, or the answer it asks for.
        let answer = json!({"type": "object", "properties": {"sum": {"type": "integer"}},
                            "required": ["sum"]});
        let or_json = Grammar::CallsOrJson(calls.clone(), answer);
        assert!(accepts_grammar(
            &or_json,
            r#"[{"name": "add", "parameters": {"a": 2}}]"#
        ));
        assert!(accepts_grammar(&or_json, r#"{"sum": 5}"#));
        for refused in [
            "Five.",
            r#"{"a": 2}"#,
            r#"[{"name": "sub", "parameters": {"a": 2}}]"#,
        ] {
            assert!(!accepts_grammar(&or_json, refused), "{refused}");
        }
        let g = Grammar::JsonOrText(calls);
        assert!(accepts_grammar(
            &g,
            r#"[{"name": "add", "parameters": {"a": 2}}]"#
        ));
        assert!(accepts_grammar(&g, "Two plus three is five.\n[1] and {2}."));
        for refused in [
            r#"[{"name": "sub", "parameters": {"a": 2}}]"#,
            r#"[{"name": "add", "parameters": {"a": 2}, "extra": 1}]"#,
            r#"[{"name": "add", "parameters": {"a": 2}}] and more"#,
            "[not json",
            "{\"a\": 1}",
            " [{\"name\": \"add\"}]",
        ] {
            assert!(!accepts_grammar(&g, refused), "{refused}");
        }
    }
}
