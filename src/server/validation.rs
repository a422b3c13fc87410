//! Requests to engine inputs: JSON parsing with field-named errors, range
//! checks, prompt tokenization (chat through the model's template) and the
//! context-length check. Tokenizing is CPU work, so handlers run
//! [`validate_completion`] and [`validate_chat`] on the blocking pool; every
//! refusal is decided here, before a stream could start.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;

use crate::engine::{prompt, request_rules};
use crate::media::fetch::Fetched;
use crate::models::vision::ImageSpec;
use crate::sampling::constraint::{Constraint, ConstraintFactory, Grammar};
use crate::sampling::params::{SamplingParams, MAX_LOGPROBS};
use crate::server::chat_messages;
use crate::server::error::{clip, ApiError, MAX_ECHO_CHARS};
use crate::server::images::{self, ImageBudget};
use crate::server::legacy_functions;
use crate::server::protocol::{
    ChatCompletionRequest, CompletionRequest, FieldNames, Prediction, Prompt, ResponseFormat, Stop,
    StreamOptions, UnknownFields,
};
use crate::server::tools::{self, ToolMode, ToolPlan};
use crate::server::unsupported;
use crate::text::chat_template::ChatTemplate;
use crate::text::harmony;
use crate::text::reasoning::ReasoningParser;
use crate::text::tokenizer::Tokenizer;

/// Completions' `max_tokens` when absent, as OpenAI.
pub const DEFAULT_COMPLETION_MAX_TOKENS: usize = 16;

/// Largest `n` (OpenAI's limit): each choice is a sequence in the batch.
pub const MAX_N: u32 = 128;

/// What validation needs to know about the served model.
pub struct ModelContext<'a> {
    /// The served model name; a request naming neither it nor one of the
    /// aliases gets a 404.
    pub name: &'a str,
    pub aliases: &'a [String],
    pub vocab_size: usize,
    /// Prompt plus completion tokens must fit in this.
    pub max_context: usize,
    /// Most tokens the KV pool holds for one sequence; the engine refuses
    /// a request that could grow past it.
    pub max_seq_tokens: usize,
    /// Most sequences (prompts times `n`) in one request.
    pub max_choices: usize,
    pub tokenizer: &'a Tokenizer,
    pub chat_template: Option<&'a ChatTemplate>,
    pub constraints: Option<&'a ConstraintFactory>,
    /// How prompts hold an image, where the model takes images.
    pub images: Option<&'a ImageSpec>,
    pub image_budget: ImageBudget,
    /// The bytes of the request's image URLs that are not `data:` URLs,
    /// fetched before validation (`handlers::plan`).
    pub fetched: &'a Fetched,
}

/// A validated request, ready to submit: `n` sequences per prompt, each with
/// `params`.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationPlan {
    /// One per prompt (chat: exactly one).
    pub prompts: Vec<prompt::Prompt>,
    pub params: SamplingParams,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// vLLM's `continuous_usage_stats`: usage so far on every chunk.
    pub continuous_usage: bool,
    pub echo: bool,
    /// Top alternatives per token: completions' `logprobs`, or chat's
    /// `top_logprobs` (0 when absent) with `logprobs: true`. Equals
    /// `params.logprobs`.
    pub logprobs: Option<usize>,
    /// The text of each prompt when `echo` is set (token prompts decoded);
    /// empty otherwise.
    pub prompt_texts: Vec<String>,
    /// How tool calls are produced and read (chat only).
    pub tools: ToolPlan,
    /// Chat with a template that writes thinking blocks: whether the prompt
    /// leaves the model inside one. Its output is then split into
    /// reasoning and answer.
    pub reasoning: Option<bool>,
    /// Chat with a harmony template (gpt-oss): the reply is read as harmony
    /// messages (reasoning, answer and calls), constrained or not.
    pub harmony: bool,
}

/// Parses a request body. Invalid JSON is a 400 without `param`; a missing or
/// mistyped field is a 400 whose `param` is its path (`temperature`,
/// `messages[0].role`).
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // serde also builds structs from arrays, which would blame a field by
    // position (`[0]`); a request body is only ever an object.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        let message = match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
            Err(e) => format!("invalid JSON body: {e}"),
            Ok(_) => "the request body must be a JSON object".to_string(),
        };
        return Err(ApiError::bad_request(message, None));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(json_error)?;
    // Trailing garbage after the object, as `serde_json::from_slice` rejects it.
    de.end()
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}"), None))?;
    Ok(value)
}

fn json_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e
        .path()
        .iter()
        .any(|s| !matches!(s, Segment::Unknown))
        .then(|| e.path().to_string());
    let inner = e.into_inner();
    if inner.is_syntax() || inner.is_eof() {
        return ApiError::bad_request(format!("invalid JSON body: {inner}"), None);
    }
    let text = inner.to_string();
    // A missing field errors at its parent's path; serde words it
    // "missing field `name`", so the field's own path can be completed.
    let missing = text
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next());
    let param = match (&path, missing) {
        (Some(p), Some(field)) => Some(format!("{p}.{field}")),
        (None, Some(field)) => Some(field.to_string()),
        (p, None) => p.clone(),
    };
    let message = match &path {
        Some(p) => format!("invalid `{p}`: {text}"),
        None => text,
    };
    ApiError::bad_request(message, param.as_deref())
}

/// The fields completions and chat share.
struct Common<'r> {
    unknown: &'r UnknownFields,
    model: Option<&'r str>,
    n: Option<u32>,
    stream: Option<bool>,
    stream_options: Option<&'r StreamOptions>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    logit_bias: Option<&'r HashMap<String, f32>>,
    seed: Option<i64>,
    stop: Option<&'r Stop>,
    ignore_eos: Option<bool>,
    min_tokens: Option<u32>,
    stop_token_ids: Option<&'r Vec<u32>>,
    response_format: Option<&'r ResponseFormat>,
    cache_salt: Option<&'r str>,
    names: &'r FieldNames,
}

/// `n`, `stream` and `include_usage` once checked.
struct Shape {
    n: usize,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
}

/// Both request types carry the same sampling fields under the same names.
macro_rules! common_from {
    ($request:ty) => {
        impl<'r> From<&'r $request> for Common<'r> {
            fn from(r: &'r $request) -> Self {
                Common {
                    unknown: &r.unknown,
                    model: r.model.as_deref(),
                    n: r.n,
                    stream: r.stream,
                    stream_options: r.stream_options.as_ref(),
                    temperature: r.temperature,
                    top_p: r.top_p,
                    top_k: r.top_k,
                    min_p: r.min_p,
                    presence_penalty: r.presence_penalty,
                    frequency_penalty: r.frequency_penalty,
                    repetition_penalty: r.repetition_penalty,
                    logit_bias: r.logit_bias.as_ref(),
                    seed: r.seed,
                    stop: r.stop.as_ref(),
                    ignore_eos: r.ignore_eos,
                    min_tokens: r.min_tokens,
                    stop_token_ids: r.stop_token_ids.as_ref(),
                    response_format: r.response_format.as_ref(),
                    cache_salt: r.cache_salt.as_deref(),
                    // A translated chat request sets its client's.
                    names: &FieldNames::CHAT,
                }
            }
        }
    };
}

