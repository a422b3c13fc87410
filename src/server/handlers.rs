//! The small endpoints (health, metrics, models, tokenizer info, tokenize,
//! detokenize) and
//! what every handler shares: the readiness check and validation off the
//! async runtime. Generation lives in `completions` and `chat`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::media::fetch::Fetched;
use crate::server::error::ApiError;
use crate::server::http::json_body::JsonBody;
use crate::server::images::ImageSources;
use crate::server::protocol::*;
use crate::server::unsupported;
use crate::server::validation::{check_model, GenerationPlan, ModelContext};
use crate::server::AppState;
use crate::server::ModelState;

pub fn ready(state: &AppState) -> Result<Arc<ModelState>, ApiError> {
    if state.is_shutting_down() {
        return Err(ApiError::shutting_down());
    }
    state.model.get().cloned().ok_or_else(ApiError::loading)
}

/// Runs tokenizing work on the blocking pool, once one of the model's
/// permits for it is free.
pub(super) async fn tokenizing<T: Send + 'static>(
    model: &Arc<ModelState>,
    work: impl FnOnce(&ModelState) -> T + Send + 'static,
) -> Result<T, ApiError> {
    let permit = model
        .tokenizing
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let model = model.clone();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work(&model)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))
}

/// Validation tokenizes and compiles grammars, once the request's image
/// URLs are fetched.
pub async fn plan<R: ImageSources + Send + 'static>(
    model: &Arc<ModelState>,
    req: R,
    validate: fn(&R, &ModelContext) -> Result<GenerationPlan, ApiError>,
) -> Result<GenerationPlan, ApiError> {
    let fetched = prefetch(model, &req).await?;
    tokenizing(model, move |m| {
        let ctx = ModelContext {
            fetched: &fetched,
            ..m.context()
        };
        validate(&req, &ctx)
    })
    .await?
}

/// Fetches the request's image URLs that are not `data:` URLs, as far as
/// the server allows, off the async runtime and at most
/// [`ModelState::fetching`] requests at once. Nothing is fetched for a
/// request that validation refuses before reading images (too many, or a
/// model that takes none).
async fn prefetch(model: &Arc<ModelState>, req: &impl ImageSources) -> Result<Fetched, ApiError> {
    let urls = req.image_urls();
    let mut remote: Vec<String> = urls
        .iter()
        .filter(|u| !u.starts_with("data:"))
        .map(|u| u.to_string())
        .collect();
    let refused_first = model.image_spec.is_none() || urls.len() > model.image_budget.max_images;
    if remote.is_empty() || refused_first {
        return Ok(Fetched::new());
    }
    remote.sort_unstable();
    remote.dedup();
    let permit = model
        .fetching
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let access = model.media_access.clone();
    let max_bytes = model.image_budget.each.max_bytes;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        access.fetch_all(&remote, max_bytes)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))
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

/// One entry per served name, the main one first.
pub async fn models(State(state): State<Arc<AppState>>) -> Result<Json<ModelList>, ApiError> {
    let model = ready(&state)?;
    let names = std::iter::once(&model.name).chain(&model.aliases);
    Ok(Json(ModelList {
        object: "list".into(),
        data: names.map(|id| model_card(&state, &model, id)).collect(),
    }))
}

/// `GET /v1/models/{id}`: the card of one served name, or 404 as OpenAI
/// answers for a model it does not have.
pub async fn model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    let model = ready(&state)?;
    check_model(Some(&id), &model.name, &model.aliases)?;
    Ok(Json(model_card(&state, &model, &id)))
}

fn model_card(state: &AppState, model: &ModelState, id: &str) -> ModelCard {
    ModelCard {
        id: id.to_string(),
        object: "model".into(),
        created: state.created,
        owned_by: "wick".into(),
        max_model_len: model.max_context,
        input_modalities: match model.image_spec {
            Some(_) => vec!["text".into(), "image".into()],
            None => vec!["text".into()],
        },
    }
}

/// transformers' name for a tokenizer built from a `tokenizer.json`, which
/// is what wick's tokenizer is for every model it loads.
const TOKENIZER_CLASS: &str = "PreTrainedTokenizerFast";

pub async fn tokenizer_info(
    State(state): State<Arc<AppState>>,
) -> Result<Json<TokenizerInfo>, ApiError> {
    let model = ready(&state)?;
    let tok = &model.tokenizer;
    let text = |id: Option<u32>| id.and_then(|id| tok.id_to_token(id));
    let added_tokens_decoder = tok
        .inner()
        .get_added_tokens_decoder()
        .into_iter()
        .map(|(id, t)| {
            let info = AddedTokenInfo {
                content: t.content,
                lstrip: t.lstrip,
                normalized: t.normalized,
                rstrip: t.rstrip,
                single_word: t.single_word,
                special: t.special,
            };
            (id, info)
        })
        .collect();
    Ok(Json(TokenizerInfo {
        tokenizer_class: TOKENIZER_CLASS.into(),
        bos_token: text(tok.bos_id()),
        eos_token: text(tok.eos_ids().first().copied()),
        pad_token: text(tok.pad_id()),
        unk_token: text(tok.unk_id()),
        add_bos_token: tok.add_bos(),
        add_eos_token: false,
        model_max_length: model.max_context,
        clean_up_tokenization_spaces: false,
        added_tokens_decoder,
        chat_template: model.chat_template.as_ref().map(|t| t.source().to_string()),
    }))
}

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    JsonBody(req): JsonBody<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let model = ready(&state)?;
    unsupported::refuse(&req.unknown, "")?;
    check_model(req.model.as_deref(), &model.name, &model.aliases)?;
    let text = req.prompt.or(req.content).ok_or_else(|| {
        ApiError::bad_request("either `prompt` or `content` is required", Some("prompt"))
    })?;
    // vLLM's default: the tokenizer's special tokens (BOS) are added.
    let add_special = req.add_special_tokens.unwrap_or(true);
    let mut tokens = tokenizing(&model, move |m| {
        crate::server::validation::encode(&text, &m.context(), "prompt")
    })
    .await??;
    if !add_special {
        if model.tokenizer.add_bos() && !tokens.is_empty() {
            tokens.remove(0);
        }
        if model.tokenizer.add_eos() {
            tokens.pop();
        }
    }
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        tokens,
        max_model_len: model.max_context,
    }))
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    JsonBody(req): JsonBody<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let model = ready(&state)?;
    unsupported::refuse(&req.unknown, "")?;
    check_model(req.model.as_deref(), &model.name, &model.aliases)?;
    crate::engine::request_rules::check_token_ids(&req.tokens, model.vocab_size, "tokens")?;
    let text = model
        .tokenizer
        .decode(&req.tokens)
        .map_err(|e| ApiError::internal(format!("{e:#}")))?;
    Ok(Json(DetokenizeResponse {
        prompt: text.clone(),
        content: text,
    }))
}

pub async fn not_found() -> ApiError {
    ApiError::not_found()
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}
