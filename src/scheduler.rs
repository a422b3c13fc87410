//! Continuous-batching policy: which sequences run this step and with how
//! many tokens. Running sequences go first (a decode token each, or the next
//! chunk of a long prompt), then waiting ones are admitted while the token
//! budget, the sequence cap and the KV pool allow. When the pool runs dry the
//! most recently admitted sequence is preempted: its blocks are freed and it
//! goes back to the head of the queue to be recomputed later.

use std::collections::VecDeque;

use crate::block_manager::BlockManager;
use crate::sequence::{SeqId, Sequence};

#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Most sequences in the running batch.
    pub max_num_seqs: usize,
    /// Most tokens (prefill chunks plus decode rows) in one forward pass.
    pub max_num_batched_tokens: usize,
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    pub blocks: BlockManager,
    pub waiting: VecDeque<Sequence>,
    /// In admission order: the last one is the first to be preempted.
    pub running: Vec<Sequence>,
    pub num_preemptions: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, blocks: BlockManager) -> Self {
        Scheduler {
            cfg,
            blocks,
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions: 0,
        }
    }

    /// Whether a sequence could ever run: its longest possible length fits
    /// the whole pool (so alone it can never be preempted).
    pub fn fits(&self, seq: &Sequence) -> bool {
        self.blocks.blocks_for(seq.max_len) <= self.blocks.num_blocks()
    }

    /// Waiting sequences beyond the free sequence slots: those the next
    /// step could not admit even with tokens and blocks to spare. A burst
    /// that fits the free slots is not a queue.
    pub fn num_queued(&self) -> usize {
        let free = self.cfg.max_num_seqs.saturating_sub(self.running.len());
        self.waiting.len().saturating_sub(free)
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Sets `chunk` on every running sequence for this step (0 = sits out),
    /// admitting and preempting as needed. Returns the ids preempted.
    pub fn schedule(&mut self) -> Vec<SeqId> {
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut preempted = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            let chunk = self.running[i].pending().min(budget);
            self.running[i].chunk = 0;
            if chunk == 0 {
                i += 1;
                continue;
            }
            loop {
                let seq = &mut self.running[i];
                if self
                    .blocks
                    .grow(&mut seq.block_table, seq.num_cached + chunk)
                {
                    seq.chunk = chunk;
                    budget -= chunk;
                    i += 1;
                    break;
                }
                // Out of blocks: evict the newest sequence (possibly this one).
                let victim = self.running.len() - 1;
                preempted.push(self.preempt(victim));
                if victim == i {
                    break;
                }
            }
        }
        if preempted.is_empty() {
            self.admit(budget);
        }
        preempted
    }

    fn admit(&mut self, mut budget: usize) {
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(seq) = self.waiting.front_mut() else {
                break;
            };
            let chunk = seq.pending().min(budget);
            if !self
                .blocks
                .grow(&mut seq.block_table, seq.num_cached + chunk)
            {
                break;
            }
            seq.chunk = chunk;
            budget -= chunk;
            let seq = self.waiting.pop_front().expect("front exists");
            self.running.push(seq);
        }
    }

    fn preempt(&mut self, index: usize) -> SeqId {
        let mut seq = self.running.remove(index);
        self.blocks.release(&mut seq.block_table);
        seq.num_cached = 0;
        seq.chunk = 0;
        self.num_preemptions += 1;
        let id = seq.id;
        self.waiting.push_front(seq);
        id
    }

    /// Removes a sequence wherever it is, freeing its blocks.
    pub fn remove(&mut self, id: SeqId) -> Option<Sequence> {
        let mut seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else {
            let i = self.waiting.iter().position(|s| s.id == id)?;
            self.waiting.remove(i)?
        };
        self.blocks.release(&mut seq.block_table);
        Some(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling_params::SamplingParams;

    fn seq(id: SeqId, prompt_len: usize, max_tokens: usize) -> Sequence {
        let params = SamplingParams {
            max_tokens,
            temperature: 0.0,
            ..Default::default()
        };
        Sequence::new(id, vec![1; prompt_len], params, 1 << 20, &[])
    }

    fn scheduler(num_blocks: usize, max_num_seqs: usize, max_tokens: usize) -> Scheduler {
        Scheduler::new(
            SchedulerConfig {
                max_num_seqs,
                max_num_batched_tokens: max_tokens,
            },
            BlockManager::new(num_blocks, 4),
        )
    }

    /// Pretends the step ran: cached tokens advance and finished prompts get a
    /// sampled token.
    fn run_step(s: &mut Scheduler) {
        for seq in s.running.iter_mut() {
            seq.num_cached += seq.chunk;
            if seq.chunk > 0 && seq.num_cached == seq.len() {
                seq.tokens.push(7);
            }
        }
    }

    #[test]
    fn long_prompts_are_chunked_under_the_token_budget() {
        let mut s = scheduler(64, 8, 10);
        s.waiting.push_back(seq(1, 25, 4));
        s.waiting.push_back(seq(2, 3, 4));
        s.schedule();
        assert_eq!(s.running.len(), 1);
        assert_eq!(s.running[0].chunk, 10);
        run_step(&mut s);
        s.schedule();
        assert_eq!(s.running[0].chunk, 10);
        run_step(&mut s);
        s.schedule();
        // 5 prompt tokens left for seq 1, then seq 2 is admitted with its 3.
        assert_eq!((s.running[0].chunk, s.running[1].chunk), (5, 3));
        run_step(&mut s);
        s.schedule();
        assert_eq!(
            (s.running[0].chunk, s.running[1].chunk),
            (1, 1),
            "both decode"
        );
    }

    #[test]
    fn max_num_seqs_caps_the_batch() {
        let mut s = scheduler(64, 2, 100);
        for id in 0..3 {
            s.waiting.push_back(seq(id, 2, 4));
        }
        s.schedule();
        assert_eq!(s.running.len(), 2);
        assert_eq!(s.waiting.len(), 1);
    }

    #[test]
    fn only_waiting_beyond_the_free_slots_counts_as_queued() {
        let mut s = scheduler(64, 3, 100);
        for id in 0..5 {
            s.waiting.push_back(seq(id, 2, 4));
        }
        assert_eq!(s.num_queued(), 2, "3 of the 5 have a free slot");
        s.schedule();
        assert_eq!((s.running.len(), s.waiting.len()), (3, 2));
        assert_eq!(s.num_queued(), 2);
        s.remove(0);
        assert_eq!(s.num_queued(), 1);
    }

    #[test]
    fn out_of_blocks_preempts_the_newest_and_requeues_it_first() {
        // 3 blocks of 4 tokens; two sequences of 4 prompt tokens fill 2 blocks.
        let mut s = scheduler(3, 8, 100);
        s.waiting.push_back(seq(1, 4, 8));
        s.waiting.push_back(seq(2, 4, 8));
        s.waiting.push_back(seq(3, 4, 8));
        s.schedule();
        assert_eq!(s.running.len(), 3);
        run_step(&mut s);
        // Each now needs a second block for its 5th token: only seq 1 gets one
        // after seqs 3 and 2 are preempted, newest first.
        let preempted = s.schedule();
        assert_eq!(preempted, vec![3, 2]);
        assert_eq!(s.running.len(), 1);
        assert_eq!(s.running[0].chunk, 1);
        assert_eq!(
            s.waiting.iter().map(|q| q.id).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert!(s
            .waiting
            .iter()
            .all(|q| q.num_cached == 0 && q.block_table.is_empty()));
        assert_eq!(s.num_preemptions, 2);
        // No admissions in a step that preempted.
        assert_eq!(s.blocks.num_used(), 2);
    }

    #[test]
    fn a_sequence_alone_never_preempts_itself_when_it_fits() {
        let mut s = scheduler(2, 8, 100);
        let q = seq(1, 4, 4);
        assert!(s.fits(&q));
        s.waiting.push_back(q);
        for _ in 0..5 {
            assert!(s.schedule().is_empty());
            run_step(&mut s);
        }
        assert!(!s.fits(&seq(2, 8, 1)), "9 tokens need 3 blocks of 4");
    }

    #[test]
    fn remove_frees_blocks_from_either_queue() {
        let mut s = scheduler(8, 1, 100);
        s.waiting.push_back(seq(1, 5, 4));
        s.waiting.push_back(seq(2, 5, 4));
        s.schedule();
        assert_eq!(s.blocks.num_used(), 2);
        assert!(s.remove(1).is_some());
        assert!(s.remove(2).is_some());
        assert!(s.remove(3).is_none());
        assert_eq!(s.blocks.num_free(), 8);
        assert!(!s.has_work());
    }
}