common_from!(CompletionRequest);
common_from!(ChatCompletionRequest);

impl Common<'_> {
    /// The checks that need no tokenizing, so a bad request is refused cheaply.
    fn check(&self, ctx: &ModelContext) -> Result<Shape, ApiError> {
        unsupported::refuse(self.unknown, "")?;
        if let Some(options) = self.stream_options {
            unsupported::refuse(&options.unknown, "stream_options")?;
        }
        check_model(self.model, ctx.name, ctx.aliases)?;
        if self.cache_salt == Some("") {
            return Err(ApiError::bad_request(
                "cache_salt must not be empty",
                Some("cache_salt"),
            ));
        }
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::bad_request(
                format!("n must be in [1, {MAX_N}], got {n}"),
                Some("n"),
            ));
        }
        if let Some(k) = self.top_k.filter(|&k| k < -1) {
            return Err(ApiError::bad_request(
                format!("top_k must be -1 or 0 (disabled) or positive, got {k}"),
                Some("top_k"),
            ));
        }
        let stream = self.stream.unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::bad_request(
                "stream_options is only allowed when stream is true",
                Some("stream_options"),
            ));
        }
        let include_usage = self
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let continuous_usage = self
            .stream_options
            .and_then(|o| o.continuous_usage_stats)
            .unwrap_or(false);
        Ok(Shape {
            n: n as usize,
            stream,
            include_usage,
            continuous_usage,
        })
    }

    /// The engine's prompts of these token lists, under the request's salt.
    fn prompts(&self, tokens: Vec<Vec<u32>>) -> Vec<prompt::Prompt> {
        let salt = self.cache_salt.map(str::to_string);
        tokens
            .into_iter()
            .map(|tokens| prompt::Prompt {
                tokens,
                media: Vec::new(),
                cache_salt: salt.clone(),
            })
            .collect()
    }

    /// The engine's parameters, checked by [`SamplingParams::validate`].
    fn params(
        &self,
        max_tokens: usize,
        logprobs: Option<usize>,
        ctx: &ModelContext,
    ) -> Result<SamplingParams, ApiError> {
        let defaults = SamplingParams::default();
        let mut logit_bias = Vec::new();
        for (key, &bias) in self.logit_bias.into_iter().flatten() {
            let id = key.trim().parse::<u32>().map_err(|_| {
                ApiError::bad_request(
                    format!("logit_bias keys must be token ids, got {key:?}"),
                    Some("logit_bias"),
                )
            })?;
            logit_bias.push((id, bias));
        }
        // JSON object order is lost in the map; sorted ids keep runs
        // reproducible. Keys that read as one id (`"5"`, `" 5"`, `"05"`)
        // would say two things of one token.
        logit_bias.sort_unstable_by_key(|&(id, _)| id);
        if let Some(w) = logit_bias.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(ApiError::bad_request(
                format!("logit_bias names token {} more than once", w[0].0),
                Some("logit_bias"),
            ));
        }
        let mut stop_token_ids = self.stop_token_ids.cloned().unwrap_or_default();
        stop_token_ids.sort_unstable();
        stop_token_ids.dedup();
        // OpenAI takes `top_p: 0` as greedy: the nucleus is the most
        // likely token alone, which is top-1.
        let top_1 = self.top_p == Some(0.0);
        let params = SamplingParams {
            max_tokens,
            min_tokens: self.min_tokens.map_or(defaults.min_tokens, |m| m as usize),
            temperature: self.temperature.unwrap_or(defaults.temperature),
            // -1 and 0 both mean off; a k past the vocabulary keeps everything.
            top_k: if top_1 {
                1
            } else {
                self.top_k
                    .filter(|&k| k > 0)
                    .map_or(0, |k| usize::try_from(k).unwrap_or(usize::MAX))
            },
            top_p: match self.top_p {
                Some(p) if !top_1 => p,
                _ => defaults.top_p,
            },
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self
                .repetition_penalty
                .unwrap_or(defaults.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(defaults.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(defaults.frequency_penalty),
            logit_bias: logit_bias.into(),
            // OpenAI takes any int64; the bit pattern keeps distinct seeds distinct.
            seed: self.seed.map(|s| s as u64),
            stop: self
                .stop
                .cloned()
                .map(Stop::into_vec)
                .unwrap_or_default()
                .into(),
            stop_token_ids: stop_token_ids.into(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            logprobs,
            prompt_logprobs: None,
            constraint: None,
            prediction: Vec::new(),
        };
        params.validate(ctx.vocab_size)?;
        Ok(params)
    }

    /// The grammar the output must follow: `response_format`'s, a chat's
    /// `tools` plan's, or both joined ([`ToolPlan::grammar_with`]),
    /// compiled here, off the scheduler thread. A bad schema is the
    /// client's error.
    fn constraint(
        &self,
        tools: Option<&ToolPlan>,
        ctx: &ModelContext,
    ) -> Result<Option<Constraint>, ApiError> {
        let format = self
            .response_format
            .map(|f| response_format(f, self.names))
            .transpose()?
            .flatten();
        let format_name = self.names.response_format;
        let planned = match tools {
            Some(plan) => plan.grammar_with(format, format_name)?,
            None => format.map(|g| (g, format_name)),
        };
        let Some((grammar, param)) = planned else {
            return Ok(None);
        };
        // The grammar decides where the output ends.
        for (field, set) in [
            ("ignore_eos", self.ignore_eos == Some(true)),
            ("min_tokens", self.min_tokens.is_some_and(|m| m > 0)),
        ] {
            if set {
                return Err(ApiError::bad_request(
                    format!("{field} cannot be combined with {param}, whose grammar decides where the output ends"),
                    Some(field),
                ));
            }
        }
        let factory = ctx.constraints.ok_or_else(|| {
            ApiError::bad_request(
                "constrained output is not available for this model's vocabulary",
                Some(param),
            )
        })?;
        factory
            .compile(&grammar)
            .map(Some)
            .map_err(|e| ApiError::bad_request(format!("invalid {param}: {e:#}"), Some(param)))
    }
}

/// The grammar of a `response_format`; `None` for plain text.
fn response_format(f: &ResponseFormat, names: &FieldNames) -> Result<Option<Grammar>, ApiError> {
    unsupported::refuse(&f.unknown, names.response_format)?;
    match (f.kind.as_str(), &f.json_schema) {
        ("text", _) => Ok(None),
        ("json_object", _) => Ok(Some(Grammar::JsonObject)),
        ("json_schema", Some(js)) => {
            unsupported::refuse(&js.unknown, names.json_schema)?;
            match &js.schema {
                Some(schema) if schema.is_object() || schema.is_boolean() => {
                    Ok(Some(Grammar::JsonSchema(schema.clone())))
                }
                Some(_) => Err(ApiError::bad_request(
                    "response_format.json_schema.schema must be a JSON schema object",
                    Some(&format!("{}.schema", names.json_schema)),
                )),
                // OpenAI's default: any JSON object.
                None => Ok(Some(Grammar::JsonObject)),
            }
        }
        ("json_schema", None) => Err(ApiError::bad_request(
            "response_format of type json_schema needs a json_schema object",
            Some(names.json_schema),
        )),
        (other, _) => Err(ApiError::unsupported_value(
            &format!("{}.type", names.response_format),
            format!("response_format type must be text, json_object or json_schema, got {other:?}"),
        )),
    }
}

/// A chat request's `prediction`, tokenized. Its drafts never change the
/// output, but a constrained row does not draft, so the two together are
/// refused rather than the prediction ignored.
fn prediction(
    p: &Prediction,
    params: &SamplingParams,
    ctx: &ModelContext,
) -> Result<Vec<u32>, ApiError> {
    unsupported::refuse(&p.unknown, "prediction")?;
    if p.kind != "content" {
        return Err(ApiError::bad_request(
            format!(
                "prediction type {:?} is not supported: only \"content\"",
                p.kind
            ),
            Some("prediction.type"),
        ));
    }
    if params.constraint.is_some() {
        return Err(ApiError::bad_request(
            "prediction cannot be used with response_format or a forced tool call: \
             constrained output is not drafted",
            Some("prediction"),
        ));
    }
    let text = chat_messages::text(&p.content, "prediction.content")?;
    let mut ids = encode_prompt(&text, ctx, "prediction")?;
    if ids
        .first()
        .is_some_and(|&t| Some(t) == ctx.tokenizer.bos_id())
    {
        ids.remove(0);
    }
    Ok(ids)
}

/// Tokenizes text the whole way (`/tokenize`), after refusing text too
/// long to fit the context without spending the time to encode it.
pub(crate) fn encode(text: &str, ctx: &ModelContext, param: &str) -> Result<Vec<u32>, ApiError> {
    Ok(encode_within(text, ctx, param, usize::MAX)?.expect("no text passes usize::MAX tokens"))
}

/// Tokenizes a prompt, refusing it as soon as it passes the context (and
/// one BOS the chat path may drop): a conversation of many short messages
/// is refused before most of it is encoded.
pub(crate) fn encode_prompt(
    text: &str,
    ctx: &ModelContext,
    param: &str,
) -> Result<Vec<u32>, ApiError> {
    encode_within(text, ctx, param, ctx.max_context + 1)?.ok_or_else(|| {
        ApiError::context_length_exceeded(
            format!(
                "This model's maximum context length is {} tokens, and the {param} went past \
                 that. Please reduce the length of the {param}.",
                ctx.max_context
            ),
            Some(param),
        )
    })
}

fn encode_within(
    text: &str,
    ctx: &ModelContext,
    param: &str,
    limit: usize,
) -> Result<Option<Vec<u32>>, ApiError> {
    if text.len() > ctx.tokenizer.max_text_bytes(ctx.max_context) {
        return Err(ApiError::context_length_exceeded(
            format!(
                "This model's maximum context length is {} tokens, and your {param} ({} bytes) \
                 is far longer than that. Please reduce the length of the {param}.",
                ctx.max_context,
                text.len()
            ),
            Some(param),
        ));
    }
    ctx.tokenizer
        .encode_within(text, limit)
        .map_err(|e| ApiError::bad_request(format!("cannot tokenize {param}: {e:#}"), Some(param)))
}

/// `max_tokens` defaults to 16, as OpenAI. Token prompts are used as given
/// (no BOS added); text prompts get BOS only if the tokenizer adds it.
pub fn validate_completion(
    req: &CompletionRequest,
    ctx: &ModelContext,
) -> Result<GenerationPlan, ApiError> {
    let common = Common::from(req);
    let shape = common.check(ctx)?;
    unsupported::best_of(req.best_of, shape.n)?;
    let echo = req.echo.unwrap_or(false);
    let num_prompts = match &req.prompt {
        Prompt::Texts(texts) => texts.len(),
        Prompt::TokenBatches(batches) => batches.len(),
        Prompt::Text(_) | Prompt::Tokens(_) => 1,
    };
    check_choices(num_prompts, shape.n, ctx)?;

    let (prompts, texts): (Vec<Vec<u32>>, Vec<Option<&str>>) = match &req.prompt {
        Prompt::Text(t) => (vec![encode_prompt(t, ctx, "prompt")?], vec![Some(t)]),
        Prompt::Texts(ts) => (
            ts.iter()
                .map(|t| encode_prompt(t, ctx, "prompt"))
                .collect::<Result<_, _>>()?,
            ts.iter().map(|t| Some(t.as_str())).collect(),
        ),
        Prompt::Tokens(ids) => (vec![ids.clone()], vec![None]),
        Prompt::TokenBatches(batches) => (batches.clone(), vec![None; batches.len()]),
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_request(
            "prompt must not be empty",
            Some("prompt"),
        ));
    }
    for ids in &prompts {
        request_rules::check_prompt(ids, ctx.vocab_size)?;
    }

    let max_tokens = req
        .max_tokens
        .map_or(DEFAULT_COMPLETION_MAX_TOKENS, |m| m as usize);
    let logprobs = req.logprobs.map(|k| k as usize);
    let mut params = common.params(max_tokens, logprobs, ctx)?;
    params.constraint = common.constraint(None, ctx)?;
    // OpenAI's echo with logprobs scores the echoed prompt as well.
    if echo {
        params.prompt_logprobs = logprobs;
    }
    for ids in &prompts {
        check_context(ids.len(), max_tokens, ctx, "prompt")?;
    }

    let prompt_texts = if echo {
        texts
            .iter()
            .zip(&prompts)
            .map(|(text, ids)| match text {
                Some(t) => Ok(t.to_string()),
                // The ids are in the vocabulary, so a failure here is ours.
                None => ctx
                    .tokenizer
                    .decode(ids)
                    .map_err(|e| ApiError::internal(format!("cannot decode prompt: {e:#}"))),
            })
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    Ok(GenerationPlan {
        prompts: common.prompts(prompts),
        params,
        n: shape.n,
        stream: shape.stream,
        include_usage: shape.include_usage,
        continuous_usage: shape.continuous_usage,
        echo,
        logprobs,
        prompt_texts,
        tools: ToolPlan::none(),
        reasoning: None,
        harmony: false,
    })
}

/// Chat's `max_tokens` defaults to what fits (as vLLM does): the rest of
/// the context, and of what the KV pool can hold for one sequence, so a
/// reply is never cut short by an arbitrary default, nor refused for one.
pub fn validate_chat(
    req: &ChatCompletionRequest,
    ctx: &ModelContext,
) -> Result<GenerationPlan, ApiError> {
    let legacy = legacy_functions::is_legacy(req);
    let normalized = legacy_functions::normalize(req)?;
    let req = normalized.as_ref();
    let names = &req.names;
    let common = Common {
        names,
        ..Common::from(req)
    };
    let shape = common.check(ctx)?;
    unsupported::modalities(req.modalities.as_deref())?;
    unsupported::verbosity(req.verbosity.as_deref())?;
    // OpenAI's newer name wins when both are sent.
    let (requested_max, max_param) = match req.max_completion_tokens {
        Some(m) => (Some(m), "max_completion_tokens"),
        None => (req.max_tokens, names.max_tokens),
    };
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (_, Some(k)) if k as usize > MAX_LOGPROBS => {
            return Err(ApiError::bad_request(
                format!("top_logprobs must be in [0, {MAX_LOGPROBS}], got {k}"),
                Some("top_logprobs"),
            ))
        }
        (false, Some(_)) => {
            return Err(ApiError::bad_request(
                "top_logprobs requires logprobs to be true",
                Some("top_logprobs"),
            ))
        }
        (true, k) => Some(k.unwrap_or(0) as usize),
        (false, None) => None,
    };

    check_choices(1, shape.n, ctx)?;
    let template = ctx.chat_template.ok_or_else(|| {
        ApiError::bad_request(
            format!(
                "the model `{}` has no chat template; use /v1/completions with a raw prompt, \
                 or start wick with --chat-template FILE",
                ctx.name
            ),
            None,
        )
    })?;
    let (mut messages, images) = chat_messages::conversation(&req.messages, names.messages)?;
    images::check_count(&images, &ctx.image_budget)?;
    let image_spec = match (images.first(), ctx.images) {
        (None, _) => None,
        (Some(first), None) => {
            return Err(ApiError::bad_request(
                format!("the model `{}` takes no images", ctx.name),
                Some(&format!("{}.type", first.part)),
            ))
        }
        (Some(_), Some(spec)) => Some(spec),
    };
    let speaks_harmony = harmony::template_speaks_harmony(template.source());
    if speaks_harmony {
        messages = chat_messages::harmony_conversation(messages);
    }
    let mut tools = tools::plan(req, template.source()).map_err(|e| match legacy {
        true => legacy_functions::in_old_terms(e),
        false => e,
    })?;
    tools.legacy = legacy;
    if let (ToolMode::Generic, Some(list)) = (&tools.mode, &tools.tools) {
        messages = tools::generic_conversation(messages, list, tools.parallel);
    }
    let kwargs = template_kwargs(req, template)?;
    let render = |messages: &[_]| {
        template.render_request(messages, tools.tools.as_ref(), true, kwargs.as_ref())
    };
    // Rendered as transformers would first; a template that cannot take a
    // turn without content gets it as vLLM sends it.
    let rendered = render(&messages)
        .or_else(|e| match chat_messages::with_empty_content(&messages) {
            Some(filled) => render(&filled),
            None => Err(e),
        })
        .map_err(|e| ApiError::bad_request(format!("{e:#}"), Some(names.messages)))?;
    // The prompt's errors read as chat's (the messages), naming the
    // client's field.
    let named = |e: ApiError| ApiError {
        param: e.param.and(Some(names.messages.to_string())),
        ..e
    };
    let prompt_text = match image_spec {
        Some(spec) => Cow::Owned(images::expand(
            &rendered,
            spec,
            images.len(),
            names.messages,
        )?),
        None => Cow::Borrowed(&rendered),
    };
    let mut ids = encode_prompt(&prompt_text, ctx, "messages").map_err(named)?;
    // A template that writes BOS itself, under a tokenizer that also adds
    // it, would start with two; the model was trained on one (vLLM and
    // llama.cpp also keep one).
    if let Some(bos) = ctx.tokenizer.bos_id() {
        if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
            ids.remove(0);
        }
    }
    let media = match image_spec {
        Some(spec) => {
            let pixels = images::load(&images, spec, &ctx.image_budget, ctx.fetched)?;
            images::spans(&ids, spec, pixels, names.messages)?
        }
        None => Vec::new(),
    };

    let max_tokens = match requested_max {
        Some(m) => m as usize,
        // A pool too small for the prompt itself leaves 1, which the
        // engine refuses, saying so.
        None if ids.len() < ctx.max_context => ctx
            .max_context
            .min(ctx.max_seq_tokens)
            .saturating_sub(ids.len())
            .max(1),
        None => {
            return Err(ApiError::context_length_exceeded(
                format!(
                    "This model's maximum context length is {} tokens. However, your messages \
                     resulted in {} tokens. Please reduce the length of the messages.",
                    ctx.max_context,
                    ids.len()
                ),
                Some(names.messages),
            ))
        }
    };
    let mut params = common.params(max_tokens, logprobs, ctx);
    if let Err(e) = &mut params {
        // The sampling layer names chat's fields; the client may have sent
        // them under others (chat's newer name, a translating API's).
        match e.param.as_deref() {
            Some("max_tokens") => e.param = Some(max_param.to_string()),
            Some("stop") => e.param = Some(names.stop.to_string()),
            _ => {}
        }
    }
    let mut params = params?;
    check_context(ids.len(), max_tokens, ctx, "messages").map_err(named)?;
    params.constraint = common.constraint(Some(&tools), ctx)?;
    if let Some(p) = &req.prediction {
        params.prediction = prediction(p, &params, ctx)?;
    }
    let mut prompts = common.prompts(vec![ids]);
    prompts[0].media = media;
    Ok(GenerationPlan {
        prompts,
        params,
        n: shape.n,
        stream: shape.stream,
        include_usage: shape.include_usage,
        continuous_usage: shape.continuous_usage,
        echo: false,
        logprobs,
        prompt_texts: Vec::new(),
        tools,
        reasoning: ReasoningParser::template_thinks(template.source())
            .then(|| ReasoningParser::prompt_opens_block(&rendered)),
        harmony: speaks_harmony,
    })
}

