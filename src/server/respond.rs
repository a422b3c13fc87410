//! Turns a running generation into an endpoint's answer. Each endpoint has
//! one [`OutputBuilder`] that shapes deltas into stream chunks; a stream
//! sends those chunks as they come, and a whole response is the very same
//! chunks merged into its choices, so the two cannot drift apart.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::engine::output::Delta;
use crate::server::error::ApiError;
use crate::server::generation::Generation;
use crate::server::protocol::{self, Usage};

pub trait OutputBuilder: Send + 'static {
    /// A choice as one stream chunk carries it.
    type Chunk: Serialize + Send + 'static;
    /// A choice of the whole response.
    type Choice: Serialize;
    /// `object` of a stream chunk.
    const CHUNK_OBJECT: &'static str;
    /// `object` of the whole response.
    const OBJECT: &'static str;

    /// The chunks one delta of choice `choice` streams as.
    fn chunks(&mut self, choice: usize, delta: Delta) -> Vec<Self::Chunk>;
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
    /// vLLM's `continuous_usage_stats`: every chunk carries the usage so far.
    pub continuous_usage: bool,
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
            continuous_usage: false,
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

pub struct StreamShape {
    pub stream: bool,
    pub include_usage: bool,
    /// How often an idle stream sends an SSE comment, so proxies keep it open.
    pub keep_alive: Duration,
}

fn sse_json<T: Serialize>(value: &T) -> Event {
    Event::default().data(serde_json::to_string(value).unwrap_or_default())
}

/// Streams over SSE or answers whole. A stream ends with `[DONE]`, after an
/// error event if the request failed once started; a client that goes away
/// drops the stream, and with it the generation, which aborts its sequences.
pub async fn respond<B: OutputBuilder>(
    mut g: Generation,
    mut builder: B,
    env: Envelope,
    shape: StreamShape,
) -> Result<Response, ApiError> {
    if shape.stream {
        let events = async_stream::stream! {
            loop {
                match g.next().await {
                    Some(Ok((i, delta))) => {
                        let usage = env.continuous_usage.then(|| g.usage());
                        for chunk in builder.chunks(i, delta) {
                            yield sse_json(&env.wrap(B::CHUNK_OBJECT, vec![chunk], usage));
                        }
                    }
                    Some(Err(e)) => {
                        yield Event::default().data(e.sse_data());
                        break;
                    }
                    None => {
                        if shape.include_usage {
                            let usage = Some(g.usage());
                            yield sse_json(&env.wrap::<B::Chunk>(B::CHUNK_OBJECT, vec![], usage));
                        }
                        break;
                    }
                }
            }
            yield Event::default().data("[DONE]");
        };
        let events = futures::StreamExt::map(events, Ok::<_, Infallible>);
        let keep_alive = KeepAlive::new().interval(shape.keep_alive);
        return Ok(Sse::new(events).keep_alive(keep_alive).into_response());
    }
    let mut choices: Vec<B::Choice> = (0..g.num_choices())
        .map(|i| builder.empty_choice(i))
        .collect();
    while let Some(next) = g.next().await {
        let (i, delta) = next?;
        for chunk in builder.chunks(i, delta) {
            let at = B::chunk_index(&chunk);
            B::merge(&mut choices[at], chunk);
        }
    }
    let usage = Some(g.usage());
    Ok(Json(env.wrap(B::OBJECT, choices, usage)).into_response())
}
