//! `POST /v1/embeddings`: each input is prefilled through the same
//! scheduler as generation (batched with it, sampling nothing), and its
//! final hidden states are pooled (`--pooling`) into one L2-normalised
//! vector ([`crate::engine::pooling`]).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::engine::sequence::SeqId;
use crate::server::error::ApiError;
use crate::server::handlers::{ready, tokenizing};
use crate::server::http::json_body::JsonBody;
use crate::server::protocol::UnknownFields;
use crate::server::unsupported;
use crate::server::validation::{check_model, encode_prompt};
use crate::server::AppState;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub input: EmbeddingInput,
    /// `float` (default) or `base64`: little-endian f32 bytes, as OpenAI's.
    pub encoding_format: Option<String>,
    /// Shortened vectors (OpenAI's text-embedding-3): no model here is
    /// trained for them, so it is refused.
    pub dimensions: Option<u64>,
    /// OpenAI's end-user id: no effect on the output.
    pub user: Option<String>,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// What OpenAI takes as `input`: a text, texts, token ids, or lists of them.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingResponse {
    pub object: String,
    pub data: Vec<EmbeddingData>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingData {
    pub object: String,
    pub index: usize,
    /// A list of floats, or a base64 string.
    pub embedding: serde_json::Value,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

pub async fn embeddings(
    State(state): State<Arc<AppState>>,
    JsonBody(req): JsonBody<EmbeddingRequest>,
) -> Result<Json<EmbeddingResponse>, ApiError> {
    let model = ready(&state)?;
    unsupported::refuse(&req.unknown, "")?;
    check_model(req.model.as_deref(), &model.name, &model.aliases)?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("encoding_format must be \"float\" or \"base64\", got {other:?}"),
                Some("encoding_format"),
            ))
        }
    };
    if req.dimensions.is_some() {
        return Err(ApiError::bad_request(
            "this model does not support `dimensions`: its vectors have the model's hidden size",
            Some("dimensions"),
        ));
    }
    let inputs = match req.input {
        EmbeddingInput::Text(t) => vec![Ok(t)],
        EmbeddingInput::Texts(ts) => ts.into_iter().map(Ok).collect(),
        EmbeddingInput::Ids(ids) => vec![Err(ids)],
        EmbeddingInput::IdLists(lists) => lists.into_iter().map(Err).collect(),
    };
    if inputs.is_empty() || inputs.len() > model.max_choices {
        return Err(ApiError::bad_request(
            format!(
                "input must hold 1 to {} items, got {}",
                model.max_choices,
                inputs.len()
            ),
            Some("input"),
        ));
    }
    let prompts = tokenizing(&model, move |m| {
        inputs
            .into_iter()
            .map(|input| {
                let ids = match input {
                    Ok(text) => encode_prompt(&text, &m.context(), "input")?,
                    Err(ids) => ids,
                };
                match ids.is_empty() {
                    true => Err(ApiError::bad_request("an input is empty", Some("input"))),
                    false => Ok(ids),
                }
            })
            .collect::<Result<Vec<_>, ApiError>>()
    })
    .await??;
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let (ids, mut events) = model.engine.embed(prompts, model.pooling).await?;
    let unfinished = Unfinished {
        ids: ids.clone(),
        engine: model.engine.clone(),
    };
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; ids.len()];
    while vectors.iter().any(Option::is_none) {
        let Some(ev) = events.recv().await else {
            return Err(ApiError::internal("the engine stopped during the request"));
        };
        let index = position(&ids, ev.seq)?;
        match ev.embedding {
            Some(v) => vectors[index] = Some(v),
            None => {
                return Err(ApiError::internal(format!(
                    "input {index} ended without a vector ({:?})",
                    ev.finish
                )))
            }
        }
    }
    drop(unfinished.disarm());
    let data = vectors
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(index, v)| EmbeddingData {
            object: "embedding".into(),
            index,
            embedding: match base64 {
                true => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    base64::engine::general_purpose::STANDARD
                        .encode(bytes)
                        .into()
                }
                false => v.into(),
            },
        })
        .collect();
    Ok(Json(EmbeddingResponse {
        object: "list".into(),
        data,
        model: model.name.clone(),
        usage: EmbeddingUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    }))
}

fn position(ids: &[SeqId], seq: SeqId) -> Result<usize, ApiError> {
    ids.iter().position(|&id| id == seq).ok_or_else(|| {
        ApiError::internal(format!("an event for sequence {seq}, not this request's"))
    })
}

/// Aborts the request's sequences if it is dropped before they are done
/// (the client went away), so they stop using the batch.
struct Unfinished {
    ids: Vec<SeqId>,
    engine: crate::server::engine_loop::EngineHandle,
}

impl Unfinished {
    fn disarm(mut self) -> Self {
        self.ids.clear();
        self
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        for &id in &self.ids {
            self.engine.abort(id);
        }
    }
}