/// The chat template's variables from the request: `chat_template_kwargs`
/// (none of the names wick sets itself) and `reasoning_effort`, passed as
/// the variable of that name, as vLLM does. Sent both ways, the two must
/// agree: neither is silently dropped for the other.
fn template_kwargs(
    req: &ChatCompletionRequest,
    template: &ChatTemplate,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, ApiError> {
    let kwargs = req.chat_template_kwargs.clone();
    if let Some(name) = kwargs
        .iter()
        .flat_map(|k| k.keys())
        .find(|k| ChatTemplate::RESERVED.contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(
            format!("chat_template_kwargs may not set `{name}`: wick sets it from the request"),
            Some(req.names.chat_template_kwargs),
        ));
    }
    let Some(effort) = req.reasoning_effort.as_deref() else {
        return Ok(kwargs);
    };
    let effort_name = req.names.reasoning_effort;
    unsupported::reasoning_effort(effort, template.reads("reasoning_effort"), effort_name)?;
    if harmony::template_speaks_harmony(template.source()) {
        unsupported::harmony_reasoning_effort(effort, effort_name)?;
    }
    let mut kwargs = kwargs.unwrap_or_default();
    match kwargs.get("reasoning_effort") {
        Some(other) if other.as_str() != Some(effort) => Err(ApiError::bad_request(
            format!(
                "reasoning_effort {effort:?} conflicts with chat_template_kwargs.reasoning_effort \
                 {}: send one",
                clip(&other.to_string(), MAX_ECHO_CHARS)
            ),
            Some(effort_name),
        )),
        _ => {
            kwargs.insert("reasoning_effort".into(), effort.into());
            Ok(Some(kwargs))
        }
    }
}

