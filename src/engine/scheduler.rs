//! Continuous-batching policy, and the one owner of every sequence's life:
//! [`Scheduler::add`] queues it, [`Scheduler::schedule`] decides which
//! sequences run this step and with how many tokens, and
//! [`Scheduler::update`] applies what the step came to: it advances cache
//! cursors, appends what was sampled, finishes sequences and frees their
//! blocks. Blocks are given back in one place, [`release`].
//!
//! Each step decode rows go first (a token for every running sequence past
//! its prompt), then prompt chunks of running sequences, then waiting ones
//! are admitted, while the step's prompt budget, the sequence cap and the
//! KV pool allow. The prompt budget ([`StepBudget`]) keeps a step that
//! carries prompt tokens within a bounded multiple of a decode-only step,
//! as measured on the steps run, so a long prompt does not stall every
//! running stream; it never falls below a floor, so prompts are never
//! starved, and never past `--max-num-batched-tokens`. An admitted sequence
//! first takes the longest run of its leading full blocks the prefix cache
//! holds, and computes only the rest (at least its last token, whose logits
//! it samples from). When the pool runs dry the most recently admitted
//! sequence is preempted: its blocks are freed (their content stays cached
//! while the pool allows) and it queues again behind those already waiting.
//!
//! No request can lock others out ([`FairShare`]): while any wait, prompts
//! already running leave part of each step's prompt budget to admissions, and one
//! request's sequences beyond its first few may hold at most half the pool
//! at their longest, so the rest of its `n` waits rather than crowding
//! others out.
//!
//! Nor can a grammar slow everyone down ([`MaskBudget`]): constrained
//! decode rows whose masks would take more than a share of the forward
//! pass's time sit the step out, in turns.

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::engine::block_manager::BlockManager;
use crate::engine::mask_budget::MaskBudget;
use crate::engine::pooling::Pool;
use crate::engine::prompt::Pixels;
use crate::engine::sequence::{FinishReason, SeqId, Sequence, StepEvent};
use crate::engine::speculation::{
    self, DraftRun, DraftTally, Offered, Speculation, PRIOR_FIXED_COST_IN_TOKENS,
    PRIOR_ROUND_COST_IN_TOKENS,
};
use crate::engine::state_slots::StateSlots;
use crate::engine::step_budget::{EncodeSlice, StepBudget};
use crate::engine::step_plan::{self, RowOutput, RowPlan, StepPlan};
use crate::engine::window_blocks::WindowBlocks;

#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Most sequences in the running batch.
    pub max_num_seqs: usize,
    /// Most tokens (prefill chunks plus decode rows) in one forward pass.
    pub max_num_batched_tokens: usize,
    /// Most a step with prompt tokens may take, as a multiple of a
    /// decode-only step of the batch ([`StepBudget`]); 0: no bound.
    pub max_step_slowdown: f64,
}

/// How the step's prompt budget and the KV pool are shared between
/// requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairShare {
    /// Most blocks one request's running sequences may need at their
    /// longest (`max_len`), beyond its first [`MIN_GROUP_SEQS`].
    pub max_group_blocks: usize,
}

/// Sequences of one request that run together whatever they may need: a
/// chat's `n = 2` without `max_tokens` may each grow to the whole context,
/// and should not then take turns.
const MIN_GROUP_SEQS: usize = 4;

/// How much of the past each timed draft-model round leaves.
const DRAFT_ROUND_DECAY: f64 = 0.8;

impl FairShare {
    /// Half the pool a request.
    pub fn new(num_blocks: usize) -> Self {
        FairShare {
            max_group_blocks: num_blocks / 2,
        }
    }

    /// Tokens of a step's prompt budget `prefill` that running prompts
    /// leave to admissions while any sequence waits, three quarters: a new
    /// request's prompt (or its first chunk) then runs in the next step,
    /// however long the prompts before it.
    pub fn admit_reserve(prefill: usize) -> usize {
        prefill - prefill / 4
    }

    /// Tokens a running prompt with `pending` tokens left may take of the
    /// `left` that remain of the step's prompt budget `prefill`: it leaves
    /// the reserve when others wait.
    fn chunk(&self, pending: usize, left: usize, prefill: usize, others_wait: bool) -> usize {
        let cap = if others_wait {
            left.saturating_sub(Self::admit_reserve(prefill))
        } else {
            left
        };
        pending.min(cap)
    }

    /// Whether a group running `seqs` sequences, which hold `held` blocks
    /// at their longest, may admit one more needing `more`.
    fn admits(&self, seqs: usize, held: usize, more: usize) -> bool {
        seqs < MIN_GROUP_SEQS || held + more <= self.max_group_blocks
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub running: usize,
    pub waiting: usize,
    /// Waiting beyond the free sequence slots ([`Scheduler::num_queued`]).
    pub queued: usize,
    pub blocks_used: usize,
    pub blocks_total: usize,
    /// The sliding-window layers' pool, where the model has one (else 0).
    pub window_blocks_used: usize,
    pub window_blocks_total: usize,
    /// Recurrent-state slots held, and made, where the model keeps a
    /// state per sequence (else 0).
    pub state_slots_used: usize,
    pub state_slots_total: usize,
    pub preemptions: u64,
    /// Decode rows that sat a step out for their grammar's mask time.
    pub mask_deferrals: u64,
    /// Prompt tokens looked up in the prefix cache, and found there.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    /// Steps timed so far ([`Scheduler::note_step`]), and the last one's
    /// time and prompt tokens.
    pub steps: u64,
    pub last_step: Duration,
    pub last_step_prefill_tokens: usize,
    /// Prompt tokens the step budget allowed the last step beside its
    /// decode rows ([`StepBudget::prefill_tokens`]).
    pub prefill_budget: usize,
    /// Tokens drafted by prompt lookup and accepted, so far.
    pub drafts: DraftTally,
}

/// What the step just scheduled costs, as the step budget counts it.
#[derive(Debug, Clone, Copy, Default)]
struct StepCost {
    decode_rows: usize,
    prompt_tokens: usize,
    prefill_budget: usize,
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    share: FairShare,
    steps: StepBudget,
    /// The step scheduled and not yet timed.
    plan: Option<StepCost>,
    num_steps: u64,
    last_step: Duration,
    last_plan: StepCost,
    masks: MaskBudget,
    /// How long the last forward pass took: the measure of the mask budget.
    last_forward: Duration,
    blocks: BlockManager,
    /// The sliding-window layers' blocks, for a model with such layers.
    window: Option<WindowBlocks>,
    /// The recurrent-state slots, for a hybrid model's linear-attention
    /// layers ([`StateSlots`]): a sequence holds one while it runs.
    states: Option<StateSlots>,
    /// Prompt lookup, when decode rows draft ([`speculation`]).
    spec: Option<Speculation>,
    /// Whether decode rows may draft at all: the model can take a
    /// rejected draft back. Rows with a prediction draft from it then,
    /// with or without prompt lookup.
    drafting: bool,
    /// A draft model proposes for rows that have nothing else to draft.
    model_drafts: bool,
    /// Seconds a draft model's round has taken, recent rounds weighing
    /// most; `None` before one was timed.
    draft_round: Option<f64>,
    /// What the draft model and the vision encoder took of the step being
    /// run, which the step's cost leaves out.
    aside_time: Duration,
    drafts: DraftTally,
    /// How long each sequence admitted since the last [`take_queue_waits`]
    /// (`Scheduler::take_queue_waits`) waited for its first admission.
    queue_waits: Vec<Duration>,
    waiting: VecDeque<Sequence>,
    /// In admission order: the last one is the first to be preempted.
    running: Vec<Sequence>,
    num_preemptions: u64,
    num_mask_deferrals: u64,
    prefix_queries: u64,
    prefix_hits: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, blocks: BlockManager) -> Self {
        Scheduler {
            share: FairShare::new(blocks.num_blocks()),
            steps: StepBudget::new(cfg.max_num_batched_tokens, cfg.max_step_slowdown),
            plan: None,
            num_steps: 0,
            last_step: Duration::ZERO,
            last_plan: StepCost::default(),
            cfg,
            masks: MaskBudget::default(),
            last_forward: Duration::ZERO,
            blocks,
            window: None,
            states: None,
            spec: None,
            drafting: false,
            model_drafts: false,
            draft_round: None,
            aside_time: Duration::ZERO,
            drafts: DraftTally::default(),
            queue_waits: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions: 0,
            num_mask_deferrals: 0,
            prefix_queries: 0,
            prefix_hits: 0,
        }
    }

