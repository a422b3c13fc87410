//! The small endpoints (health, metrics, models, tokenize, detokenize) and
//! what every handler shares: the readiness check and validation off the
//! async runtime. Generation lives in `completions` and `chat`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::ApiError;
use super::json_body::JsonBody;
use super::protocol::*;
use super::validation::{GenerationPlan, ModelContext};
use super::{AppState, ModelState};

pub fn shutting_down() -> ApiError {
    ApiError::unavailable("the server is shutting down")
}

pub fn ready(state: &AppState) -> Result<Arc<ModelState>, ApiError> {
    if state.is_shutting_down() {
        return Err(shutting_down());
    }
    state
        .model
        .get()
        .cloned()
        .ok_or_else(|| ApiError::unavailable("the model is still loading"))
}

/// Validation tokenizes, so it runs on the blocking pool.
pub async fn plan<R: Send + 'static>(
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

/// One entry per served name, the main one first.
pub async fn models(State(state): State<Arc<AppState>>) -> Result<Json<ModelList>, ApiError> {
    let model = ready(&state)?;
    let names = std::iter::once(&model.name).chain(&model.aliases);
    Ok(Json(ModelList {
        object: "list".into(),
        data: names.map(|id| model_card(&state, &model, id)).collect(),
    }))
}

fn model_card(state: &AppState, model: &ModelState, id: &str) -> ModelCard {
    ModelCard {
        id: id.to_string(),
        object: "model".into(),
        created: state.created,
        owned_by: "wick".into(),
        max_model_len: model.max_context,
    }
}

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    JsonBody(req): JsonBody<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let model = ready(&state)?;
    let text = req.prompt.or(req.content).ok_or_else(|| {
        ApiError::bad_request("either `prompt` or `content` is required", Some("prompt"))
    })?;
    // vLLM's default: the tokenizer's special tokens (BOS) are added.
    let add_special = req.add_special_tokens.unwrap_or(true);
    let m = model.clone();
    let mut tokens = tokio::task::spawn_blocking(move || m.tokenizer.encode(&text))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::bad_request(format!("{e:#}"), Some("prompt")))?;
    if !add_special && model.tokenizer.add_bos() && !tokens.is_empty() {
        tokens.remove(0);
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
    crate::request_rules::check_token_ids(&req.tokens, model.vocab_size, "tokens")?;
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
