//! What every handler shares: the server's state ([`AppState`]), the
//! loaded model's ([`ModelState`]) and the per-request limits.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::media::fetch::{MediaAccess, NOTHING_FETCHED};
use crate::models::vision::ImageSpec;
use crate::sampling::constraint::ConstraintFactory;
use crate::server::engine_loop::EngineHandle;
use crate::server::images::ImageBudget;
use crate::server::metrics::Metrics;
use crate::server::validation::ModelContext;
use crate::text::chat_template::ChatTemplate;
use crate::text::tokenizer::Tokenizer;

/// Everything a handler needs once the model is loaded.
pub struct ModelState {
    /// What responses and metrics call the model: the first
    /// `--served-model-name`, else the loader's name for it.
    pub name: String,
    /// The other `--served-model-name`s, which requests may use too.
    pub aliases: Vec<String>,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// How prompts hold an image, where the model takes images.
    pub image_spec: Option<ImageSpec>,
    pub image_budget: ImageBudget,
    /// Where image URLs may be read from (`--allowed-media-domains`,
    /// `--allowed-local-media-path`).
    pub media_access: Arc<MediaAccess>,
    /// Requests fetching image URLs at once (`handlers::plan`).
    pub fetching: Arc<tokio::sync::Semaphore>,
    pub vocab_size: usize,
    /// The model's context, or `--max-model-len` below it.
    pub max_context: usize,
    /// Most tokens the KV pool holds for one sequence.
    pub max_seq_tokens: usize,
    /// Most sequences (prompts times n) one request may ask for: what the
    /// batch and the queue hold together.
    pub max_choices: usize,
    pub engine: EngineHandle,
    pub metrics: Arc<Metrics>,
    /// Compiles output grammars; `None` if this vocabulary could not be
    /// mapped to bytes (then constrained output is refused).
    pub constraints: Option<ConstraintFactory>,
    /// Validation and `/tokenize` (the work that tokenizes text and
    /// compiles grammars) run at most this many at once, one per core:
    /// more would only queue on the CPU while holding their memory.
    pub tokenizing: Arc<tokio::sync::Semaphore>,
    /// How `/v1/embeddings` pools hidden states (`--pooling`).
    pub pooling: crate::engine::pooling::Pooling,
}

impl ModelState {
    pub fn context(&self) -> ModelContext<'_> {
        ModelContext {
            name: &self.name,
            aliases: &self.aliases,
            vocab_size: self.vocab_size,
            max_context: self.max_context,
            max_seq_tokens: self.max_seq_tokens,
            max_choices: self.max_choices,
            tokenizer: &self.tokenizer,
            chat_template: self.chat_template.as_ref(),
            constraints: self.constraints.as_ref(),
            images: self.image_spec.as_ref(),
            image_budget: self.image_budget,
            fetched: &NOTHING_FETCHED,
        }
    }
}

pub struct AppState {
    /// Set once the model has loaded.
    pub model: OnceLock<Arc<ModelState>>,
    pub metrics: Arc<Metrics>,
    pub created: u64,
    /// Becomes true on SIGINT/SIGTERM.
    pub shutting_down: watch::Sender<bool>,
    pub limits: RequestLimits,
}

impl AppState {
    pub fn is_shutting_down(&self) -> bool {
        *self.shutting_down.borrow()
    }
}

/// The per-request limits handlers enforce.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    pub max_body_bytes: usize,
    /// Longest wait for a whole request body.
    pub client_timeout: Duration,
    /// Longest a generation may run.
    pub request_timeout: Option<Duration>,
    pub sse_keep_alive: Duration,
}
