//! A running request on the handler side: its choices submitted to the
//! scheduler together, their events turned into text deltas (one
//! [`SequenceOutput`] per choice), the request's deadline, its metrics and
//! access-log fields, and every unfinished sequence aborted if the request
//! is dropped (the client went away).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::engine::output::{Delta, SequenceOutput};
use crate::engine::sequence::{FinishReason, SeqId, StepEvent};
use crate::engine::speculation::DraftTally;
use crate::server::error::ApiError;
use crate::server::handlers;
use crate::server::http::access::AccessRecord;
use crate::server::http::json_body::JsonBody;
use crate::server::images::ImageSources;
use crate::server::metrics::Metrics;
use crate::server::protocol::{CompletionTokensDetails, PromptTokensDetails, Usage};
use crate::server::validation::{GenerationPlan, ModelContext};
use crate::server::AppState;
use crate::server::ModelState;

pub struct Generation {
    model: Arc<ModelState>,
    events: mpsc::UnboundedReceiver<StepEvent>,
    /// Choice `i` is sequence `ids[i]`.
    ids: Vec<SeqId>,
    choice_of: HashMap<SeqId, usize>,
    outputs: Vec<SequenceOutput>,
    last_token: Vec<Option<Instant>>,
    deadline: Option<Instant>,
    tally: Tally,
    /// Each prompt counted once, however many choices sample it (as
    /// OpenAI and vLLM count).
    prompt_tokens: usize,
    /// Per choice: prompt tokens the prefix cache supplied.
    cached_tokens: Vec<usize>,
    /// Choices per prompt.
    n: usize,
    access: AccessRecord,
    /// Some choice ended by `length` (the request's reason in the metrics).
    any_length: bool,
    timed_out: bool,
}

/// Reads, validates and submits a generation request, what completions and
/// chat share. A request refused here (a 4xx, an overload) is not counted
/// as finished; one whose client leaves from the moment its body is read
/// on counts as aborted.
pub async fn begin<R: DeserializeOwned + ImageSources + Send + 'static>(
    state: &Arc<AppState>,
    body: Request,
    validate: fn(&R, &ModelContext) -> Result<GenerationPlan, ApiError>,
    access: AccessRecord,
) -> Result<(Generation, GenerationPlan), ApiError> {
    let read = async {
        let JsonBody(req) = JsonBody::<R>::from_request(body, state).await?;
        Ok(req)
    };
    begin_from(state, read, validate, access).await
}

/// [`begin`] for a request its handler has already read (and translated,
/// as `/v1/responses` does): no body to read again.
pub async fn begin_read<R: ImageSources + Send + 'static>(
    state: &Arc<AppState>,
    req: R,
    validate: fn(&R, &ModelContext) -> Result<GenerationPlan, ApiError>,
    access: AccessRecord,
) -> Result<(Generation, GenerationPlan), ApiError> {
    begin_from(state, async { Ok(req) }, validate, access).await
}

/// What [`begin`] and [`begin_read`] share, from the request's read on.
async fn begin_from<R: ImageSources + Send + 'static>(
    state: &Arc<AppState>,
    read: impl Future<Output = Result<R, ApiError>>,
    validate: fn(&R, &ModelContext) -> Result<GenerationPlan, ApiError>,
    access: AccessRecord,
) -> Result<(Generation, GenerationPlan), ApiError> {
    let tally = Tally {
        metrics: state.metrics.clone(),
        start: Instant::now(),
        counted: false,
    };
    let set_up = async {
        let req = read.await?;
        let model = handlers::ready(state)?;
        let plan = handlers::plan(&model, req, validate).await?;
        Ok::<_, ApiError>((model, plan))
    };
    let (model, plan) = match set_up.await {
        Ok(x) => x,
        Err(e) => {
            tally.refused();
            return Err(e);
        }
    };
    let timeout = state.limits.request_timeout;
    let g = Generation::start(model, &plan, timeout, access, tally).await?;
    Ok((g, plan))
}

