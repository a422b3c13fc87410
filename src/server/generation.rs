//! A running request on the handler side: its choices submitted to the
//! scheduler, their events merged into one stream of text deltas, latency
//! metrics recorded, and every unfinished sequence aborted if the request is
//! dropped (the client went away).

use std::time::Instant;

use futures::stream::{SelectAll, StreamExt};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::choice::{ChoiceOutput, Delta};
use super::error::ApiError;
use super::validation::GenerationPlan;
use super::ModelState;
use crate::engine::StepEvent;
use crate::sequence::SeqId;

type Events = futures::stream::Map<
    UnboundedReceiverStream<StepEvent>,
    Box<dyn FnMut(StepEvent) -> (usize, StepEvent) + Send>,
>;

pub struct Generation {
    model: std::sync::Arc<ModelState>,
    events: SelectAll<Events>,
    /// Per choice: its sequence id, output state and last token time.
    ids: Vec<SeqId>,
    pub outputs: Vec<ChoiceOutput>,
    last_token: Vec<Option<Instant>>,
    start: Instant,
    pub prompt_tokens: usize,
}

impl Generation {
    /// Submits `plan.n` choices per prompt; choice `p * n + j` is the j-th
    /// sample of prompt p. Fails before anything streams if any is refused.
    pub async fn start(
        model: std::sync::Arc<ModelState>,
        plan: &GenerationPlan,
        start: Instant,
    ) -> Result<Self, ApiError> {
        let mut g = Generation {
            model: model.clone(),
            events: SelectAll::new(),
            ids: Vec::new(),
            outputs: Vec::new(),
            last_token: Vec::new(),
            start,
            prompt_tokens: plan.prompts.iter().map(Vec::len).sum(),
        };
        for prompt in &plan.prompts {
            for j in 0..plan.n {
                let mut params = plan.params.clone();
                // n samples of one seeded request differ from each other but stay reproducible.
                params.seed = params.seed.map(|s| s.wrapping_add(j as u64));
                let stops = params.stop.clone();
                // On error `g` drops here and aborts the choices already submitted.
                let (id, rx) = model.engine.add(prompt.clone(), params).await?;
                let index = g.ids.len();
                g.ids.push(id);
                g.outputs
                    .push(ChoiceOutput::new(stops, plan.logprobs.is_some()));
                g.last_token.push(None);
                let tag: Box<dyn FnMut(StepEvent) -> (usize, StepEvent) + Send> =
                    Box::new(move |ev| (index, ev));
                g.events.push(UnboundedReceiverStream::new(rx).map(tag));
            }
        }
        Ok(g)
    }

    pub fn num_choices(&self) -> usize {
        self.ids.len()
    }

    pub fn completion_tokens(&self) -> usize {
        self.outputs.iter().map(|o| o.completion_tokens).sum()
    }

    /// The next delta of any choice; `None` once every choice finished.
    pub async fn next(&mut self) -> Option<Result<(usize, Delta), ApiError>> {
        loop {
            let (i, ev) = match self.events.next().await {
                Some(x) => x,
                None => {
                    if self.outputs.iter().all(|o| o.finished) {
                        return None;
                    }
                    return Some(Err(ApiError::internal("the engine dropped a request")));
                }
            };
            let now = Instant::now();
            if ev.token.is_some() {
                let m = &self.model.metrics;
                match self.last_token[i] {
                    None => m.observe_ttft(now.duration_since(self.start).as_secs_f64()),
                    Some(t) => m.observe_inter_token(now.duration_since(t).as_secs_f64()),
                }
                self.last_token[i] = Some(now);
            }
            let delta = match self.outputs[i].on_event(&self.model.tokenizer, ev) {
                Ok(d) => d,
                Err(e) => return Some(Err(e)),
            };
            if delta.stopped_by_string {
                self.model.engine.abort(self.ids[i]);
                self.model.metrics.request_finished("stop");
            }
            if delta.finish.is_some() {
                self.model
                    .metrics
                    .observe_e2e(now.duration_since(self.start).as_secs_f64());
            }
            if delta.text.is_empty()
                && delta.finish.is_none()
                && delta.logprobs.is_empty()
                && delta.prompt_logprobs.is_empty()
            {
                continue;
            }
            return Some(Ok((i, delta)));
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        for (id, out) in self.ids.iter().zip(&self.outputs) {
            if !out.finished {
                self.model.engine.abort(*id);
                self.model.metrics.request_finished("abort");
            }
        }
    }
}
