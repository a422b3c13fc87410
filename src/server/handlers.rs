//! axum handlers: parse and validate (tokenizing off the async runtime),
//! submit to the scheduler, and shape the answer as OpenAI does, streamed
//! over SSE or whole.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::Stream;

use super::choice::{Delta, TokenLogprob};
use super::error::ApiError;
use super::generation::Generation;
use super::protocol::*;
use super::validation::{
    parse_json, validate_chat, validate_completion, GenerationPlan, ModelContext,
};
use super::{AppState, ModelState};

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn request_id(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{nanos:x}")
}

fn body_bytes(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::payload_too_large(state.max_body_bytes),
        _ => ApiError::bad_request(e.body_text(), None),
    })
}

fn ready(state: &AppState) -> Result<Arc<ModelState>, ApiError> {
    if state
        .shutting_down
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    state
        .model
        .get()
        .cloned()
        .ok_or_else(|| ApiError::unavailable("the model is still loading"))
}

/// Validation tokenizes, so it runs on the blocking pool.
async fn plan<R: Send + 'static>(
    model: &Arc<ModelState>,
    req: R,
    validate: fn(&R, &ModelContext) -> Result<GenerationPlan, ApiError>,
) -> Result<GenerationPlan, ApiError> {
    let model = model.clone();
    tokio::task::spawn_blocking(move || validate(&req, &model.context()))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
}

pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    match ready(&state) {
        Ok(_) => (StatusCode::OK, "ok").into_response(),
        Err(e) => e.into_response(),
    }
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        state.metrics.render(),
    )
        .into_response()
}

pub async fn models(State(state): State<Arc<AppState>>) -> Result<Json<ModelList>, ApiError> {
    let model = ready(&state)?;
    Ok(Json(ModelList {
        object: "list".into(),
        data: vec![ModelCard {
            id: model.name.clone(),
            object: "model".into(),
            created: state.created,
            owned_by: "wick".into(),
            max_model_len: model.max_context,
        }],
    }))
}

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let model = ready(&state)?;
    let req: TokenizeRequest = parse_json(&body_bytes(&state, body)?)?;
    let text = req.prompt.or(req.content).ok_or_else(|| {
        ApiError::bad_request("either `prompt` or `content` is required", Some("prompt"))
    })?;
    let m = model.clone();
    let tokens = tokio::task::spawn_blocking(move || m.tokenizer.encode(&text))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::bad_request(format!("{e:#}"), Some("prompt")))?;
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        tokens,
        max_model_len: model.max_context,
    }))
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let model = ready(&state)?;
    let req: DetokenizeRequest = parse_json(&body_bytes(&state, body)?)?;
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= model.vocab_size) {
        return Err(ApiError::bad_request(
            format!(
                "token id {bad} is outside the vocabulary (size {})",
                model.vocab_size
            ),
            Some("tokens"),
        ));
    }
    let text = model
        .tokenizer
        .decode(&req.tokens)
        .map_err(|e| ApiError::internal(format!("{e:#}")))?;
    Ok(Json(DetokenizeResponse {
        prompt: text.clone(),
        content: text,
    }))
}

fn usage(g: &Generation) -> Usage {
    let completion = g.completion_tokens();
    Usage {
        prompt_tokens: g.prompt_tokens,
        completion_tokens: completion,
        total_tokens: g.prompt_tokens + completion,
    }
}

/// The echoed prompt's logprobs: its first token (nothing to score it on,
/// so null, as OpenAI and vLLM report it) and the scored rest, offsets from 0.
fn echo_logprobs(first_token: String, scored: &[TokenLogprob]) -> CompletionLogprobs {
    let offset = first_token.chars().count();
    let mut out = CompletionLogprobs {
        tokens: vec![first_token],
        token_logprobs: vec![None],
        top_logprobs: vec![None],
        text_offset: vec![0],
    };
    out.append(completion_logprobs(scored, offset));
    out
}

/// Completions' logprobs for one delta; `offset` is the text length before it.
fn completion_logprobs(lps: &[TokenLogprob], mut offset: usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for lp in lps {
        out.tokens.push(lp.token.clone());
        out.token_logprobs.push(Some(lp.logprob));
        out.top_logprobs
            .push(Some(lp.top.iter().cloned().collect::<HashMap<_, _>>()));
        out.text_offset.push(offset);
        offset += lp.token.chars().count();
    }
    out
}

