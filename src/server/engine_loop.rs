//! The scheduler thread: the one owner of the [`Engine`]. Handlers talk to it
//! over a channel; each request gets its own channel of step events back.
//! The loop only schedules, runs forwards and forwards token ids: text,
//! stop strings and SSE framing happen on the handler side.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::metrics::Metrics;
use crate::engine::{Engine, StepEvent};
use crate::error::WickError;
use crate::sampling_params::SamplingParams;
use crate::sequence::{FinishReason, SeqId};

pub enum Command {
    Add {
        prompt: Vec<u32>,
        params: SamplingParams,
        events: mpsc::UnboundedSender<StepEvent>,
        reply: oneshot::Sender<Result<SeqId, WickError>>,
    },
    Abort(SeqId),
    /// Stop admitting; abort whatever is left after `grace`, then exit.
    Shutdown {
        grace: Duration,
    },
}

/// Handle the handlers hold.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::UnboundedSender<Command>,
}

impl EngineHandle {
    pub async fn add(
        &self,
        prompt: Vec<u32>,
        params: SamplingParams,
    ) -> Result<(SeqId, mpsc::UnboundedReceiver<StepEvent>), WickError> {
        let (events, rx) = mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Command::Add {
                prompt,
                params,
                events,
                reply,
            })
            .map_err(|_| WickError::Unavailable("the engine has stopped".into()))?;
        let id = answer
            .await
            .map_err(|_| WickError::Unavailable("the engine has stopped".into()))??;
        Ok((id, rx))
    }

    pub fn abort(&self, id: SeqId) {
        let _ = self.tx.send(Command::Abort(id));
    }

    pub fn shutdown(&self, grace: Duration) {
        let _ = self.tx.send(Command::Shutdown { grace });
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
                prompt,
                params,
                events,
                reply,
            } => {
                let result = if self.shutdown_at.is_some() {
                    Err(WickError::Unavailable("the server is shutting down".into()))
                } else if self.engine.stats().waiting >= self.max_waiting {
                    Err(WickError::Overloaded(format!(
                        "{} requests are already waiting",
                        self.max_waiting
                    )))
                } else {
                    let n = prompt.len();
                    self.engine
                        .add_request(prompt, params)
                        .inspect(|_| self.metrics.add_prompt_tokens(n as u64))
                };
                if let Ok(id) = &result {
                    self.outputs.insert(*id, events);
                }
                // A handler that gave up before the reply leaves an orphan: drop it.
                if let Err(Ok(id)) = reply.send(result) {
                    self.abort(id);
                }
            }
            Command::Abort(id) => self.abort(id),
            Command::Shutdown { grace } => {
                self.shutdown_at = Some(std::time::Instant::now() + grace)
            }
        }
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
                let _ = tx.send(StepEvent {
                    seq: id,
                    token: None,
                    finish: Some(FinishReason::Abort),
                    prompt_logprobs: Vec::new(),
                });
            }
            self.metrics.request_finished(FinishReason::Abort.as_str());
            self.abort(id);
        }
    }

    /// One engine step; events go to their requests. A request whose
    /// receiver is gone (client disconnected) is aborted here, freeing its
    /// blocks before the next step.
    fn step(&mut self) {
        let events = self.engine.step();
        let mut generated = 0;
        let mut gone = Vec::new();
        for ev in events {
            generated += ev.token.is_some() as u64;
            let finished = ev.finish.clone();
            let id = ev.seq;
            let delivered = self.outputs.get(&id).is_some_and(|tx| tx.send(ev).is_ok());
            if let Some(reason) = finished {
                self.outputs.remove(&id);
                self.metrics.request_finished(reason.as_str());
            } else if !delivered {
                gone.push(id);
            }
        }
        // The handler records the abort when it drops its end.
        for id in gone {
            self.abort(id);
        }
        self.metrics.add_generation_tokens(generated);
        let s = self.engine.stats();
        self.metrics.set_engine_stats(
            s.running,
            s.waiting,
            s.blocks_used,
            s.blocks_total,
            s.preemptions,
        );
    }
}