/// A request naming a model must name one served: the main name or an
/// alias (404 otherwise, as OpenAI answers).
pub fn check_model(model: Option<&str>, name: &str, aliases: &[String]) -> Result<(), ApiError> {
    match model {
        Some(m) if m != name && !aliases.iter().any(|a| a == m) => {
            Err(ApiError::model_not_found(m))
        }
        _ => Ok(()),
    }
}

/// A request's sequences (each prompt `n` times) must fit what the server
/// runs and queues at once, or it could never be admitted.
fn check_choices(num_prompts: usize, n: usize, ctx: &ModelContext) -> Result<(), ApiError> {
    let total = num_prompts.saturating_mul(n);
    if total <= ctx.max_choices {
        return Ok(());
    }
    Err(ApiError::bad_request(
        format!(
            "the request asks for {total} sequences ({num_prompts} prompts, n = {n}); the server \
             runs and queues at most {} at once",
            ctx.max_choices
        ),
        Some(if num_prompts > 1 { "prompt" } else { "n" }),
    ))
}

fn check_context(
    prompt_len: usize,
    max_tokens: usize,
    ctx: &ModelContext,
    param: &str,
) -> Result<(), ApiError> {
    request_rules::check_context(prompt_len, max_tokens, ctx.max_context)
        .map_err(|e| ApiError::for_prompt(e, param))
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use axum::http::StatusCode;
    use candle_core::quantized::gguf_file::Content;
    use serde_json::{json, Value};

    use super::*;

    /// A plan's prompts as their tokens.
    fn token_lists(plan: &GenerationPlan) -> Vec<Vec<u32>> {
        plan.prompts.iter().map(|p| p.tokens.clone()).collect()
    }

    /// The default model's tokenizer and chat template, built as the loader
    /// builds them; read once for all tests.
    fn model() -> &'static (Tokenizer, ChatTemplate) {
        static MODEL: OnceLock<(Tokenizer, ChatTemplate)> = OnceLock::new();
        MODEL.get_or_init(|| {
            let tokenizer = crate::text::tokenizer::test_tokenizer();
            let path = crate::load::model_fetch::default_model_path().expect("default model");
            let content = Content::read(&mut std::fs::File::open(path).unwrap()).unwrap();
            let meta = |key: &str| content.metadata[key].clone();
            let token = |key: &str| tokenizer.id_to_token(meta(key).to_u32().unwrap()).unwrap();
            let template = ChatTemplate::new(
                meta("tokenizer.chat_template").to_string().unwrap().clone(),
                token("tokenizer.ggml.bos_token_id"),
                token("tokenizer.ggml.eos_token_id"),
            )
            .unwrap();
            (tokenizer, template)
        })
    }

    const NAME: &str = "smollm2";

    fn ctx() -> ModelContext<'static> {
        let (tokenizer, template) = model();
        ModelContext {
            name: NAME,
            aliases: &[],
            vocab_size: tokenizer.vocab_size(),
            max_context: 8192,
            max_seq_tokens: 1 << 20,
            max_choices: 1280,
            tokenizer,
            chat_template: Some(template),
            constraints: Some(constraints()),
            images: None,
            image_budget: ImageBudget::default(),
            fetched: &crate::media::fetch::NOTHING_FETCHED,
        }
    }

    fn constraints() -> &'static ConstraintFactory {
        static FACTORY: OnceLock<ConstraintFactory> = OnceLock::new();
        FACTORY.get_or_init(|| ConstraintFactory::new(&model().0).unwrap())
    }

    fn completion(body: Value) -> Result<GenerationPlan, ApiError> {
        validate_completion(&parse_json(body.to_string().as_bytes())?, &ctx())
    }

    fn chat(body: Value) -> Result<GenerationPlan, ApiError> {
        validate_chat(&parse_json(body.to_string().as_bytes())?, &ctx())
    }

    fn with(mut base: Value, extra: Value) -> Value {
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        base
    }

    fn user(text: &str) -> Value {
        json!({"messages": [{"role": "user", "content": text}]})
    }

    /// A 400 naming `param`.
    #[track_caller]
    fn assert_rejects(result: Result<GenerationPlan, ApiError>, param: &str) -> ApiError {
        let e = result.expect_err("should be rejected");
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{e:?}");
        assert_eq!(e.kind, "invalid_request_error", "{e:?}");
        assert_eq!(e.param.as_deref(), Some(param), "{e:?}");
        e
    }

    fn encode(text: &str) -> Vec<u32> {
        model().0.encode(text).unwrap()
    }

    #[test]
    fn string_prompt() {
        let plan = completion(json!({"prompt": "Hello there", "model": NAME})).unwrap();
        assert_eq!(token_lists(&plan), vec![encode("Hello there")]);
        assert_eq!(plan.params.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS);
        assert_eq!(plan.params.temperature, 1.0);
        assert_eq!(
            (plan.n, plan.stream, plan.include_usage, plan.echo),
            (1, false, false, false)
        );
        assert_eq!(plan.logprobs, None);
        assert!(plan.prompt_texts.is_empty());
    }

    #[test]
    fn list_of_strings() {
        let plan = completion(json!({"prompt": ["a b", "c"], "echo": true})).unwrap();
        assert_eq!(token_lists(&plan), vec![encode("a b"), encode("c")]);
        assert_eq!(plan.prompt_texts, ["a b", "c"]);
    }

    #[test]
    fn echo_with_logprobs_scores_the_prompt() {
        let plan = completion(json!({"prompt": "a b", "echo": true, "logprobs": 2})).unwrap();
        assert_eq!(plan.params.prompt_logprobs, Some(2));
        let plan = completion(json!({"prompt": "a b", "logprobs": 2})).unwrap();
        assert_eq!(plan.params.prompt_logprobs, None);
        let plan = completion(json!({"prompt": "a b", "echo": true})).unwrap();
        assert_eq!(plan.params.prompt_logprobs, None);
    }

    #[test]
    fn token_ids() {
        let ids = encode("The capital of France is");
        let plan = completion(json!({"prompt": ids, "echo": true})).unwrap();
        assert_eq!(token_lists(&plan), vec![ids]);
        assert_eq!(plan.prompt_texts, ["The capital of France is"]);
    }

    #[test]
    fn list_of_token_lists() {
        let plan = completion(json!({"prompt": [[1, 2, 3], [4]]})).unwrap();
        assert_eq!(token_lists(&plan), vec![vec![1, 2, 3], vec![4]]);
    }

    #[test]
    fn sampling_fields_reach_the_params() {
        let plan = completion(json!({
            "prompt": "x", "max_tokens": 7, "temperature": 0.3, "top_p": 0.9, "top_k": 40,
            "min_p": 0.05, "n": 3, "stream": true, "stream_options": {"include_usage": true},
            "stop": "\n", "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "repetition_penalty": 1.2, "logit_bias": {"50": 5, "7": -100}, "logprobs": 2,
            "seed": -1, "user": "me", "ignore_eos": true, "min_tokens": 3,
            "stop_token_ids": [2]
        }))
        .unwrap();
        let expected = SamplingParams {
            max_tokens: 7,
            min_tokens: 3,
            temperature: 0.3,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            repetition_penalty: 1.2,
            presence_penalty: 0.5,
            frequency_penalty: -0.5,
            logit_bias: vec![(7, -100.0), (50, 5.0)].into(),
            seed: Some(u64::MAX),
            stop: vec!["\n".into()].into(),
            stop_token_ids: vec![2].into(),
            ignore_eos: true,
            logprobs: Some(2),
            prompt_logprobs: None,
            constraint: None,
            prediction: Vec::new(),
        };
        assert_eq!(plan.params, expected);
        assert_eq!((plan.n, plan.stream, plan.include_usage), (3, true, true));
        assert_eq!(plan.logprobs, Some(2));
    }

    #[test]
    fn top_k_minus_one_and_zero_are_off() {
        for k in [-1, 0] {
            assert_eq!(
                completion(json!({"prompt": "x", "top_k": k}))
                    .unwrap()
                    .params
                    .top_k,
                0
            );
        }
        assert_rejects(completion(json!({"prompt": "x", "top_k": -2})), "top_k");
    }

    #[test]
    fn chat_with_parts() {
        let plan = chat(json!({
            "model": NAME,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}
            ]
        }))
        .unwrap();
        let expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(token_lists(&plan), vec![encode(expected)]);
        let len = plan.prompts[0].tokens.len();
        assert_eq!(
            plan.params.max_tokens,
            8192 - len,
            "defaults to the rest of the context"
        );
        assert!(!plan.echo);
        assert_eq!(plan.logprobs, None);
    }

    #[test]
    fn chat_max_completion_tokens_wins() {
        let plan = chat(with(
            user("Hi"),
            json!({"max_tokens": 5, "max_completion_tokens": 9}),
        ))
        .unwrap();
        assert_eq!(plan.params.max_tokens, 9);
        let plan = chat(with(user("Hi"), json!({"max_tokens": 5}))).unwrap();
        assert_eq!(plan.params.max_tokens, 5);
        assert_rejects(
            chat(with(
                user("Hi"),
                json!({"max_tokens": 5, "max_completion_tokens": 0}),
            )),
            "max_completion_tokens",
        );
    }

    #[test]
    fn chat_logprobs() {
        let plan = chat(with(user("Hi"), json!({"logprobs": true}))).unwrap();
        assert_eq!((plan.logprobs, plan.params.logprobs), (Some(0), Some(0)));
        let plan = chat(with(
            user("Hi"),
            json!({"logprobs": true, "top_logprobs": 5}),
        ))
        .unwrap();
        assert_eq!(plan.logprobs, Some(5));
        assert_eq!(
            chat(with(user("Hi"), json!({"logprobs": false})))
                .unwrap()
                .logprobs,
            None
        );
        assert_rejects(
            chat(with(
                user("Hi"),
                json!({"logprobs": true, "top_logprobs": 21}),
            )),
            "top_logprobs",
        );
        assert_rejects(
            chat(with(user("Hi"), json!({"top_logprobs": 2}))),
            "top_logprobs",
        );
        assert_rejects(
            chat(with(
                user("Hi"),
                json!({"logprobs": false, "top_logprobs": 2}),
            )),
            "top_logprobs",
        );
    }

    #[test]
    fn chat_bad_messages() {
        assert_rejects(chat(json!({"messages": []})), "messages");
        assert_rejects(
            chat(
                json!({"messages": [{"role": "user", "content": "a"}, {"role": "critic", "content": "b"}]}),
            ),
            "messages[1].role",
        );
        assert_rejects(
            chat(
                json!({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}),
            ),
            "messages[1].tool_call_id",
        );
        let e = assert_rejects(
            chat(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]}),
            ),
            "messages[0].content[0].type",
        );
        assert!(e.message.contains("takes no images"), "{}", e.message);
        assert_rejects(
            chat(json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]})),
            "messages[0].content[0].text",
        );
        assert_rejects(
            chat(json!({"messages": [{"content": "a"}]})),
            "messages[0].role",
        );
        assert_rejects(
            chat(json!({"messages": [{"role": "user", "content": 5}]})),
            "messages[0].content",
        );
        assert_rejects(chat(json!({"model": NAME})), "messages");
    }

    /// An agent loop's history reaches the template: the developer turn as
    /// system, the tool result under its role (SmolLM2's template writes
    /// any role, and no tool calls).
    #[test]
    fn chat_agent_history() {
        let call = json!([{"id": "c1", "type": "function",
                           "function": {"name": "clock", "arguments": "{}"}}]);
        let plan = chat(json!({"messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": call},
            {"role": "tool", "tool_call_id": "c1", "name": "clock", "content": "09:07"}
        ]}))
        .unwrap();
        let expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTime?<|im_end|>\n\
                        <|im_start|>assistant\nChecking.<|im_end|>\n<|im_start|>tool\n09:07<|im_end|>\n\
                        <|im_start|>assistant\n";
        assert_eq!(token_lists(&plan), vec![encode(expected)]);
        // A turn that only calls tools has no content for this template to
        // write (transformers fails on it): it is rendered with "" there, as
        // vLLM sends it.
        let plan = chat(json!({"messages": [
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": null, "tool_calls": call}
        ]}))
        .unwrap();
        let with_empty = chat(json!({"messages": [
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": "", "tool_calls": call}
        ]}))
        .unwrap();
        assert_eq!(plan.prompts, with_empty.prompts);
    }

    #[test]
    fn chat_without_template() {
        let c = ModelContext {
            chat_template: None,
            ..ctx()
        };
        let req: ChatCompletionRequest = serde_json::from_value(user("Hi")).unwrap();
        let e = validate_chat(&req, &c).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("no chat template"), "{}", e.message);
    }

    #[test]
    fn chat_keeps_a_single_bos() {
        let (tokenizer, template) = model();
        // SmolLM2's BOS is `<|im_start|>`, which its template writes first:
        // a tokenizer that also adds BOS would double it.
        let adds_bos = Tokenizer::from_hf(tokenizer.inner().clone(), vec![2], Some(1), true);
        let c = ModelContext {
            tokenizer: &adds_bos,
            chat_template: Some(template),
            ..ctx()
        };
        let req: ChatCompletionRequest = serde_json::from_value(user("Hi")).unwrap();
        let with_bos = validate_chat(&req, &c).unwrap();
        assert_eq!(with_bos.prompts, chat(user("Hi")).unwrap().prompts);
        assert_eq!(with_bos.prompts[0].tokens[0], 1);
        assert_ne!(with_bos.prompts[0].tokens[1], 1);
    }

    #[test]
    fn other_model_is_404() {
        for result in [
            completion(json!({"prompt": "x", "model": "gpt-4"})),
            chat(with(user("Hi"), json!({"model": "gpt-4"}))),
        ] {
            let e = result.unwrap_err();
            assert_eq!(e.status, StatusCode::NOT_FOUND);
            assert_eq!(e.code.as_deref(), Some("model_not_found"));
            assert_eq!(e.message, "The model `gpt-4` does not exist.");
        }
        let aliases = ["gpt-4".to_string()];
        let c = ModelContext {
            aliases: &aliases,
            ..ctx()
        };
        for model in [NAME, "gpt-4"] {
            let req: CompletionRequest =
                serde_json::from_value(json!({"prompt": "x", "model": model})).unwrap();
            validate_completion(&req, &c).unwrap();
        }
    }

    /// OpenAI takes `top_p: 0` as greedy: the most likely token alone.
    #[test]
    fn top_p_zero_is_top_1() {
        let p = completion(json!({"prompt": "x", "top_p": 0, "top_k": 40}))
            .unwrap()
            .params;
        assert_eq!((p.top_k, p.top_p), (1, 1.0));
        let p = completion(json!({"prompt": "x", "top_p": 0.5}))
            .unwrap()
            .params;
        assert_eq!((p.top_k, p.top_p), (0, 0.5));
        let e = completion(json!({"prompt": "x", "top_p": -0.1})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_p"));
    }

    #[test]
    fn range_rules_name_their_field() {
        let cases = [
            (json!({"temperature": -0.1}), "temperature"),
            (json!({"temperature": 2.5}), "temperature"),
            (json!({"top_p": 1.5}), "top_p"),
            (json!({"n": 0}), "n"),
            (json!({"n": MAX_N + 1}), "n"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"presence_penalty": 2.5}), "presence_penalty"),
            (json!({"frequency_penalty": -2.5}), "frequency_penalty"),
            (json!({"repetition_penalty": 0}), "repetition_penalty"),
            (json!({"min_p": 1.5}), "min_p"),
            (json!({"logprobs": 21}), "logprobs"),
            (
                json!({"stream_options": {"include_usage": true}}),
                "stream_options",
            ),
            (
                json!({"stream": false, "stream_options": {"include_usage": true}}),
                "stream_options",
            ),
            (json!({"logit_bias": {"49152": 1}}), "logit_bias"),
            (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
            (json!({"logit_bias": {"5": 101}}), "logit_bias"),
            (json!({"stop": ["ok", ""]}), "stop"),
            (json!({"stop_token_ids": [49152]}), "stop_token_ids"),
            (json!({"min_tokens": 17}), "min_tokens"),
        ];
        for (extra, param) in cases {
            assert_rejects(
                completion(with(json!({"prompt": "x"}), extra.clone())),
                param,
            );
            assert_rejects(
                chat(with(user("x"), with(json!({"max_tokens": 16}), extra))),
                param,
            );
        }
        // The edges are accepted.
        let edges = json!({"prompt": "x", "temperature": 2, "top_p": 1, "n": MAX_N, "max_tokens": 1,
                           "presence_penalty": -2, "frequency_penalty": 2, "logprobs": 20});
        completion(edges).unwrap();
    }

    #[test]
    fn prompts_times_n_are_bounded() {
        let max = ctx().max_choices;
        let prompts = vec!["a"; max / 2 + 1];
        let e = assert_rejects(completion(json!({"prompt": prompts, "n": 2})), "prompt");
        assert!(
            e.message
                .contains(&format!("{} sequences", (max / 2 + 1) * 2)),
            "{}",
            e.message
        );
        completion(json!({"prompt": vec!["a"; max / 2], "n": 2})).unwrap();
        let small = ModelContext {
            max_choices: 2,
            ..ctx()
        };
        let req: ChatCompletionRequest =
            serde_json::from_value(with(user("x"), json!({"n": 3}))).unwrap();
        assert_eq!(
            validate_chat(&req, &small).unwrap_err().param.as_deref(),
            Some("n")
        );
    }

    /// A prompt far past the context is refused by its length alone (the
    /// message counts bytes, not tokens: it was never encoded), as OpenAI's
    /// context error.
    #[test]
    fn huge_prompts_are_refused_unread() {
        let huge = "word ".repeat(2 << 20);
        for (result, param) in [
            (completion(json!({"prompt": huge})), "prompt"),
            (chat(user(&huge)), "messages"),
        ] {
            let e = assert_rejects(result, param);
            assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
            assert!(e.message.contains("bytes)"), "{}", e.message);
        }
    }

    /// A conversation of many short messages, each well inside the byte
    /// bound, is refused on its tokens as they pass the context, and
    /// names the messages.
    #[test]
    fn conversations_past_the_context_are_refused() {
        let many: Vec<Value> = (0..20_000)
            .map(|_| json!({"role": "user", "content": "x"}))
            .collect();
        let e = assert_rejects(chat(json!({"messages": many})), "messages");
        assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
        assert!(e.message.contains("went past that"), "{}", e.message);
    }

    #[test]
    fn empty_and_out_of_vocabulary_prompts() {
        for prompt in [
            json!(""),
            json!([]),
            json!([[]]),
            json!([[1], []]),
            json!(["a", ""]),
        ] {
            let e = assert_rejects(completion(json!({"prompt": prompt})), "prompt");
            assert!(e.message.contains("empty"), "{}", e.message);
        }
        let vocab = model().0.vocab_size();
        for prompt in [json!([1, vocab]), json!([[1], [vocab + 5]])] {
            let e = assert_rejects(completion(json!({"prompt": prompt})), "prompt");
            assert!(e.message.contains("out of vocabulary"), "{}", e.message);
        }
        completion(json!({"prompt": [0, vocab - 1]})).unwrap();
    }

    #[test]
    fn context_length() {
        let small = |max_context| ModelContext {
            max_context,
            ..ctx()
        };
        let ids = encode("one two three four");
        let p = ids.len();
        let req: CompletionRequest =
            serde_json::from_value(json!({"prompt": ids, "max_tokens": 10})).unwrap();
        assert!(validate_completion(&req, &small(p + 10)).is_ok());
        let e = validate_completion(&req, &small(p + 9)).unwrap_err();
        assert_eq!(
            (e.status, e.code.as_deref(), e.param.as_deref()),
            (
                StatusCode::BAD_REQUEST,
                Some("context_length_exceeded"),
                Some("prompt")
            )
        );
        assert_eq!(
            e.message,
            format!(
                "This model's maximum context length is {} tokens, however you requested {} tokens ({p} in your prompt; 10 for the completion). Please reduce your prompt; or completion length.",
                p + 9,
                p + 10
            )
        );
        // The default 16 counts too.
        let req: CompletionRequest = serde_json::from_value(json!({"prompt": [1, 2]})).unwrap();
        assert!(validate_completion(&req, &small(18)).is_ok());
        assert!(validate_completion(&req, &small(17)).is_err());

        let req: ChatCompletionRequest =
            serde_json::from_value(with(user("Hi"), json!({"max_tokens": 100}))).unwrap();
        let p = chat(user("Hi")).unwrap().prompts[0].tokens.len();
        let e = validate_chat(&req, &small(p + 99)).unwrap_err();
        assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(
            e.message
                .contains(&format!("({p} in the messages, 100 in the completion)")),
            "{}",
            e.message
        );
        // Without max_tokens the reply gets the rest, and a prompt that
        // fills the context leaves nothing.
        let req: ChatCompletionRequest = serde_json::from_value(user("Hi")).unwrap();
        assert_eq!(
            validate_chat(&req, &small(p + 1))
                .unwrap()
                .params
                .max_tokens,
            1
        );
        let e = validate_chat(&req, &small(p)).unwrap_err();
        assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
        assert!(
            e.message
                .contains(&format!("your messages resulted in {p} tokens")),
            "{}",
            e.message
        );
        // ...nor more than the KV pool holds for one sequence.
        let small_pool = ModelContext {
            max_seq_tokens: p + 100,
            ..ctx()
        };
        let plan = validate_chat(&req, &small_pool).unwrap();
        assert_eq!(plan.params.max_tokens, 100);
    }

    #[test]
    fn parse_errors_name_the_field() {
        let parse = |body: &str| parse_json::<CompletionRequest>(body.as_bytes()).unwrap_err();
        for body in [
            "",
            "{",
            "{\"prompt\": \"x\",}",
            "{\"prompt\": \"x\"} trailing",
            "nope",
        ] {
            let e = parse(body);
            assert_eq!(
                (e.status, e.param.as_deref()),
                (StatusCode::BAD_REQUEST, None),
                "{body:?}"
            );
            assert!(e.message.starts_with("invalid JSON body"), "{}", e.message);
        }
        let e = parse(r#"{"prompt": "x", "temperature": "hot"}"#);
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(
            e.message.contains("invalid type: string \"hot\""),
            "{}",
            e.message
        );
        assert_eq!(
            parse(r#"{"prompt": "x", "max_tokens": -1}"#)
                .param
                .as_deref(),
            Some("max_tokens")
        );
        assert_eq!(
            parse(r#"{"prompt": "x", "stop": [1]}"#).param.as_deref(),
            Some("stop")
        );
        assert_eq!(
            parse(r#"{"prompt": "x", "stream_options": {"include_usage": 1}}"#)
                .param
                .as_deref(),
            Some("stream_options.include_usage")
        );
        let e = parse(r#"{"prompt": [-1]}"#);
        assert_eq!(e.param.as_deref(), Some("prompt"));
        assert!(
            e.message.contains("expected a string, a list of strings"),
            "{}",
            e.message
        );
        let e = parse(r#"{"model": "m"}"#);
        assert_eq!(e.param.as_deref(), Some("prompt"));
        assert!(
            e.message.contains("missing field `prompt`"),
            "{}",
            e.message
        );
        for body in ["[1, 2]", " \"x\"", "3"] {
            let e = parse(body);
            assert_eq!(
                (e.status, e.param.as_deref()),
                (StatusCode::BAD_REQUEST, None)
            );
            assert_eq!(e.message, "the request body must be a JSON object");
        }
    }

    /// Fields wick does not implement are refused by name, at any depth,
    /// rather than ignored.
    #[test]
    fn unsupported_fields_are_refused_by_name() {
        for (body, param) in [
            (json!({"suffix": "y"}), "suffix"),
            (json!({"best_of": 2}), "best_of"),
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (json!({"prompt_logprobs": 1}), "prompt_logprobs"),
            (json!({"guided_json": {"type": "object"}}), "guided_json"),
            (json!({"foo": {"bar": []}}), "foo"),
            (
                json!({"stream": true, "stream_options": {"usage_every": 2}}),
                "stream_options.usage_every",
            ),
        ] {
            assert_rejects(completion(with(json!({"prompt": "x"}), body)), param);
        }
        let call =
            json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}});
        for (body, param) in [
            (json!({"echo": true}), "echo"),
            (
                json!({"audio": {"voice": "alloy", "format": "wav"}}),
                "audio",
            ),
            (json!({"modalities": ["text", "audio"]}), "modalities"),
            (
                json!({"prediction": {"type": "embedding", "content": "x"}}),
                "prediction.type",
            ),
            (
                json!({"prediction": {"type": "content", "content": [{"type": "image_url"}]}}),
                "prediction.content[0].type",
            ),
            (
                json!({"prediction": {"type": "content", "content": "x", "extra": 1}}),
                "prediction.extra",
            ),
            (json!({"guided_regex": "a+"}), "guided_regex"),
            (
                json!({"functions": [{"name": "f", "cache": 1}]}),
                "functions[0].cache",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x", "weight": 1}]}),
                "messages[0].weight",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]}]}),
                "messages[0].content[0].cache_control",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [with(call.clone(), json!({"index": 0}))]}]}),
                "messages[0].tool_calls[0].index",
            ),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [
                    with(call.clone(), json!({"function": {"name": "f", "arguments": "{}", "strict": true}}))
                ]}]}),
                "messages[0].tool_calls[0].function.strict",
            ),
        ] {
            let e = assert_rejects(chat(with(user("x"), body)), param);
            assert!(
                matches!(
                    e.code.as_deref(),
                    Some("unsupported_parameter" | "unsupported_value")
                ) || param.ends_with(".type"),
                "{e:?}"
            );
        }
    }

    /// What changes no output is accepted; so is a null anywhere (not
    /// sent), `best_of` equal to `n`, text-only `modalities`, `tool_choice`
    /// none without tools, and a `response_format` of plain `text` (the
    /// default).
    #[test]
    fn a_prediction_is_tokenized_unless_output_is_constrained() {
        let plan = chat(with(
            user("x"),
            json!({"prediction": {"type": "content", "content": [
                {"type": "text", "text": "fn main() {}"}, {"type": "text", "text": "// end"}]}}),
        ))
        .unwrap();
        let want = ctx().tokenizer.encode("fn main() {}\n// end").unwrap();
        assert_eq!(plan.params.prediction, want);
        assert!(!want.is_empty());
        let refused = chat(with(
            user("x"),
            json!({"prediction": {"type": "content", "content": "x"},
                   "response_format": {"type": "json_object"}}),
        ));
        assert_rejects(refused, "prediction");
    }

    #[test]
    fn harmless_fields_are_accepted() {
        completion(json!({"prompt": "x", "best_of": 1, "user": "u", "suffix": null, "foo": null}))
            .unwrap();
        completion(json!({"prompt": "x", "best_of": 2, "n": 2})).unwrap();
        chat(with(
            user("x"),
            json!({"user": "u", "store": false, "metadata": {"run": "7"}, "service_tier": "auto",
                   "modalities": ["text"], "audio": null, "prediction": null,
                   "tool_choice": "none", "response_format": {"type": "text"},
                   "parallel_tool_calls": false}),
        ))
        .unwrap();
        chat(
            json!({"messages": [{"role": "assistant", "content": "a", "refusal": null},
                                 {"role": "user", "content": "b"}]}),
        )
        .unwrap();
    }
}