fn chat_logprobs(lps: &[TokenLogprob]) -> ChatLogprobs {
    ChatLogprobs {
        content: lps
            .iter()
            .map(|lp| ChatTokenLogprob {
                token: lp.token.clone(),
                logprob: lp.logprob,
                bytes: lp.token.as_bytes().to_vec(),
                top_logprobs: lp
                    .top
                    .iter()
                    .map(|(t, l)| TopLogprob {
                        token: t.clone(),
                        logprob: *l,
                        bytes: t.as_bytes().to_vec(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn sse_json<T: serde::Serialize>(value: &T) -> Event {
    Event::default().data(serde_json::to_string(value).unwrap_or_default())
}

/// Turns a running generation into SSE events: `chunk` shapes one delta,
/// `usage` the final usage chunk; errors after the start become an error
/// event; the stream always ends with `[DONE]`.
fn sse_stream<F, U>(
    mut g: Generation,
    chunk: F,
    usage_chunk: Option<U>,
) -> impl Stream<Item = Result<Event, Infallible>>
where
    F: Fn(usize, Delta, &Generation) -> Vec<Event> + Send + 'static,
    U: Fn(&Generation) -> Event + Send + 'static,
{
    async_stream(move |tx| async move {
        loop {
            match g.next().await {
                Some(Ok((i, delta))) => {
                    for ev in chunk(i, delta, &g) {
                        if tx.send(ev).await.is_err() {
                            return;
                        }
                    }
                }
                Some(Err(e)) => {
                    let _ = tx.send(Event::default().data(e.sse_data())).await;
                    break;
                }
                None => {
                    if let Some(u) = &usage_chunk {
                        let _ = tx.send(u(&g)).await;
                    }
                    break;
                }
            }
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
    })
}

/// A stream fed by a task; dropping the stream (client gone) drops the
/// receiver, so the task's next send fails and it drops the generation,
/// which aborts the sequences.
fn async_stream<F, Fut>(f: F) -> impl Stream<Item = Result<Event, Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Event>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(f(tx));
    futures::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok)
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let req: CompletionRequest = parse_json(&body_bytes(&state, body)?)?;
    let model = ready(&state)?;
    let plan = plan(&model, req, validate_completion).await?;
    let mut g = Generation::start(model.clone(), &plan, start).await?;
    let (id, created, name) = (request_id("cmpl"), now_secs(), model.name.clone());
    let echo: Vec<String> = if plan.echo {
        (0..g.num_choices())
            .map(|i| plan.prompt_texts[i / plan.n].clone())
            .collect()
    } else {
        vec![String::new(); g.num_choices()]
    };
    // Per choice, the echoed prompt's first token until its logprobs go out.
    let mut echo_first: Vec<Option<String>> = (0..g.num_choices())
        .map(|i| {
            let first = plan.prompts[i / plan.n].first()?;
            (plan.echo && plan.logprobs.is_some())
                .then(|| model.tokenizer.decode(&[*first]).unwrap_or_default())
        })
        .collect();
    let response = move |choices: Vec<CompletionChoice>, usage: Option<Usage>| CompletionResponse {
        id: id.clone(),
        object: "text_completion".into(),
        created,
        model: name.clone(),
        choices,
        usage,
    };
    if plan.stream {
        let mut offsets: Vec<usize> = echo.iter().map(|e| e.chars().count()).collect();
        let mut echoed = vec![false; g.num_choices()];
        let r = response.clone();
        let chunk = move |i: usize, d: Delta, _: &Generation| {
            let mut text = String::new();
            if !std::mem::replace(&mut echoed[i], true) {
                text.push_str(&echo[i]);
            }
            text.push_str(&d.text);
            let logprobs = plan.logprobs.map(|_| {
                let mut lp = match echo_first[i].take() {
                    Some(first) => echo_logprobs(first, &d.prompt_logprobs),
                    None => CompletionLogprobs::default(),
                };
                lp.append(completion_logprobs(&d.logprobs, offsets[i]));
                lp
            });
            offsets[i] += d.text.chars().count();
            vec![sse_json(&r(
                vec![CompletionChoice {
                    index: i,
                    text,
                    logprobs,
                    finish_reason: d.finish.map(str::to_string),
                }],
                None,
            ))]
        };
        let chunk = std::sync::Mutex::new(chunk);
        let usage_chunk = plan
            .include_usage
            .then_some(move |g: &Generation| sse_json(&response(vec![], Some(usage(g)))));
        let stream = sse_stream(
            g,
            move |i, d, g| (chunk.lock().expect("chunk state"))(i, d, g),
            usage_chunk,
        );
        return Ok(Sse::new(stream).into_response());
    }
    let mut choices: Vec<CompletionChoice> = echo
        .iter()
        .enumerate()
        .map(|(i, e)| CompletionChoice {
            index: i,
            text: e.clone(),
            logprobs: plan.logprobs.map(|_| CompletionLogprobs::default()),
            finish_reason: None,
        })
        .collect();
    while let Some(item) = g.next().await {
        let (i, d) = item?;
        let c = &mut choices[i];
        if let Some(lp) = &mut c.logprobs {
            if let Some(first) = echo_first[i].take() {
                lp.append(echo_logprobs(first, &d.prompt_logprobs));
            }
            lp.append(completion_logprobs(&d.logprobs, c.text.chars().count()));
        }
        c.text.push_str(&d.text);
        if let Some(f) = d.finish {
            c.finish_reason = Some(f.to_string());
        }
    }
    let u = usage(&g);
    Ok(Json(response(choices, Some(u))).into_response())
}

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let req: ChatCompletionRequest = parse_json(&body_bytes(&state, body)?)?;
    let model = ready(&state)?;
    let plan = plan(&model, req, validate_chat).await?;
    let mut g = Generation::start(model.clone(), &plan, start).await?;
    let (id, created, name) = (request_id("chatcmpl"), now_secs(), model.name.clone());
    if plan.stream {
        let chunk_of = {
            let (id, name) = (id.clone(), name.clone());
            move |choices: Vec<ChunkChoice>, usage: Option<Usage>| ChatCompletionChunk {
                id: id.clone(),
                object: "chat.completion.chunk".into(),
                created,
                model: name.clone(),
                choices,
                usage,
            }
        };
        let mut started = vec![false; g.num_choices()];
        let want_logprobs = plan.logprobs.is_some();
        let c = chunk_of.clone();
        let chunk = move |i: usize, d: Delta, _: &Generation| {
            let mut events = Vec::new();
            // The first delta of each choice carries the role, as OpenAI sends it.
            if !std::mem::replace(&mut started[i], true) {
                events.push(sse_json(&c(
                    vec![ChunkChoice {
                        index: i,
                        delta: ChatDelta {
                            role: Some("assistant".into()),
                            content: Some(String::new()),
                        },
                        logprobs: None,
                        finish_reason: None,
                    }],
                    None,
                )));
            }
            if !d.text.is_empty() || !d.logprobs.is_empty() {
                events.push(sse_json(&c(
                    vec![ChunkChoice {
                        index: i,
                        delta: ChatDelta {
                            role: None,
                            content: Some(d.text.clone()),
                        },
                        logprobs: want_logprobs.then(|| chat_logprobs(&d.logprobs)),
                        finish_reason: None,
                    }],
                    None,
                )));
            }
            if let Some(f) = d.finish {
                events.push(sse_json(&c(
                    vec![ChunkChoice {
                        index: i,
                        delta: ChatDelta::default(),
                        logprobs: None,
                        finish_reason: Some(f.to_string()),
                    }],
                    None,
                )));
            }
            events
        };
        let chunk = std::sync::Mutex::new(chunk);
        let usage_chunk = plan
            .include_usage
            .then_some(move |g: &Generation| sse_json(&chunk_of(vec![], Some(usage(g)))));
        let stream = sse_stream(
            g,
            move |i, d, g| (chunk.lock().expect("chunk state"))(i, d, g),
            usage_chunk,
        );
        return Ok(Sse::new(stream).into_response());
    }
    let mut texts = vec![String::new(); g.num_choices()];
    let mut lps: Vec<Vec<TokenLogprob>> = vec![Vec::new(); g.num_choices()];
    let mut finish = vec![None; g.num_choices()];
    while let Some(item) = g.next().await {
        let (i, d) = item?;
        texts[i].push_str(&d.text);
        lps[i].extend(d.logprobs);
        if let Some(f) = d.finish {
            finish[i] = Some(f.to_string());
        }
    }
    let choices = texts
        .into_iter()
        .zip(lps)
        .zip(finish)
        .enumerate()
        .map(|(i, ((text, lp), finish_reason))| ChatChoice {
            index: i,
            message: ResponseMessage {
                role: "assistant".into(),
                content: text,
            },
            logprobs: plan.logprobs.map(|_| chat_logprobs(&lp)),
            finish_reason,
        })
        .collect();
    let u = usage(&g);
    Ok(Json(ChatCompletionResponse {
        id,
        object: "chat.completion".into(),
        created,
        model: name,
        choices,
        usage: Some(u),
    })
    .into_response())
}

pub async fn not_found() -> ApiError {
    ApiError::not_found()
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}