    /// With a pool for sliding-window layers as well.
    pub fn with_window(mut self, window: WindowBlocks) -> Self {
        self.window = Some(window);
        self
    }

    /// With recurrent-state slots as well: admission then needs a free one.
    pub fn with_states(mut self, states: StateSlots) -> Self {
        self.states = Some(states);
        self
    }

    /// With decode rows drafting: from their requests' predictions, and
    /// by prompt lookup as `lookup` says, if at all.
    pub fn with_drafts(mut self, lookup: Option<Speculation>) -> Self {
        self.spec = lookup;
        self.drafting = true;
        self
    }

    /// Whether decode rows may draft (see [`Self::with_drafts`]).
    pub fn drafts(&self) -> bool {
        self.drafting
    }

    /// Rows with nothing else to draft leave placeholders
    /// ([`speculation::MODEL_DRAFT`]) for a draft model to fill.
    pub fn with_model_drafts(mut self) -> Self {
        self.model_drafts = true;
        self
    }

    /// The ids of the running sequences.
    pub fn running_ids(&self) -> std::collections::HashSet<SeqId> {
        self.running.iter().map(|s| s.id).collect()
    }

    pub fn state_slots(&self) -> Option<&StateSlots> {
        self.states.as_ref()
    }

    pub fn block_size(&self) -> usize {
        self.blocks.block_size()
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.num_blocks()
    }

