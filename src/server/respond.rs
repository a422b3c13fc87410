//! Turns a running generation into an endpoint's answer, for every API
//! alike. Each choice's deltas are read by its [`ReplyParser`]; the API's
//! [`Render`] only shapes the parser's events into its own. A stream sends
//! those events as SSE as they come; a whole response is the very same
//! events folded together, so the two cannot drift apart.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};

use crate::server::error::ApiError;
use crate::server::generation::Generation;
use crate::server::protocol::Usage;
use crate::server::reply::{token_text, ReplyParser, ReplyStep};
use crate::server::validation::GenerationPlan;

/// One API's shape of a reply.
pub trait Render: Send + 'static {
    /// One event of the reply as the API streams it.
    type Event: Send + 'static;
    /// A whole response in the making.
    type Whole: Send;
    /// A stream ends with `data: [DONE]` (OpenAI's chunk streams).
    const DONE: bool;

    /// The events that open the reply, before any delta.
    fn open(&mut self) -> Vec<Self::Event> {
        Vec::new()
    }
    /// The events of one step of choice `choice`; `usage` tells the usage
    /// so far, for the APIs that show it mid-reply.
    fn step(
        &mut self,
        choice: usize,
        step: ReplyStep,
        usage: &dyn Fn() -> Usage,
    ) -> Vec<Self::Event>;
    /// The events that end a reply that went well. What must happen before
    /// the client hears the reply is over happens here.
    fn finish(&mut self, usage: Usage) -> Vec<Self::Event>;
    /// What a stream sends when the request fails once started.
    fn fail(&mut self, e: &ApiError) -> Vec<Event>;
    fn sse(&self, event: &Self::Event) -> Event;
    /// A whole response of `choices` choices before any event is folded in.
    fn whole(&self, choices: usize) -> Self::Whole;
    fn fold(&self, whole: &mut Self::Whole, event: Self::Event);
    fn answer(&self, whole: Self::Whole) -> Response;
}

/// Streams over SSE or answers whole, as `plan` asks. A client that goes
/// away drops the stream, and with it the generation, which aborts its
/// sequences.
pub async fn respond<R: Render>(
    mut g: Generation,
    plan: &GenerationPlan,
    mut r: R,
    keep_alive: Duration,
) -> Result<Response, ApiError> {
    let text = token_text(g.model().clone());
    let mut parsers: Vec<ReplyParser> = (0..g.num_choices())
        .map(|_| ReplyParser::new(plan, text.clone()))
        .collect();
    if plan.stream {
        let events = async_stream::stream! {
            for ev in r.open() {
                yield r.sse(&ev);
            }
            loop {
                match g.next().await {
                    Some(Ok((i, delta))) => {
                        let step = parsers[i].push(delta);
                        for ev in r.step(i, step, &|| g.usage()) {
                            yield r.sse(&ev);
                        }
                    }
                    Some(Err(e)) => {
                        for ev in r.fail(&e) {
                            yield ev;
                        }
                        break;
                    }
                    None => {
                        for ev in r.finish(g.usage()) {
                            yield r.sse(&ev);
                        }
                        break;
                    }
                }
            }
            if R::DONE {
                yield Event::default().data("[DONE]");
            }
        };
        let events = futures::StreamExt::map(events, Ok::<_, Infallible>);
        let keep_alive = KeepAlive::new().interval(keep_alive);
        return Ok(Sse::new(events).keep_alive(keep_alive).into_response());
    }
    let mut whole = r.whole(g.num_choices());
    for ev in r.open() {
        r.fold(&mut whole, ev);
    }
    while let Some(next) = g.next().await {
        let (i, delta) = next?;
        let step = parsers[i].push(delta);
        for ev in r.step(i, step, &|| g.usage()) {
            r.fold(&mut whole, ev);
        }
    }
    for ev in r.finish(g.usage()) {
        r.fold(&mut whole, ev);
    }
    Ok(r.answer(whole))
}
