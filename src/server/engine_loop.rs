//! The scheduler thread: the one owner of the [`Engine`]. Handlers talk to it
//! over a channel; each request gets its own channel of step events back.
//! The loop only schedules, runs forwards and forwards token ids: text,
//! stop strings and SSE framing happen on the handler side.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::engine::pooling::Pooling;
use crate::engine::prompt::Prompt;
use crate::engine::sequence::{FinishReason, SeqId, StepEvent};
use crate::engine::Engine;
use crate::error::WickError;
use crate::sampling::params::SamplingParams;
use crate::server::metrics::Metrics;

pub enum Command {
    /// A request's sequences (one per choice, or per embedding input),
    /// queued or refused together.
    Add {
        jobs: Vec<Job>,
        events: mpsc::UnboundedSender<StepEvent>,
        reply: oneshot::Sender<Result<Vec<SeqId>, WickError>>,
    },
    Abort(SeqId),
    /// Stop admitting; abort whatever is left after `grace`, then exit.
    Shutdown {
        grace: Duration,
    },
}

/// A submitted request's sequence ids and the receiver of their events.
pub type Submitted = Result<(Vec<SeqId>, mpsc::UnboundedReceiver<StepEvent>), WickError>;

/// Handle the handlers hold.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::UnboundedSender<Command>,
}

impl EngineHandle {
    /// Submits a request's sequences; their events all arrive on the one
    /// receiver returned, tagged with their ids.
    pub async fn add(&self, seqs: Vec<(Prompt, SamplingParams)>) -> Submitted {
        let jobs = seqs.into_iter().map(|(p, s)| Job::Generate(p, Box::new(s)));
        self.submit(jobs.collect()).await
    }

    /// Submits an embedding request's inputs; each ends with one event
    /// carrying its vector.
    pub async fn embed(&self, prompts: Vec<Vec<u32>>, pooling: Pooling) -> Submitted {
        let jobs = prompts.into_iter().map(|p| Job::Embed(p, pooling));
        self.submit(jobs.collect()).await
    }

    async fn submit(&self, jobs: Vec<Job>) -> Submitted {
        let (events, rx) = mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        let stopped = || WickError::Unavailable("the engine has stopped".into());
        self.tx
            .send(Command::Add {
                jobs,
                events,
                reply,
            })
            .map_err(|_| stopped())?;
        let ids = answer.await.map_err(|_| stopped())??;
        Ok((ids, rx))
    }

    pub fn abort(&self, id: SeqId) {
        let _ = self.tx.send(Command::Abort(id));
    }

    pub fn shutdown(&self, grace: Duration) {
        let _ = self.tx.send(Command::Shutdown { grace });
    }
}

/// One sequence of a request.
pub enum Job {
    Generate(Prompt, Box<SamplingParams>),
    Embed(Vec<u32>, Pooling),
}

impl Job {
    fn prompt_len(&self) -> usize {
        match self {
            Job::Generate(p, _) => p.tokens.len(),
            Job::Embed(p, _) => p.len(),
        }
    }
}

struct Loop {
    engine: Engine,
    metrics: Arc<Metrics>,
    max_waiting: usize,
    /// Each live sequence's event channel.
    outputs: std::collections::HashMap<SeqId, mpsc::UnboundedSender<StepEvent>>,
    shutdown_at: Option<std::time::Instant>,
}

/// Starts the scheduler thread.
pub fn spawn(
    engine: Engine,
    metrics: Arc<Metrics>,
    max_waiting: usize,
) -> (EngineHandle, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let l = Loop {
        engine,
        metrics,
        max_waiting,
        outputs: Default::default(),
        shutdown_at: None,
    };
    let join = std::thread::Builder::new()
        .name("wick-scheduler".into())
        .spawn(move || l.run(rx))
        .expect("spawning the scheduler thread");
    (EngineHandle { tx }, join)
}