    /// Whether a sequence could ever run: its longest possible length fits
    /// the whole pool (so alone it can never be preempted).
    pub fn fits(&self, seq: &Sequence) -> bool {
        let window_fits = self.window.as_ref().is_none_or(|w| {
            let chunk = self.cfg.max_num_batched_tokens;
            w.held_by(chunk, seq.max_len) <= w.num_blocks()
        });
        window_fits && self.blocks.blocks_for(seq.max_len) <= self.blocks.num_blocks()
    }

    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// The queue waits of the sequences first admitted since the last call.
    pub fn take_queue_waits(&mut self) -> Vec<Duration> {
        std::mem::take(&mut self.queue_waits)
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Waiting sequences beyond the free sequence slots: those the next
    /// step could not admit even with tokens and blocks to spare. A burst
    /// that fits the free slots is not a queue.
    pub fn num_queued(&self) -> usize {
        let free = self.cfg.max_num_seqs.saturating_sub(self.running.len());
        self.waiting.len().saturating_sub(free)
    }

    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            queued: self.num_queued(),
            blocks_used: self.blocks.num_used(),
            blocks_total: self.blocks.num_blocks(),
            window_blocks_used: self.window.as_ref().map_or(0, WindowBlocks::num_used),
            window_blocks_total: self.window.as_ref().map_or(0, WindowBlocks::num_blocks),
            state_slots_used: self.states.as_ref().map_or(0, StateSlots::num_used),
            state_slots_total: self.states.as_ref().map_or(0, StateSlots::num_slots),
            preemptions: self.num_preemptions,
            mask_deferrals: self.num_mask_deferrals,
            prefix_queries: self.prefix_queries,
            prefix_hits: self.prefix_hits,
            steps: self.num_steps,
            last_step: self.last_step,
            last_step_prefill_tokens: self.last_plan.prompt_tokens,
            prefill_budget: self.last_plan.prefill_budget,
            drafts: self.drafts,
        }
    }

    /// The draft model ran `run`'s proposal rounds in `took`, this step;
    /// a run that also cached prompt chunks says nothing of a round's
    /// cost.
    pub fn note_drafts(&mut self, run: DraftRun, took: Duration) {
        self.aside_time += took;
        if run.rounds == 0 || run.prefilled {
            return;
        }
        let round = took.as_secs_f64() / run.rounds as f64;
        self.draft_round = Some(match self.draft_round {
            Some(r) => r * DRAFT_ROUND_DECAY + round * (1.0 - DRAFT_ROUND_DECAY),
            None => round,
        });
    }

    /// The vision encoder ran `took` of this step.
    pub fn note_encoding(&mut self, took: Duration) {
        self.aside_time += took;
    }

    /// What the step just scheduled may spend encoding images beside its
    /// rows ([`StepBudget::encode_slice`]).
    pub fn encode_slice(&self) -> EncodeSlice {
        let plan = self.plan.unwrap_or_default();
        (self.steps).encode_slice(plan.decode_rows, self.batch_to_be(), plan.prompt_tokens)
    }

    /// The images running prompts wait for and have not prefilled, each
    /// once, in the order the prompts run.
    pub fn images_wanted(&self) -> Vec<(u64, Pixels)> {
        let mut wanted: Vec<(u64, Pixels)> = Vec::new();
        for m in self.running.iter().flat_map(|s| s.images_to_place()) {
            if wanted.iter().all(|(h, _)| *h != m.hash) {
                wanted.push((m.hash, m.pixels.clone()));
            }
        }
        wanted
    }

    /// Ends the running sequences that wait for an image of `failed` (its
    /// hash, and why it could not be encoded) with that error; the rest
    /// run on.
    pub fn fail_images(&mut self, failed: &[(u64, String)]) -> Vec<StepEvent> {
        let mut events = Vec::new();
        for (hash, msg) in failed {
            tracing::warn!("an image could not be encoded: {msg}");
            let ids: Vec<SeqId> = (self.running.iter())
                .filter(|s| s.images_to_place().any(|m| m.hash == *hash))
                .map(|s| s.id)
                .collect();
            for id in ids {
                self.abort(id);
                let msg = format!("the image could not be encoded: {msg}");
                events.push(StepEvent::ended(id, FinishReason::Error(msg)));
            }
        }
        events
    }

    /// How long the forward pass just run took.
    pub fn note_forward(&mut self, took: Duration) {
        self.last_forward = took;
    }

    /// How long the whole step just run took, from scheduling to the
    /// sampled tokens: what the step budget learns its cost model from.
    /// A step that ran nothing or failed teaches nothing.
    pub fn note_step(&mut self, took: Duration) {
        let took = took.saturating_sub(std::mem::take(&mut self.aside_time));
        let Some(plan) = self.plan.take() else {
            return;
        };
        if plan.decode_rows + plan.prompt_tokens == 0 {
            return;
        }
        self.steps
            .observe(plan.decode_rows, plan.prompt_tokens, took);
        self.num_steps += 1;
        self.last_step = took;
        self.last_plan = plan;
    }

    /// The constrained decode rows that sit this step out ([`MaskBudget`]).
    fn mask_sit_outs(&self) -> Vec<SeqId> {
        let (ids, rows): (Vec<SeqId>, Vec<_>) = self
            .running
            .iter()
            .filter_map(|s| s.mask_row().map(|r| (s.id, r)))
            .unzip();
        let others = rows.len() < self.running.len() || !self.waiting.is_empty();
        let runs = self.masks.select(&rows, self.last_forward, others);
        ids.into_iter()
            .zip(runs)
            .filter_map(|(id, runs)| (!runs).then_some(id))
            .collect()
    }

    /// The sequences the step just scheduled runs, in batch order.
    #[cfg(test)]
    pub(crate) fn scheduled(&self) -> impl Iterator<Item = &Sequence> {
        self.running.iter().filter(|s| s.chunk > 0)
    }

    /// The running sequences, which a step's [`RowPlan::slot`]s point into.
    pub fn running(&self) -> &[Sequence] {
        &self.running
    }

    /// Each row of `plan` with its sequence, for the stages between
    /// [`Scheduler::schedule`] and [`Scheduler::update`] to draft and
    /// sample with (its sampler and grammar).
    pub fn rows<R: Borrow<RowPlan>>(
        &mut self,
        rows: impl IntoIterator<Item = R>,
    ) -> Vec<(R, &mut Sequence)> {
        step_plan::pair(rows, &mut self.running)
    }

    /// Decides this step: which running sequences run and with how many
    /// tokens (a sequence's `chunk`, 0 = sits out), admitting and
    /// preempting as needed. A prompt's chunk stops before an image whose
    /// encoder output is not `ready`.
    pub fn schedule(&mut self, ready: &dyn Fn(u64) -> bool) -> StepPlan {
        let cap = self.cfg.max_num_batched_tokens;
        let mut preempted = Vec::new();
        let others_wait = !self.waiting.is_empty();
        let sit_outs = self.mask_sit_outs();
        self.num_mask_deferrals += sit_outs.len() as u64;
        // Decode rows first, a token each; with prompt work about, they
        // leave the step budget's floor to it.
        let prompts = others_wait || self.running.iter().any(|s| s.pending() > 1);
        let mut decode_room = match prompts {
            true => cap.saturating_sub(self.steps.floor()),
            false => cap,
        };
        let mut decode_rows = 0;
        for seq in &mut self.running {
            seq.chunk = 0;
            seq.draft.clear();
            if sit_outs.contains(&seq.id) {
                seq.sat_out += 1;
                continue;
            }
            seq.sat_out = 0;
            if seq.pending() == 1 && decode_room > 0 {
                seq.chunk = 1;
                decode_rows += 1;
                decode_room -= 1;
            }
        }
        // Drafts for those rows, in what the step has left; a drafted
        // token costs the step what a decode row does, and a draft model's
        // proposal a round of that model besides.
        if self.drafting {
            let cost = self.steps.cost();
            let fixed = cost.fixed_in_tokens().unwrap_or(PRIOR_FIXED_COST_IN_TOKENS);
            let round = match (self.draft_round, cost.token_seconds(fixed)) {
                (Some(secs), Some(per_token)) => secs / per_token,
                _ => PRIOR_ROUND_COST_IN_TOKENS,
            };
            let (spec, model) = (self.spec, self.model_drafts);
            decode_rows += draft(&mut self.running, spec, model, fixed, round, decode_room);
        }
        // Then prompt chunks, running ones first, within what the step
        // budget allows beside those rows.
        let prefill = self.steps.prefill_tokens(decode_rows, self.batch_to_be());
        let mut left = prefill;
        for seq in &mut self.running {
            if seq.pending() > 1 {
                let chunk = self.share.chunk(seq.pending(), left, prefill, others_wait);
                seq.chunk = seq.media_aligned(chunk, ready);
                left = left.saturating_sub(seq.chunk);
            }
        }
        // Blocks for what each was given, in admission order.
        let mut i = 0;
        while i < self.running.len() {
            let chunk = self.running[i].chunk;
            if chunk == 0 {
                i += 1;
                continue;
            }
            loop {
                let seq = &mut self.running[i];
                if grow(&mut self.blocks, &mut self.window, seq, seq.chunk) {
                    register_full_blocks(&mut self.blocks, &mut self.window, seq);
                    i += 1;
                    break;
                }
                // Out of blocks: a draft goes first, then the newest
                // sequence (possibly this one).
                if !seq.draft.is_empty() {
                    seq.chunk = seq.own_chunk();
                    seq.draft.clear();
                    continue;
                }
                let victim = self.running.len() - 1;
                preempted.push(self.preempt(victim));
                if victim == i {
                    break;
                }
            }
        }
        if preempted.is_empty() {
            self.admit(left, ready);
        }
        self.plan = Some(self.cost_of_step(prefill));
        // Behind everyone already waiting, in arrival order among themselves.
        preempted.sort_by_key(|s| s.id);
        let ids = preempted.iter().map(|s| s.id).collect();
        self.waiting.extend(preempted);
        let rows = (self.running.iter_mut().enumerate())
            .filter(|(_, s)| s.chunk > 0)
            .map(|(slot, seq)| {
                let row = RowPlan::of(seq, slot);
                // The plan holds the draft from here on.
                seq.draft.clear();
                row
            })
            .collect();
        StepPlan {
            rows,
            preempted: ids,
        }
    }

    /// Sequences that will decode together once the prompts running and
    /// waiting are in: what a step's slowdown is measured against.
    /// Embedding requests end with their prompt, and do not count.
    fn batch_to_be(&self) -> usize {
        let generates = |s: &&Sequence| s.pool.is_none();
        let n = self.running.iter().filter(generates).count()
            + self.waiting.iter().filter(generates).count();
        n.min(self.cfg.max_num_seqs)
    }

    /// The decode rows and prompt tokens of the step just scheduled.
    fn cost_of_step(&self, prefill_budget: usize) -> StepCost {
        let mut plan = StepCost {
            prefill_budget,
            ..StepCost::default()
        };
        for seq in self.running.iter().filter(|s| s.chunk > 0) {
            // A drafted token costs the step what a decode row does.
            if seq.pending() == 1 {
                plan.decode_rows += seq.chunk;
            } else {
                plan.prompt_tokens += seq.chunk;
            }
        }
        plan
    }

    /// Admits waiting sequences in queue order while the budget, the
    /// sequence cap and the pool allow; one whose request already holds
    /// its share of the pool stays queued without holding up the rest.
    fn admit(&mut self, mut budget: usize, ready: &dyn Fn(u64) -> bool) {
        // Per request: its running sequences, and the blocks they may need.
        let mut groups: HashMap<SeqId, (usize, usize)> = HashMap::new();
        for r in &self.running {
            let g = groups.entry(r.group).or_default();
            *g = (g.0 + 1, g.1 + self.blocks.blocks_for(r.max_len));
        }
        let mut at = 0;
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(seq) = self.waiting.get(at) else {
                break;
            };
            let need = self.blocks.blocks_for(seq.max_len);
            let (seqs, held) = groups.get(&seq.group).copied().unwrap_or_default();
            if !self.share.admits(seqs, held, need) {
                at += 1;
                continue;
            }
            let seq = &mut self.waiting[at];
            // A hybrid model's sequence needs a state slot to run.
            if !self
                .states
                .as_mut()
                .is_none_or(|s| s.take(&mut seq.state_slot))
            {
                break;
            }
            let hit = match_prefix(&mut self.blocks, &mut self.window, seq);
            let chunk = seq.media_aligned(seq.pending().min(budget), ready);
            if !grow(&mut self.blocks, &mut self.window, seq, chunk) {
                // Holding the matched blocks while waiting would pin them.
                release(&mut self.blocks, &mut self.window, &mut self.states, seq);
                break;
            }
            self.prefix_queries += hit.queried as u64;
            self.prefix_hits += hit.found as u64;
            if seq.cached_prompt_tokens.is_none() {
                self.queue_waits.push(seq.queued_at.elapsed());
            }
            seq.cached_prompt_tokens
                .get_or_insert(hit.found.min(seq.prompt_len));
            seq.chunk = chunk;
            register_full_blocks(&mut self.blocks, &mut self.window, seq);
            budget = budget.saturating_sub(chunk);
            let seq = self.waiting.remove(at).expect("index in range");
            groups.insert(seq.group, (seqs + 1, held + need));
            self.running.push(seq);
        }
    }

    /// Takes a running sequence out and frees its blocks, to be queued again.
    fn preempt(&mut self, index: usize) -> Sequence {
        let mut seq = self.running.remove(index);
        release(
            &mut self.blocks,
            &mut self.window,
            &mut self.states,
            &mut seq,
        );
        self.num_preemptions += 1;
        seq.queued_at = Instant::now();
        seq
    }

    /// Applies what a step came to: advances each row's cache cursor,
    /// hands an embedding its hidden rows, appends the tokens sampled, and
    /// retires the sequences they finish, whose grammar failed, or whose
    /// vector is done. `outputs` are `plan`'s rows' in order; an error is
    /// the forward's, and fails every row ([`Scheduler::fail`]). A row that
    /// ran a draft has the drafted tokens it kept and the one sampled after
    /// them, and learns from that how long to draft next.
    pub fn update(
        &mut self,
        plan: &StepPlan,
        outputs: Result<Vec<RowOutput>, String>,
        eos_ids: &[u32],
    ) -> Vec<StepEvent> {
        let outputs = match outputs {
            Ok(outputs) => outputs,
            Err(msg) => return self.fail(plan, &msg),
        };
        let mut events = Vec::with_capacity(outputs.len());
        let mut retired = Vec::new();
        for (row, out) in plan.rows.iter().zip(outputs) {
            let seq = &mut self.running[row.slot];
            seq.num_cached += match row.draft.is_empty() {
                true => row.chunk,
                // Its pending token and the drafts kept are now cached.
                false => out.tokens.len(),
            };
            seq.prompt_logprobs.extend(out.prompt_logprobs);
            if let Some(msg) = out.failed {
                events.push(StepEvent::ended(seq.id, FinishReason::Grammar(msg)));
                retired.push(row.slot);
                continue;
            }
            if let Some(pool) = &mut seq.pool {
                pool.add(&out.hidden);
                // Even a chunk that hands nothing over (cls after the
                // first) may end the prompt.
                if row.ends {
                    events.push(StepEvent {
                        embedding: seq.pool.take().map(Pool::finish),
                        ..StepEvent::ended(seq.id, FinishReason::Stop)
                    });
                    retired.push(row.slot);
                }
                continue;
            }
            if out.tokens.is_empty() {
                continue;
            }
            let mut tally = None;
            if !row.draft.is_empty() {
                let (drafted, accepted) = (row.draft.len(), out.tokens.len() - 1);
                seq.acceptance.update(drafted, accepted);
                tally = Some(DraftTally::one(drafted, accepted));
                self.drafts.add(DraftTally::one(drafted, accepted));
            }
            for token in out.tokens {
                let first = seq.output().is_empty();
                seq.tokens.push(token.id);
                let finish = seq.finish_reason(token.id, eos_ids);
                events.push(StepEvent {
                    seq: seq.id,
                    token: Some(token),
                    finish: finish.clone(),
                    prompt_logprobs: std::mem::take(&mut seq.prompt_logprobs),
                    cached_prompt_tokens: if first {
                        seq.cached_prompt_tokens
                    } else {
                        None
                    },
                    embedding: None,
                    draft: tally.take(),
                });
                // What was kept past a finish is not the sequence's.
                if finish.is_some() {
                    retired.push(row.slot);
                    break;
                }
            }
        }
        // From the back, so that the slots still ahead stay put.
        for slot in retired.into_iter().rev() {
            let mut seq = self.running.remove(slot);
            release(
                &mut self.blocks,
                &mut self.window,
                &mut self.states,
                &mut seq,
            );
        }
        events
    }

    /// Drops a sequence wherever it is and frees its blocks. False if
    /// unknown (already finished).
    pub fn abort(&mut self, id: SeqId) -> bool {
        let seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            Some(self.running.remove(i))
        } else {
            let i = self.waiting.iter().position(|s| s.id == id);
            i.and_then(|i| self.waiting.remove(i))
        };
        match seq {
            Some(mut seq) => {
                release(
                    &mut self.blocks,
                    &mut self.window,
                    &mut self.states,
                    &mut seq,
                );
                true
            }
            None => false,
        }
    }

    /// A failed forward fails exactly the sequences that were in it. What
    /// this step registered in the prefix cache was never computed, so the
    /// cache is dropped.
    pub fn fail(&mut self, plan: &StepPlan, msg: &str) -> Vec<StepEvent> {
        tracing::error!("engine step failed: {msg}");
        self.plan = None;
        let ids: Vec<SeqId> = plan.rows.iter().map(|r| r.seq).collect();
        for &id in &ids {
            self.abort(id);
        }
        self.blocks.forget_all();
        if let Some(w) = &mut self.window {
            w.forget_all();
        }
        ids.into_iter()
            .map(|id| StepEvent::ended(id, FinishReason::Error(msg.to_string())))
            .collect()
    }
}

