//! The chunk streams of chat and completions: each choice's events shaped
//! into choice chunks by the endpoint's [`OutputBuilder`], each chunk
//! wrapped in the envelope every chunk and response of a request shares;
//! the stream ends with `[DONE]`, and a whole response is the same chunks
//! merged into its choices.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::server::error::ApiError;
use crate::server::protocol::{self, Usage};
use crate::server::reply::ReplyStep;
use crate::server::respond::Render;
use crate::server::validation::GenerationPlan;

pub trait OutputBuilder: Send + 'static {
    /// A choice as one stream chunk carries it.
    type Chunk: Serialize + Send + 'static;
    /// A choice of the whole response.
    type Choice: Serialize + Send;
    /// `object` of a stream chunk.
    const CHUNK_OBJECT: &'static str;
    /// `object` of the whole response.
    const OBJECT: &'static str;

    /// The chunks one step of choice `choice` streams as.
    fn chunks(&mut self, choice: usize, step: ReplyStep) -> Vec<Self::Chunk>;
    /// Choice `index` of the whole response before any chunk is merged in.
    fn empty_choice(&self, index: usize) -> Self::Choice;
    fn chunk_index(chunk: &Self::Chunk) -> usize;
    fn merge(choice: &mut Self::Choice, chunk: Self::Chunk);
}

/// The fields every chunk and response of one request shares.
pub struct Envelope {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Envelope {
    pub fn new(id: String, model: &str) -> Self {
        Envelope {
            id,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            model: model.to_string(),
        }
    }

    fn wrap<C>(
        &self,
        object: &str,
        choices: Vec<C>,
        usage: Option<Usage>,
    ) -> protocol::Response<C> {
        protocol::Response {
            id: self.id.clone(),
            object: object.to_string(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }
}

/// An endpoint's builder in its envelope: the [`Render`] of chat and
/// completions.
pub struct Chunks<B> {
    builder: B,
    env: Envelope,
    /// vLLM's `continuous_usage_stats`: every chunk carries the usage so far.
    continuous_usage: bool,
    /// A last chunk, without choices, carries the usage: when a stream
    /// asks for it (`include_usage`), and always for a whole response,
    /// whose usage it is.
    usage_chunk: bool,
}

impl<B: OutputBuilder> Chunks<B> {
    pub fn new(builder: B, env: Envelope, plan: &GenerationPlan) -> Self {
        Chunks {
            builder,
            env,
            continuous_usage: plan.continuous_usage,
            usage_chunk: plan.include_usage || !plan.stream,
        }
    }
}

impl<B: OutputBuilder> Render for Chunks<B> {
    type Event = protocol::Response<B::Chunk>;
    type Whole = protocol::Response<B::Choice>;
    const DONE: bool = true;

    fn step(
        &mut self,
        choice: usize,
        step: ReplyStep,
        usage: &dyn Fn() -> Usage,
    ) -> Vec<Self::Event> {
        let usage = self.continuous_usage.then(usage);
        let chunks = self.builder.chunks(choice, step);
        chunks
            .into_iter()
            .map(|c| self.env.wrap(B::CHUNK_OBJECT, vec![c], usage))
            .collect()
    }

    fn finish(&mut self, usage: Usage) -> Vec<Self::Event> {
        match self.usage_chunk {
            true => vec![self.env.wrap(B::CHUNK_OBJECT, vec![], Some(usage))],
            false => Vec::new(),
        }
    }

    fn fail(&mut self, e: &ApiError) -> Vec<Event> {
        vec![Event::default().data(e.sse_data())]
    }

    fn sse(&self, event: &Self::Event) -> Event {
        Event::default().data(serde_json::to_string(event).unwrap_or_default())
    }

    fn whole(&self, choices: usize) -> Self::Whole {
        let choices = (0..choices).map(|i| self.builder.empty_choice(i));
        self.env.wrap(B::OBJECT, choices.collect(), None)
    }

    fn fold(&self, whole: &mut Self::Whole, event: Self::Event) {
        for chunk in event.choices {
            let at = B::chunk_index(&chunk);
            B::merge(&mut whole.choices[at], chunk);
        }
        if event.usage.is_some() {
            whole.usage = event.usage;
        }
    }

    fn answer(&self, whole: Self::Whole) -> Response {
        Json(whole).into_response()
    }
}