impl Loop {
    fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            // Idle: sleep until a command arrives.
            if !self.engine.has_work() {
                if self.shutdown_at.is_some() {
                    return;
                }
                match rx.blocking_recv() {
                    Some(cmd) => self.handle(cmd),
                    None => return,
                }
            }
            while let Ok(cmd) = rx.try_recv() {
                self.handle(cmd);
            }
            if self
                .shutdown_at
                .is_some_and(|t| std::time::Instant::now() >= t)
            {
                self.abort_all();
                return;
            }
            self.step();
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add {
                jobs,
                events,
                reply,
            } => self.queue(jobs, events, reply),
            Command::Abort(id) => {
                self.abort(id);
                self.publish_stats();
            }
            Command::Shutdown { grace } => {
                self.shutdown_at = Some(std::time::Instant::now() + grace)
            }
        }
    }

    /// Queues a request's jobs and answers the handler.
    fn queue(
        &mut self,
        jobs: Vec<Job>,
        events: mpsc::UnboundedSender<StepEvent>,
        reply: oneshot::Sender<Result<Vec<SeqId>, WickError>>,
    ) {
        let result = self.add(jobs);
        if let Ok(ids) = &result {
            for id in ids {
                self.outputs.insert(*id, events.clone());
            }
        }
        // Before the reply: whoever sees the answer sees the queue it joined.
        self.publish_stats();
        // A handler that gave up before the reply leaves orphans: drop them.
        if let Err(Ok(ids)) = reply.send(result) {
            for id in ids {
                self.abort(id);
            }
        }
    }

    /// Queues all of a request's sequences, or none: the request is refused
    /// if the server is stopping, if any sequence is invalid, or if it would
    /// leave more than `max_waiting` sequences queued beyond the free slots.
    fn add(&mut self, jobs: Vec<Job>) -> Result<Vec<SeqId>, WickError> {
        if self.shutdown_at.is_some() {
            return Err(WickError::Unavailable("the server is shutting down".into()));
        }
        let prompt_tokens: usize = jobs.iter().map(Job::prompt_len).sum();
        let mut ids: Vec<SeqId> = Vec::with_capacity(jobs.len());
        let mut refusal = None;
        for job in jobs {
            let added = match job {
                Job::Generate(prompt, params) => {
                    self.engine
                        .add_to_group(prompt, *params, ids.first().copied())
                }
                Job::Embed(prompt, pooling) => self.engine.add_embedding(prompt, pooling),
            };
            match added {
                Ok(id) => ids.push(id),
                Err(e) => {
                    refusal = Some(e);
                    break;
                }
            }
        }
        if refusal.is_none() && self.engine.stats().queued > self.max_waiting {
            refusal = Some(WickError::Overloaded(format!(
                "{} requests are already waiting",
                self.max_waiting
            )));
        }
        if let Some(e) = refusal {
            for id in ids {
                self.engine.abort(id);
            }
            return Err(e);
        }
        self.metrics.add_prompt_tokens(prompt_tokens as u64);
        Ok(ids)
    }

    /// Drops a sequence; whoever asked records why (client gone, stop string).
    fn abort(&mut self, id: SeqId) {
        self.engine.abort(id);
        self.outputs.remove(&id);
    }

    fn abort_all(&mut self) {
        let ids: Vec<SeqId> = self.outputs.keys().copied().collect();
        for id in ids {
            if let Some(tx) = self.outputs.get(&id) {
                let _ = tx.send(StepEvent::ended(id, FinishReason::Abort));
            }
            self.abort(id);
        }
    }

    /// One engine step; events go to their requests. A request whose
    /// receiver is gone (client disconnected) is aborted here, freeing its
    /// blocks before the next step; the handler counted it when it let go.
    fn step(&mut self) {
        let events = self.engine.step();
        // Counted, and the gauges set, before anyone can see the tokens, so
        // a client that reads /metrics after its answer finds them there.
        let generated = events.iter().filter(|ev| ev.token.is_some()).count();
        self.metrics.add_generation_tokens(generated as u64);
        for wait in self.engine.take_queue_waits() {
            self.metrics.observe_queue_time(wait.as_secs_f64());
        }
        self.publish_stats();
        let mut gone = Vec::new();
        for ev in events {
            let finished = ev.finish.is_some();
            let id = ev.seq;
            let delivered = self.outputs.get(&id).is_some_and(|tx| tx.send(ev).is_ok());
            if finished {
                self.outputs.remove(&id);
            } else if !delivered {
                gone.push(id);
            }
        }
        // Aborts free blocks: the gauges follow.
        if !gone.is_empty() {
            for id in gone {
                self.abort(id);
            }
            self.publish_stats();
        }
    }

    /// The gauges follow every change: a step, and also an add or abort
    /// while the engine is idle, when no step would come to update them.
    fn publish_stats(&self) {
        self.metrics.set_engine_stats(&self.engine.stats());
    }
}