/// Makes room in both pools for `chunk` more of `seq`'s tokens, freeing
/// the window blocks its queries no longer see; false if a pool is short.
fn grow(
    blocks: &mut BlockManager,
    window: &mut Option<WindowBlocks>,
    seq: &mut Sequence,
    chunk: usize,
) -> bool {
    let to = seq.num_cached + chunk;
    blocks.grow(&mut seq.block_table, to)
        && window
            .as_mut()
            .is_none_or(|w| w.advance(&mut seq.window_table, seq.num_cached, to))
}

/// Gives back a sequence's blocks; its cache cursor and hashes reset.
fn release(
    blocks: &mut BlockManager,
    window: &mut Option<WindowBlocks>,
    states: &mut Option<StateSlots>,
    seq: &mut Sequence,
) {
    blocks.release(&mut seq.block_table);
    if let Some(w) = window {
        w.release(&mut seq.window_table);
    }
    // Its state goes with it: a preempted sequence starts over.
    if let Some(s) = states {
        s.release(&mut seq.state_slot);
    }
    seq.block_hashes.clear();
    seq.num_cached = 0;
    seq.chunk = 0;
    seq.draft.clear();
}

/// Drafts the decode rows' next tokens (from a prediction, by prompt
/// lookup, or as placeholders for the draft model), as many as
/// [`speculation::plan`] expects to pay for themselves in a step whose
/// fixed cost is `fixed` tokens' cost, with a draft model's round costing
/// `round`, and at most `room`. Returns the tokens drafted.
fn draft(
    running: &mut [Sequence],
    lookup: Option<Speculation>,
    model: bool,
    fixed: f64,
    round: f64,
    room: usize,
) -> usize {
    let spec = lookup.unwrap_or_default();
    let rows: Vec<usize> = (0..running.len())
        .filter(|&i| running[i].chunk > 0)
        .collect();
    let decode_rows = rows.iter().filter(|&&i| running[i].pending() == 1).count();
    // No row could be worth a draft: skip the lookups.
    let best = rows
        .iter()
        .map(|&i| running[i].acceptance.p())
        .fold(0.0, f64::max);
    if best * (fixed + decode_rows as f64) <= decode_rows as f64 {
        return 0;
    }
    // Each decode row's offer, looked up once.
    let offers: Vec<Offer> = rows
        .iter()
        .map(|&i| Offer::of(&running[i], &spec, lookup.is_some(), model))
        .collect();
    let odds: Vec<Offered> = rows
        .iter()
        .zip(&offers)
        .map(|(&i, o)| Offered {
            p: running[i].acceptance.p(),
            tokens: o.len(),
            by_model: matches!(o, Offer::Placeholders(_)),
        })
        .collect();
    let drafts: Vec<(usize, Vec<u32>)> = rows
        .iter()
        .zip(offers)
        .zip(speculation::plan(&odds, fixed, round, room))
        .filter(|&(_, take)| take > 0)
        .map(|((&i, o), take)| (i, o.take(take)))
        .collect();
    let mut drafted = 0;
    for (i, found) in drafts {
        let seq = &mut running[i];
        seq.chunk += found.len();
        drafted += found.len();
        seq.draft = found;
    }
    drafted
}

/// What a decode row could draft this step.
enum Offer<'a> {
    /// Tokens found in its prediction or its own text (none: no draft).
    Text(&'a [u32]),
    /// This many tokens for the draft model to propose.
    Placeholders(usize),
}

impl Offer<'_> {
    /// A decode row's: its prediction's next tokens, and where that has
    /// nothing (or there is none), its own text's under prompt `lookup`;
    /// failing both, placeholders for the draft `model`. Every drafted
    /// token kept leaves room for the one sampled after it.
    fn of<'a>(s: &'a Sequence, spec: &Speculation, lookup: bool, model: bool) -> Offer<'a> {
        if s.chunk != 1 || s.pending() != 1 || !s.may_draft() {
            return Offer::Text(&[]);
        }
        let most = spec.max_draft.min(s.max_len.saturating_sub(s.len() + 1));
        let (min, max) = (spec.ngram_min, spec.ngram_max);
        let p = &s.params.prediction;
        let found = match speculation::predicted(p, s.output(), &s.tokens, min, max, most) {
            [] if lookup => speculation::lookup(&s.tokens, min, max, most),
            found => found,
        };
        match found {
            [] if model => Offer::Placeholders(most),
            found => Offer::Text(found),
        }
    }

    fn len(&self) -> usize {
        match self {
            Offer::Text(found) => found.len(),
            Offer::Placeholders(n) => *n,
        }
    }

    /// The first `n` tokens offered, as the row's draft.
    fn take(self, n: usize) -> Vec<u32> {
        match self {
            Offer::Text(found) => found[..n].to_vec(),
            Offer::Placeholders(_) => vec![speculation::MODEL_DRAFT; n],
        }
    }
}

/// Prompt tokens an admission looked up in the prefix cache, and found.
struct PrefixHit {
    queried: usize,
    found: usize,
}