/// A request's one entry in the finished-request metrics, taken when it
/// finishes, fails or is abandoned, never twice.
struct Tally {
    metrics: Arc<Metrics>,
    start: Instant,
    counted: bool,
}

impl Tally {
    fn count(&mut self, reason: &str) {
        if std::mem::replace(&mut self.counted, true) {
            return;
        }
        self.metrics.request_finished(reason);
        self.metrics.observe_e2e(self.start.elapsed().as_secs_f64());
    }

    /// Turned away before it ran: not a finished request.
    fn refused(mut self) {
        self.counted = true;
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.count("abort");
    }
}

impl Generation {
    /// Submits `plan.n` choices per prompt; choice `p * n + j` is the j-th
    /// sample of prompt p. Fails before anything streams if the engine
    /// refuses any of them (then none is queued).
    async fn start(
        model: Arc<ModelState>,
        plan: &GenerationPlan,
        timeout: Option<Duration>,
        access: AccessRecord,
        tally: Tally,
    ) -> Result<Self, ApiError> {
        let mut seqs = Vec::with_capacity(plan.prompts.len() * plan.n);
        let mut outputs = Vec::with_capacity(seqs.capacity());
        for prompt in &plan.prompts {
            for j in 0..plan.n {
                let mut params = plan.params.clone();
                // n samples of one seeded request differ from each other but stay reproducible.
                params.seed = params.seed.map(|s| s.wrapping_add(j as u64));
                outputs.push(SequenceOutput::new(
                    params.stop.clone(),
                    plan.logprobs.is_some(),
                ));
                seqs.push((prompt.clone(), params));
            }
        }
        let prompt_tokens = plan.prompts.iter().map(|p| p.tokens.len()).sum();
        access.set_tokens(prompt_tokens, 0);
        let (ids, events) = match model.engine.add(seqs).await {
            Ok(added) => added,
            Err(e) => {
                tally.refused();
                return Err(e.into());
            }
        };
        Ok(Generation {
            choice_of: ids.iter().enumerate().map(|(i, &id)| (id, i)).collect(),
            last_token: vec![None; ids.len()],
            cached_tokens: vec![0; ids.len()],
            n: plan.n,
            ids,
            outputs,
            events,
            model,
            deadline: timeout.map(|t| tally.start + t),
            tally,
            prompt_tokens,
            access,
            any_length: false,
            timed_out: false,
        })
    }

    pub fn model(&self) -> &Arc<ModelState> {
        &self.model
    }

    pub fn num_choices(&self) -> usize {
        self.ids.len()
    }