/// Shares the longest run of `seq`'s leading full blocks the cache holds
/// (in the sliding-window pool too, where the model has one) and moves
/// its cache cursor past them. At least the last token is left to
/// compute, for the logits to sample from. Sequences that score their
/// prompt need every prompt row, so they take nothing.
fn match_prefix(
    blocks: &mut BlockManager,
    window: &mut Option<WindowBlocks>,
    seq: &mut Sequence,
) -> PrefixHit {
    let bs = blocks.block_size();
    // Scoring or pooling needs every prompt row computed.
    let every_row = seq.params.prompt_logprobs.is_some() || seq.pool.is_some();
    if !blocks.caching() || !seq.block_table.is_empty() || every_row {
        return PrefixHit {
            queried: 0,
            found: 0,
        };
    }
    let usable = (seq.len() - 1) / bs;
    let mut parent = None;
    for i in 0..usable {
        let tokens = &seq.tokens[i * bs..(i + 1) * bs];
        let keys = seq.block_keys.of_block(i, bs);
        let hash = blocks.hash(seq.block_hashes.last().copied(), tokens, &keys);
        let Some(block) = blocks.lookup(hash, parent, tokens, &keys) else {
            break;
        };
        blocks.share(block);
        seq.block_table.push(block);
        seq.block_hashes.push(hash);
        parent = Some(block);
    }
    if let Some(w) = window {
        let found: Vec<_> = (0..seq.block_table.len())
            .map(|i| {
                let tokens = &seq.tokens[i * bs..(i + 1) * bs];
                let keys = seq.block_keys.of_block(i, bs);
                let beside = blocks.anchor(seq.block_table[i]);
                w.lookup(seq.block_hashes[i], beside, tokens, &keys)
            })
            .collect();
        let kept = w.share_hit(&mut seq.window_table, &found);
        blocks.release(&mut seq.block_table.split_off(kept));
        seq.block_hashes.truncate(kept);
    }
    seq.num_cached = seq.block_table.len() * bs;
    PrefixHit {
        queried: seq.len(),
        found: seq.num_cached,
    }
}

/// Registers the blocks this step's chunk fills, so later sequences (and
/// ones admitted after this in the same step: every K/V of a step is
/// written before any is read) can share them.
fn register_full_blocks(
    blocks: &mut BlockManager,
    window: &mut Option<WindowBlocks>,
    seq: &mut Sequence,
) {
    let bs = blocks.block_size();
    // Drafted tokens are not the sequence's until kept.
    let full = (seq.num_cached + seq.own_chunk()) / bs;
    for i in seq.block_hashes.len()..full {
        let tokens = &seq.tokens[i * bs..(i + 1) * bs];
        let keys = seq.block_keys.of_block(i, bs);
        let hash = blocks.hash(seq.block_hashes.last().copied(), tokens, &keys);
        let parent = i.checked_sub(1).map(|p| seq.block_table[p]);
        blocks.register(seq.block_table[i], hash, parent, tokens, &keys);
        if let Some(w) = window.as_mut() {
            let beside = blocks.anchor(seq.block_table[i]);
            w.register(&seq.window_table, i, hash, beside, tokens, &keys);
        }
        seq.block_hashes.push(hash);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::prompt::{MediaSpan, Pixels, Prompt};
    use crate::kv::FREED;
    use crate::sampling::params::SamplingParams;
    use crate::sampling::sampler::SampledToken;

    fn seq_of(id: SeqId, prompt: Vec<u32>, max_tokens: usize) -> Sequence {
        let params = SamplingParams {
            max_tokens,
            temperature: 0.0,
            ..Default::default()
        };
        Sequence::new(id, prompt.into(), params, 1 << 20, &[])
    }

    /// Sequences `ids` of one request (group `ids.start`).
    fn group(ids: std::ops::Range<SeqId>, prompt_len: usize, max_tokens: usize) -> Vec<Sequence> {
        let first = ids.start;
        ids.map(|id| Sequence {
            group: first,
            ..seq(id, prompt_len, max_tokens)
        })
        .collect()
    }

    fn seq(id: SeqId, prompt_len: usize, max_tokens: usize) -> Sequence {
        // Distinct prompts, so the prefix cache plays no part.
        seq_of(
            id,
            (0..prompt_len as u32)
                .map(|t| t + 1000 * id as u32)
                .collect(),
            max_tokens,
        )
    }

    fn scheduler(num_blocks: usize, max_num_seqs: usize, max_tokens: usize) -> Scheduler {
        Scheduler::new(
            SchedulerConfig {
                max_num_seqs,
                max_num_batched_tokens: max_tokens,
                max_step_slowdown: 2.5,
            },
            BlockManager::new(num_blocks, 4),
        )
    }

    fn token(id: u32) -> SampledToken {
        SampledToken {
            id,
            logprob: None,
            top_logprobs: Vec::new(),
        }
    }

    /// Pretends `plan` ran: every row that ends its pending tokens
    /// samples token 7.
    fn run_step(s: &mut Scheduler, plan: &StepPlan) -> Vec<StepEvent> {
        let outputs = plan.rows.iter().map(|r| match r.ends {
            true => sampled(&[7]),
            false => RowOutput::default(),
        });
        s.update(plan, Ok(outputs.collect()), &[])
    }

    /// A row's output that sampled `tokens`.
    fn sampled(tokens: &[u32]) -> RowOutput {
        RowOutput {
            tokens: tokens.iter().map(|&t| token(t)).collect(),
            ..RowOutput::default()
        }
    }

    fn chunks(s: &Scheduler) -> Vec<(SeqId, usize)> {
        s.running.iter().map(|q| (q.id, q.chunk)).collect()
    }

    /// A prompt's image spans run each in one step, under a step budget
    /// of 10: chunks end before a span, and one longer than the budget is
    /// taken whole.
    #[test]
    fn prompt_chunks_never_cut_an_image() {
        let mut s = scheduler(64, 4, 10);
        let span = |start, len| MediaSpan {
            start,
            len,
            hash: start as u64,
            pixels: Pixels::default(),
        };
        let prompt = Prompt {
            tokens: (0..30).collect(),
            media: vec![span(6, 8), span(16, 12)],
            cache_salt: None,
        };
        let params = SamplingParams {
            max_tokens: 1,
            ..Default::default()
        };
        s.add(Sequence::new(1, prompt, params, 1 << 10, &[]));
        let mut ends = Vec::new();
        while s.has_work() {
            let plan = s.schedule(&|_| true);
            if let Some(seq) = s.running.first() {
                ends.push(seq.num_cached + seq.chunk);
            }
            run_step(&mut s, &plan);
        }
        assert_eq!(ends[0], 6, "the first chunk stops before the image");
        for end in &ends {
            assert!(
                !(7..14).contains(end) && !(17..28).contains(end),
                "{ends:?}"
            );
        }
        assert!(ends.contains(&28), "{ends:?}");
    }

    /// A prompt waits at an image not encoded yet while a stream decodes
    /// beside it: its text before the image runs, then it sits out (the
    /// image wanted), then the image runs whole once ready. An image that
    /// fails ends only the prompt that waits for it.
    #[test]
    fn a_prompt_waits_for_its_image_while_others_decode() {
        let mut s = scheduler(64, 4, 64);
        let span = |start, hash| MediaSpan {
            start,
            len: 8,
            hash,
            pixels: Pixels::default(),
        };
        let params = SamplingParams {
            max_tokens: 50,
            ignore_eos: true,
            ..Default::default()
        };
        s.add(seq(1, 4, 50));
        let plan = s.schedule(&|_| true);
        run_step(&mut s, &plan);
        for (id, hash) in [(2u32, 21), (3, 31)] {
            let prompt = Prompt {
                tokens: (100 * id..100 * id + 20).collect(),
                media: vec![span(5, hash)],
                cache_salt: None,
            };
            s.add(Sequence::new(
                id as SeqId,
                prompt,
                params.clone(),
                1 << 10,
                &[],
            ));
        }
        let none = |_| false;
        let plan = s.schedule(&none);
        assert_eq!(chunks(&s), [(1, 1), (2, 5), (3, 5)], "text up to the image");
        run_step(&mut s, &plan);
        let wanted: Vec<u64> = s.images_wanted().iter().map(|w| w.0).collect();
        assert_eq!(wanted, [21, 31]);
        for _ in 0..3 {
            let plan = s.schedule(&none);
            assert_eq!(chunks(&s), [(1, 1), (2, 0), (3, 0)], "the stream decodes");
            run_step(&mut s, &plan);
        }
        // 21 encoded: its image and the rest of the prompt run; 31 fails.
        let plan = s.schedule(&|h| h == 21);
        assert_eq!(chunks(&s), [(1, 1), (2, 15), (3, 0)]);
        run_step(&mut s, &plan);
        assert_eq!(
            s.images_wanted().iter().map(|w| w.0).collect::<Vec<_>>(),
            [31]
        );
        let events = s.fail_images(&[(31, "too wide".into())]);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].seq, 3);
        assert!(
            matches!(&events[0].finish, Some(FinishReason::Error(m)) if m.contains("too wide")),
            "{:?}",
            events[0].finish
        );
        assert_eq!(s.running_ids(), [1, 2].into_iter().collect());
        assert!(s.images_wanted().is_empty());
    }

    /// A scheduler drafting up to `max_draft` tokens by 2- and 1-grams,
    /// whose one sequence, "1 2 3 4 5 6 1" with `max_tokens`, has
    /// prefilled and sampled 2: its next row drafts.
    fn drafting(max_draft: usize, max_tokens: usize) -> Scheduler {
        let spec = Speculation {
            max_draft,
            ngram_max: 2,
            ngram_min: 1,
        };
        let mut s = scheduler(64, 8, 64).with_drafts(Some(spec));
        s.add(seq_of(1, vec![1, 2, 3, 4, 5, 6, 1], max_tokens));
        let plan = s.schedule(&|_| true);
        assert_eq!(chunks(&s), [(1, 7)], "the prompt drafts nothing");
        s.update(&plan, Ok(vec![sampled(&[2])]), &[]);
        s
    }

    #[test]
    fn a_decode_row_drafts_its_lookup_and_keeps_what_was_sampled() {
        // Blocks of 4: "1 2 3 4 5 6 1 2" looks up "3 4 5 6"; a first draft
        // at the hopeful prior runs three of them.
        let mut s = drafting(4, 20);
        let plan = s.schedule(&|_| true);
        assert_eq!(plan.rows[0].draft, [3, 4, 5]);
        assert_eq!(chunks(&s), [(1, 4)]);
        assert_eq!(s.running[0].block_table.len(), 3, "blocks for the draft");
        assert_eq!(
            s.running[0].block_hashes.len(),
            2,
            "only the block of kept tokens is registered"
        );
        // Two drafted tokens held; the third row sampled 9: three tokens.
        let events = s.update(&plan, Ok(vec![sampled(&[3, 4, 9])]), &[]);
        assert_eq!(s.running[0].tokens[7..], [2, 3, 4, 9]);
        assert_eq!(s.running[0].pending(), 1);
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].draft, Some(DraftTally::one(3, 2)));
        assert!(events[1].draft.is_none() && events[2].draft.is_none());
        assert_eq!(s.stats().drafts, DraftTally::one(3, 2));
    }

    #[test]
    fn drafts_stop_at_max_len_and_tokens_past_a_finish_are_dropped() {
        // Room for 3 more tokens: a draft of at most 2, then the one after.
        let mut s = drafting(8, 4);
        let plan = s.schedule(&|_| true);
        assert_eq!(plan.rows[0].draft, [3, 4]);
        // EOS (5) sampled for the second drafted token ends it there.
        let events = s.update(&plan, Ok(vec![sampled(&[3, 5, 6])]), &[5]);
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].finish, Some(FinishReason::Stop));
        assert!(s.running.is_empty());
        assert_eq!(s.stats().blocks_used, 0);
    }

    #[test]
    fn long_prompts_are_chunked_under_the_token_budget() {
        let mut s = scheduler(64, 8, 10);
        s.add(seq(1, 25, 4));
        s.add(seq(2, 3, 4));
        let plan = s.schedule(&|_| true);
        assert_eq!(chunks(&s), [(1, 10)]);
        run_step(&mut s, &plan);
        let plan = s.schedule(&|_| true);
        // Seq 2 waits, so seq 1 leaves it the reserve (three quarters, 8):
        // seq 2 starts at once instead of after seq 1's whole prompt.
        assert_eq!(chunks(&s), [(1, 2), (2, 3)]);
        run_step(&mut s, &plan);
        let plan = s.schedule(&|_| true);
        // No one waits: seq 2 decodes first, the running prompt takes the
        // rest of the budget.
        assert_eq!(chunks(&s), [(1, 9), (2, 1)]);
        run_step(&mut s, &plan);
        let plan = s.schedule(&|_| true);
        assert_eq!(chunks(&s), [(1, 4), (2, 1)]);
        run_step(&mut s, &plan);
        s.schedule(&|_| true);
        assert_eq!(chunks(&s), [(1, 1), (2, 1)], "both decode");
    }

    /// A step of `tokens` on a synthetic machine: 40 ms a step and 7.5 ms
    /// a token (a 1B model on two cores, about).
    fn cost(tokens: usize) -> Duration {
        Duration::from_micros(40_000 + 7_500 * tokens as u64)
    }

    /// One step on the synthetic clock: its decode rows, tokens and time.
    type ClockedStep = (usize, usize, Duration);

    /// One sequence on the synthetic clock: when its first token came, and
    /// the longest gap between its tokens.
    type ClockedSeq = (Duration, Duration);

    /// Runs `s` to the end on the synthetic clock; returns each step, and
    /// each sequence by id.
    fn run_clocked(s: &mut Scheduler) -> (Vec<ClockedStep>, Vec<ClockedSeq>) {
        let mut now = Duration::ZERO;
        let mut steps = Vec::new();
        let mut seen: HashMap<SeqId, (Duration, Duration, Duration)> = HashMap::new();
        while s.has_work() {
            let plan = s.schedule(&|_| true);
            let decode = s.scheduled().filter(|q| q.pending() == 1).count();
            let tokens: usize = s.scheduled().map(|q| q.chunk).sum();
            let events = run_step(s, &plan);
            now += cost(tokens);
            s.note_step(cost(tokens));
            steps.push((decode, tokens, cost(tokens)));
            for ev in events {
                let e = seen.entry(ev.seq).or_insert((now, now, Duration::ZERO));
                e.2 = e.2.max(now - e.1);
                e.1 = now;
            }
        }
        let mut ids: Vec<_> = seen.keys().copied().collect();
        ids.sort();
        (
            steps,
            ids.iter().map(|id| (seen[id].0, seen[id].2)).collect(),
        )
    }

    fn busy_scheduler(slowdown: f64) -> Scheduler {
        let mut s = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: 256,
                max_num_batched_tokens: 512,
                max_step_slowdown: slowdown,
            },
            BlockManager::new(4096, 16),
        );
        for id in 0..32 {
            s.add(seq(id, 128, 64));
        }
        s
    }

    #[test]
    fn steps_with_prompts_stay_within_the_slowdown_of_a_decode_step() {
        // 32 prompts of 128 tokens at once, 64 tokens each: the issue's
        // load. A 32-row decode step costs 280 ms.
        let (steps, seqs) = run_clocked(&mut busy_scheduler(2.5));
        let bound = cost(32).mul_f64(2.5);
        for &(decode, tokens, took) in &steps {
            if decode > 0 {
                assert!(
                    took <= bound,
                    "{decode} rows + {} prompt tokens: {took:?}",
                    tokens - decode
                );
            }
        }
        // Decode rows never sit out: a stream's longest gap is one step.
        let worst_gap = seqs.iter().map(|q| q.1).max().unwrap();
        assert!(worst_gap <= bound, "{worst_gap:?}");
        // Without the bound a 512-token step stalls the first streams for
        // 3.9 s at a time; the last first token comes a little sooner.
        let (_, unbounded) = run_clocked(&mut busy_scheduler(0.0));
        let stall = unbounded.iter().map(|q| q.1).max().unwrap();
        assert!(stall > cost(500), "{stall:?}");
        let last_first = |q: &[ClockedSeq]| q.iter().map(|q| q.0).max().unwrap();
        let (bounded, free) = (last_first(&seqs), last_first(&unbounded));
        assert!(bounded <= free.mul_f64(1.2), "{bounded:?} vs {free:?}");
    }

    #[test]
    fn a_long_prompt_among_busy_streams_gets_its_first_token_in_bounded_steps() {
        // 100 streams decode; a 2000-token prompt joins. The slowdown
        // alone (1.0: no step slower than a decode-only one) would let one
        // prompt token in a step; the floor (512 / 16 = 32) lets 32.
        let mut s = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: 256,
                max_num_batched_tokens: 512,
                max_step_slowdown: 1.0,
            },
            BlockManager::new(4096, 16),
        );
        for id in 0..100 {
            s.add(seq(id, 4, 1000));
        }
        for _ in 0..4 {
            let plan = s.schedule(&|_| true);
            let tokens: usize = s.scheduled().map(|q| q.chunk).sum();
            run_step(&mut s, &plan);
            s.note_step(cost(tokens));
        }
        s.add(seq(1000, 2000, 1));
        let mut steps = 0;
        let first = loop {
            let plan = s.schedule(&|_| true);
            steps += 1;
            assert_eq!(
                s.scheduled()
                    .filter(|q| q.pending() == 1 && q.id < 1000)
                    .count(),
                100
            );
            let long = s.running.iter().find(|q| q.id == 1000);
            let (chunk, pending) = long.map(|q| (q.chunk, q.pending())).unwrap();
            assert!(chunk >= 32.min(pending), "step {steps}: {chunk}");
            let events = run_step(&mut s, &plan);
            s.note_step(cost(100 + chunk));
            if events.iter().any(|e| e.seq == 1000) {
                break steps;
            }
        };
        assert_eq!(first, 2000usize.div_ceil(32));
        assert_eq!(s.stats().prefill_budget, 32);
    }

    #[test]
    fn decode_rows_leave_the_floor_to_prompts() {
        // More decode rows than the cap holds: prompts still get the floor
        // (128 / 16 = 8 tokens) and the newest decode rows wait a step.
        let mut s = scheduler(4096, 256, 128);
        for id in 0..130 {
            s.add(seq(id, 1, 100));
        }
        let plan = s.schedule(&|_| true);
        run_step(&mut s, &plan);
        let plan = s.schedule(&|_| true);
        run_step(&mut s, &plan);
        s.add(seq(500, 40, 1));
        s.schedule(&|_| true);
        let decoding = s.scheduled().filter(|q| q.id < 500).count();
        let prompt: usize = s.scheduled().filter(|q| q.id == 500).map(|q| q.chunk).sum();
        assert_eq!((decoding, prompt), (120, 8));
        s.note_step(cost(128));
        let st = s.stats();
        assert_eq!((st.steps, st.last_step_prefill_tokens), (1, 8));
        assert_eq!(st.last_step, cost(128));
    }

    #[test]
    fn a_failed_or_empty_step_teaches_nothing() {
        let mut s = scheduler(64, 8, 100);
        s.schedule(&|_| true);
        s.note_step(cost(0));
        assert_eq!(s.stats().steps, 0, "nothing ran");
        s.add(seq(1, 5, 4));
        let plan = s.schedule(&|_| true);
        s.fail(&plan, "boom");
        s.note_step(cost(5));
        assert_eq!(s.stats().steps, 0, "failed");
        assert_eq!(s.steps.cost().line(), None);
    }

    #[test]
    fn max_num_seqs_caps_the_batch() {
        let mut s = scheduler(64, 2, 100);
        for id in 0..3 {
            s.add(seq(id, 2, 4));
        }
        s.schedule(&|_| true);
        assert_eq!((s.running.len(), s.waiting.len()), (2, 1));
    }

    #[test]
    fn only_waiting_beyond_the_free_slots_counts_as_queued() {
        let mut s = scheduler(64, 3, 100);
        for id in 0..5 {
            s.add(seq(id, 2, 4));
        }
        assert_eq!(s.num_queued(), 2, "3 of the 5 have a free slot");
        s.schedule(&|_| true);
        assert_eq!((s.running.len(), s.waiting.len()), (3, 2));
        assert_eq!(s.num_queued(), 2);
        s.abort(0);
        assert_eq!(s.num_queued(), 1);
    }

    #[test]
    fn out_of_blocks_preempts_the_newest_and_requeues_it_behind_the_waiting() {
        // 3 blocks of 4 tokens; three sequences of 4 prompt tokens fill them,
        // and a fourth waits for a block.
        let mut s = scheduler(3, 8, 100);
        for id in 1..=4 {
            s.add(seq(id, 4, 8));
        }
        let plan = s.schedule(&|_| true);
        assert_eq!(s.running.len(), 3);
        run_step(&mut s, &plan);
        // Each now needs a second block for its 5th token: only seq 1 gets one
        // after seqs 3 and 2 are preempted, newest first. They queue behind
        // seq 4, which waited longer, in their own arrival order.
        let plan = s.schedule(&|_| true);
        assert_eq!(plan.preempted, [2, 3]);
        assert_eq!(chunks(&s), [(1, 1)]);
        assert_eq!(
            s.waiting.iter().map(|q| q.id).collect::<Vec<_>>(),
            [4, 2, 3]
        );
        assert!(s
            .waiting
            .iter()
            .all(|q| q.num_cached == 0 && q.block_table.is_empty()));
        assert_eq!(s.stats().preemptions, 2);
        // No admissions in a step that preempted.
        assert_eq!(s.stats().blocks_used, 2);
    }

    #[test]
    fn one_request_holds_at_most_half_the_pool_and_others_pass_it() {
        // 32 blocks of 4: a request of 12 sequences that each grow to 12
        // tokens (3 blocks) may run 5 at once (15 blocks; 18 > 32 / 2).
        let mut s = scheduler(32, 64, 100);
        group(0..12, 4, 8).into_iter().for_each(|q| s.add(q));
        s.add(seq(100, 4, 8));
        let mut plan = s.schedule(&|_| true);
        let running: Vec<SeqId> = s.running.iter().map(|q| q.id).collect();
        // The sixth of the group stays queued; the later request passes it.
        assert_eq!(running, [0, 1, 2, 3, 4, 100]);
        assert_eq!(s.waiting.len(), 7);
        // As the group's sequences finish, the next ones run.
        for _ in 0..9 {
            run_step(&mut s, &plan);
            plan = s.schedule(&|_| true);
        }
        assert!(s.running.iter().any(|q| q.id == 5), "{:?}", chunks(&s));
        assert_eq!(s.take_queue_waits().len(), 11);
    }

    #[test]
    fn a_few_choices_run_together_however_long_they_may_grow() {
        // Each may grow to the whole pool (16 blocks), yet n = 2 runs at once.
        let mut s = scheduler(16, 64, 100);
        group(0..2, 4, 60).into_iter().for_each(|q| s.add(q));
        s.schedule(&|_| true);
        assert_eq!(s.running.len(), 2);
    }

    #[test]
    fn fair_share_caps_running_prompts_only_while_others_wait() {
        let f = FairShare::new(100);
        assert_eq!(f.max_group_blocks, 50);
        assert_eq!(FairShare::admit_reserve(512), 384);
        assert_eq!(f.chunk(8000, 512, 512, true), 128);
        assert_eq!(f.chunk(8000, 512, 512, false), 512);
        assert_eq!(f.chunk(8000, 300, 512, true), 0);
        // A smaller step budget, the same shares of it.
        assert_eq!(f.chunk(8000, 64, 64, true), 16);
        assert_eq!(f.chunk(10, 64, 64, true), 10);
        assert!(f.admits(0, 0, 80), "a request's first sequences always run");
        assert!(f.admits(3, 240, 80));
        assert!(f.admits(4, 20, 30) && !f.admits(4, 21, 30));
    }

    #[test]
    fn a_sequence_alone_never_preempts_itself_when_it_fits() {
        let mut s = scheduler(2, 8, 100);
        let q = seq(1, 4, 4);
        assert!(s.fits(&q));
        s.add(q);
        for _ in 0..5 {
            let plan = s.schedule(&|_| true);
            assert!(plan.preempted.is_empty());
            run_step(&mut s, &plan);
        }
        assert!(!s.fits(&seq(2, 8, 1)), "9 tokens need 3 blocks of 4");
    }

    #[test]
    fn finished_and_aborted_sequences_free_their_blocks() {
        let mut s = scheduler(8, 1, 100);
        s.add(seq(1, 5, 1));
        s.add(seq(2, 5, 4));
        let plan = s.schedule(&|_| true);
        assert_eq!(s.stats().blocks_used, 2);
        let events = run_step(&mut s, &plan);
        assert_eq!(events[0].finish, Some(FinishReason::Length));
        assert_eq!(s.stats().blocks_used, 0, "max_tokens 1: done and freed");
        s.schedule(&|_| true);
        assert!(s.abort(2));
        assert!(!s.abort(3));
        assert_eq!(s.stats().blocks_used, 0);
        assert!(!s.has_work());
    }

    #[test]
    fn a_shared_prefix_is_computed_once_and_reused_after_its_owner_left() {
        let mut s = scheduler(16, 8, 100);
        let prefix: Vec<u32> = (100..110).collect();
        let with = |tail: &[u32]| [prefix.clone(), tail.to_vec()].concat();
        // Same step: the second sequence takes the first's two full blocks.
        s.add(seq_of(1, with(&[1, 2]), 1));
        s.add(seq_of(2, with(&[3]), 1));
        let plan = s.schedule(&|_| true);
        assert_eq!(chunks(&s), [(1, 12), (2, 3)]);
        assert_eq!(s.running[1].block_table[..2], s.running[0].block_table[..2]);
        let events = run_step(&mut s, &plan);
        assert_eq!(events[0].cached_prompt_tokens, Some(0));
        assert_eq!(events[1].cached_prompt_tokens, Some(8));
        assert_eq!(s.stats().blocks_used, 0);
        // Later, after both finished: found again in the freed blocks.
        s.add(seq_of(3, with(&[4, 5, 6]), 1));
        let plan = s.schedule(&|_| true);
        assert_eq!(chunks(&s), [(3, 5)]);
        run_step(&mut s, &plan);
        // A prompt that is whole blocks still computes its last token.
        s.add(seq_of(4, prefix[..8].to_vec(), 1));
        let plan = s.schedule(&|_| true);
        assert_eq!(chunks(&s), [(4, 4)]);
        run_step(&mut s, &plan);
        let st = s.stats();
        assert_eq!(
            (st.prefix_queries, st.prefix_hits),
            (12 + 11 + 13 + 8, 8 + 8 + 4)
        );
        assert_eq!(st.blocks_used, 0);
    }

    #[test]
    fn a_preempted_sequence_reuses_what_is_still_cached() {
        // 4 blocks of 4: two sequences of 8 prompt tokens fill them.
        let mut s = scheduler(4, 8, 100);
        s.add(seq(1, 8, 4));
        s.add(seq(2, 8, 8));
        let plan = s.schedule(&|_| true);
        run_step(&mut s, &plan);
        // Seq 1's third block preempts seq 2, and evicts its tail block.
        let plan = s.schedule(&|_| true);
        assert_eq!(plan.preempted, [2]);
        run_step(&mut s, &plan);
        // Seq 2 comes back once seq 1 is done, with its head block.
        let readmitted = loop {
            let plan = s.schedule(&|_| true);
            if let Some(q) = s.scheduled().find(|q| q.id == 2) {
                break (q.num_cached, q.chunk);
            }
            run_step(&mut s, &plan);
        };
        assert_eq!(readmitted, (4, 5));
        assert!(s.stats().prefix_hits >= 4);
    }

    #[test]
    fn prompt_scoring_and_caching_off_take_nothing_from_the_cache() {
        let prompt: Vec<u32> = (0..9).collect();
        for (caching, scoring) in [(false, false), (true, true)] {
            let mut s = Scheduler::new(
                SchedulerConfig {
                    max_num_seqs: 8,
                    max_num_batched_tokens: 100,
                    max_step_slowdown: 2.5,
                },
                BlockManager::new(16, 4).with_caching(caching),
            );
            s.add(seq_of(1, prompt.clone(), 1));
            let plan = s.schedule(&|_| true);
            run_step(&mut s, &plan);
            let mut scored = seq_of(2, prompt.clone(), 1);
            scored.params.prompt_logprobs = scoring.then_some(0);
            s.add(scored);
            s.schedule(&|_| true);
            assert_eq!(chunks(&s), [(2, 9)], "caching {caching}, scoring {scoring}");
        }
    }

    #[test]
    fn a_forced_hash_collision_is_not_shared() {
        // Every block hashes alike: only equal tokens after the same parent
        // may be shared.
        let blocks = BlockManager::new(16, 4).with_hash_fn(|_, _, _| 42);
        let mut s = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: 8,
                max_num_batched_tokens: 100,
                max_step_slowdown: 2.5,
            },
            blocks,
        );
        s.add(seq_of(1, (0..9).collect(), 1));
        s.add(seq_of(2, (50..59).collect(), 1));
        s.add(seq_of(3, [0, 1, 2, 3, 60, 61, 62, 63, 64].to_vec(), 1));
        s.add(seq_of(4, (0..9).collect(), 1));
        let plan = s.schedule(&|_| true);
        let cached: Vec<_> = s.running.iter().map(|q| (q.id, q.num_cached)).collect();
        assert_eq!(cached, [(1, 0), (2, 0), (3, 4), (4, 8)]);
        let table = |i: usize| s.running[i].block_table.clone();
        assert_eq!(table(3)[..2], table(0)[..2]);
        assert_eq!(table(2)[0], table(0)[0]);
        assert_ne!(
            table(2)[1],
            table(0)[1],
            "same hash and parent, other tokens"
        );
        run_step(&mut s, &plan);
        assert_eq!(s.stats().blocks_used, 0);
    }

    /// With sliding-window layers: a prompt's next turn finds its last
    /// window cached and computes only what is new; a prefix whose window
    /// blocks were reused while the prompt went on past them is computed
    /// again, its global blocks given back.
    #[test]
    fn a_window_model_reuses_a_prefix_whose_window_is_still_cached() {
        // A window pool of 6 blocks of 4 and chunks of at most 8: a
        // 40-token prompt takes 10 window blocks over its run, so the
        // first ones freed are reused for its last ones.
        let mut s = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: 8,
                max_num_batched_tokens: 8,
                max_step_slowdown: 2.5,
            },
            BlockManager::new(32, 4),
        )
        .with_window(WindowBlocks::new(6, 4, 6, true));
        let prompt: Vec<u32> = (100..140).collect();
        let run = |s: &mut Scheduler, prompt: Vec<u32>, id: SeqId| {
            s.add(seq_of(id, prompt, 1));
            let mut first = None;
            loop {
                let plan = s.schedule(&|_| true);
                first.get_or_insert_with(|| {
                    let q = &s.running[0];
                    (q.num_cached, q.window_table.clone(), s.stats().blocks_used)
                });
                if run_step(s, &plan).iter().any(|e| e.finish.is_some()) {
                    return first.unwrap();
                }
            }
        };
        assert_eq!(run(&mut s, prompt.clone(), 1).0, 0);
        // The whole prompt again and one token: its query at 40 sees from
        // 35, entries 8 and 9, the last two the first run released.
        let (cached, window, _) = run(&mut s, [prompt.clone(), vec![1]].concat(), 2);
        assert_eq!(cached, 40);
        assert!(window[..8].iter().all(|&b| b == FREED));
        assert!(window[8..].iter().all(|&b| b != FREED));
        // 12 tokens of it: their blocks in the global pool are cached, but
        // the window's entries 1 and 2 are long reused.
        let (cached, _, global_used) = run(&mut s, [&prompt[..12], &[2, 3]].concat(), 3);
        assert_eq!(cached, 0);
        assert_eq!(global_used, 2, "the hit's global blocks were given back");
        assert_eq!(s.stats().blocks_used, 0);
        assert_eq!(s.stats().window_blocks_used, 0);
    }

    #[test]
    fn a_failed_step_forgets_the_cache_it_never_computed() {
        let mut s = scheduler(16, 8, 100);
        s.add(seq_of(1, (0..9).collect(), 4));
        let plan = s.schedule(&|_| true);
        let events = s.fail(&plan, "boom");
        assert_eq!(events.len(), 1);
        assert!(matches!(&events[0].finish, Some(FinishReason::Error(m)) if m == "boom"));
        s.add(seq_of(2, (0..9).collect(), 4));
        s.schedule(&|_| true);
        assert_eq!(chunks(&s), [(2, 9)]);
    }
}