    pub fn usage(&self) -> Usage {
        let completion = self.outputs.iter().map(|o| o.completion_tokens).sum();
        // A prompt's first choice tells what was cached before the request
        // came; its other choices share that choice's blocks.
        let cached = self.cached_tokens.iter().step_by(self.n.max(1)).sum();
        let mut drafts = DraftTally::default();
        for o in &self.outputs {
            drafts.add(o.drafts);
        }
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: completion,
            total_tokens: self.prompt_tokens + completion,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: cached,
            },
            completion_tokens_details: (drafts.drafted > 0).then_some(CompletionTokensDetails {
                accepted_prediction_tokens: drafts.accepted,
                rejected_prediction_tokens: drafts.drafted - drafts.accepted,
            }),
        }
    }

    /// The next visible delta of any choice; `None` once every choice has
    /// finished. An error ends the request: nothing follows it.
    pub async fn next(&mut self) -> Option<Result<(usize, Delta), ApiError>> {
        loop {
            if self.outputs.iter().all(SequenceOutput::is_finished) {
                return None;
            }
            let deadline = self.deadline;
            let expired = async move {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            let ev = tokio::select! {
                ev = self.events.recv() => ev,
                () = expired => return self.expire(),
            };
            let Some(ev) = ev else {
                return Some(Err(
                    self.fail(ApiError::internal("the engine dropped a request"))
                ));
            };
            let Some(&i) = self.choice_of.get(&ev.seq) else {
                continue;
            };
            if let Some(c) = ev.cached_prompt_tokens {
                self.cached_tokens[i] = c;
            }
            let delta = match self.outputs[i].on_event(&self.model.tokenizer, ev) {
                Ok(Some(d)) => d,
                Ok(None) => continue,
                Err(e) => return Some(Err(self.fail(ApiError::internal(format!("{e:#}"))))),
            };
            if delta.token.is_some() {
                self.observe_token(i);
            }
            if delta.abort_in_engine {
                self.model.engine.abort(self.ids[i]);
            }
            if let Some(e) = self.check_finish(&delta) {
                return Some(Err(e));
            }
            if !delta.is_empty() {
                return Some(Ok((i, delta)));
            }
        }
    }

    /// The deadline passed: each unfinished choice ends as if it had reached
    /// `max_tokens` (llama.cpp's time limit does the same), one per call.
    fn expire(&mut self) -> Option<Result<(usize, Delta), ApiError>> {
        let i = self.outputs.iter().position(|o| !o.is_finished())?;
        if !std::mem::replace(&mut self.timed_out, true) {
            tracing::info!("request timeout reached: ending it with finish_reason length");
        }
        self.model.engine.abort(self.ids[i]);
        let delta = match self.outputs[i].end(&self.model.tokenizer, FinishReason::Length) {
            Ok(d) => d?,
            Err(e) => return Some(Err(self.fail(ApiError::internal(format!("{e:#}"))))),
        };
        self.check_finish(&delta);
        Some(Ok((i, delta)))
    }

    fn observe_token(&mut self, i: usize) {
        let now = Instant::now();
        let m = &self.model.metrics;
        if self.last_token.iter().all(Option::is_none) {
            let ttft = now.duration_since(self.tally.start);
            m.observe_ttft(ttft.as_secs_f64());
            self.access.set_ttft(ttft);
        }
        if let Some(t) = self.last_token[i] {
            m.observe_inter_token(now.duration_since(t).as_secs_f64());
        }
        self.last_token[i] = Some(now);
        self.access
            .set_tokens(self.prompt_tokens, self.usage().completion_tokens);
    }

    /// Records a choice's finish; the request is counted once its last
    /// choice ends. A finish the client cannot be shown (the server shut
    /// down, the engine failed) becomes the request's error.
    fn check_finish(&mut self, delta: &Delta) -> Option<ApiError> {
        match delta.finish.as_ref()? {
            FinishReason::Abort => Some(self.fail(ApiError::unavailable(
                "the server shut down before this request finished",
            ))),
            FinishReason::Error(msg) => Some(self.fail(ApiError::internal(msg.clone()))),
            FinishReason::Grammar(msg) => Some(self.fail(ApiError::bad_request(msg.clone(), None))),
            FinishReason::Length => {
                self.any_length = true;
                self.count_if_done();
                None
            }
            FinishReason::Stop => {
                self.count_if_done();
                None
            }
        }
    }

    fn count_if_done(&mut self) {
        if self.outputs.iter().all(SequenceOutput::is_finished) {
            self.tally
                .count(if self.any_length { "length" } else { "stop" });
        }
    }

    /// Ends the request with `e`: its other choices are aborted.
    fn fail(&mut self, e: ApiError) -> ApiError {
        self.abort_unfinished();
        let reason = if e.status.is_server_error() && e.status.as_u16() != 503 {
            "error"
        } else {
            "abort"
        };
        self.tally.count(reason);
        e
    }

    fn abort_unfinished(&mut self) {
        for (id, out) in self.ids.iter().zip(&mut self.outputs) {
            if !out.is_finished() {
                self.model.engine.abort(*id);
                // Marks it finished; nothing is shown after an error or abort.
                let _ = out.end(&self.model.tokenizer, FinishReason::Abort);
            }
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // The tally, dropped next, counts the request as aborted unless it
        // already finished.
        self.abort_unfinished();
    }
}
