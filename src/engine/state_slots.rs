//! Recurrent-state slots: what a hybrid model's linear-attention layers
//! (Qwen3.5's gated DeltaNet) keep per sequence instead of K/V. Each such
//! layer carries, for one sequence, a causal conv's last `kernel - 1`
//! inputs (`[kernel - 1, conv_dim]`) and the delta rule's state
//! (`[value_heads, key_dim, value_dim]`), all f32, whatever the sequence's
//! length: a fixed-size slot, not blocks.
//!
//! Two halves, as for the KV pool: [`StateSlots`] decides which sequence
//! holds which slot, and is the scheduler's, as the
//! [`BlockManager`](crate::engine::block_manager::BlockManager) is; the
//! memory behind the slots is a [`StateStore`](crate::kv::state_store::StateStore) that the model holds and
//! reads by the slot index each [`SeqSlice`](crate::attention::SeqSlice)
//! carries, as it reads the KV pool by block table.
//!
//! A sequence takes a slot when admitted and gives it back when it
//! finishes, is aborted or is preempted. Preemption recomputes from
//! scratch, so nothing is saved: a slice that starts at position 0 starts
//! from a zero state, whichever slot it has. Between the steps of a chunked
//! prefill the slot keeps the state the last chunk left, so the next chunk
//! carries on from it.
//!
//! A state summarizes a whole prefix and cannot be cut back to a shorter
//! one, so K/V blocks found in the prefix cache would come without the
//! state to go with them: the prefix cache is off for such models.

/// How a hybrid model's memory budget splits between its state slots and
/// its KV pool ([`split_budget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateBudget {
    /// Slots to make: at most `--max-num-seqs`, which they cap when fewer.
    pub num_slots: usize,
    /// Bytes left to the KV pool.
    pub kv_bytes: usize,
}

/// Splits `budget` bytes (`--kv-cache-memory`, or what
/// `--gpu-memory-utilization` leaves) between state slots of `state_bytes`
/// each and a KV pool of blocks of `block_bytes`. The rule: a slot for each
/// of `max_num_seqs` sequences, but no more slots than leave the KV pool at
/// least as many bytes as the slots take, and at least one block per slot;
/// that is, each slot is charged `state_bytes + max(state_bytes,
/// block_bytes)` against the budget, and the slots get at most half of it.
/// A sequence without K/V to grow into is no use, nor is a pool that only
/// the slots' memory keeps from holding longer sequences. The pool gets the
/// rest: `budget - num_slots * state_bytes`.
///
/// A budget that cannot hold one slot so charged is an error (one line,
/// naming the options that raise it).
pub fn split_budget(
    budget: usize,
    state_bytes: usize,
    block_bytes: usize,
    max_num_seqs: usize,
) -> Result<StateBudget, String> {
    let per_slot = state_bytes.saturating_add(state_bytes.max(block_bytes));
    let fit = budget / per_slot.max(1);
    if fit == 0 {
        return Err(format!(
            "a KV budget of {} KiB cannot hold one recurrent-state slot ({} KiB) beside a KV \
             pool at least as large ({} KiB in all); raise --kv-cache-memory (on a GPU, \
             --gpu-memory-utilization)",
            budget >> 10,
            state_bytes >> 10,
            per_slot.div_ceil(1 << 10),
        ));
    }
    let num_slots = max_num_seqs.min(fit);
    Ok(StateBudget {
        num_slots,
        kv_bytes: budget - num_slots * state_bytes,
    })
}

/// Which sequence holds which state slot.
#[derive(Debug, Clone)]
pub struct StateSlots {
    /// Free slots; the last is handed out next.
    free: Vec<u32>,
    num_slots: usize,
}

impl StateSlots {
    pub fn new(num_slots: usize) -> Self {
        StateSlots {
            free: (0..num_slots as u32).rev().collect(),
            num_slots,
        }
    }

    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    pub fn num_used(&self) -> usize {
        self.num_slots - self.free.len()
    }

    /// Gives `slot` a slot unless it holds one; false (and `slot` left
    /// `None`) when none is free.
    pub fn take(&mut self, slot: &mut Option<u32>) -> bool {
        if slot.is_none() {
            *slot = self.free.pop();
        }
        slot.is_some()
    }

    /// Gives back the slot `slot` holds, if any, and empties it.
    pub fn release(&mut self, slot: &mut Option<u32>) {
        if let Some(s) = slot.take() {
            debug_assert!(!self.free.contains(&s), "slot {s} freed twice");
            self.free.push(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::block_manager::BlockManager;
    use crate::engine::scheduler::{Scheduler, SchedulerConfig};
    use crate::engine::sequence::Sequence;
    use crate::engine::step_plan::{RowOutput, StepPlan};
    use crate::sampling::params::SamplingParams;
    use crate::sampling::sampler::SampledToken;

    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;

    #[test]
    fn every_sequence_gets_a_slot_when_the_budget_allows() {
        // 64 slots of 1 MiB take 64 of 512 MiB; the pool gets the rest.
        assert_eq!(
            split_budget(512 * MIB, MIB, 64 * KIB, 64),
            Ok(StateBudget {
                num_slots: 64,
                kv_bytes: 448 * MIB
            })
        );
        // Exactly half the budget is still allowed.
        assert_eq!(
            split_budget(128 * MIB, MIB, 64 * KIB, 64),
            Ok(StateBudget {
                num_slots: 64,
                kv_bytes: 64 * MIB
            })
        );
    }

    #[test]
    fn slots_take_at_most_half_the_budget() {
        // 50 MiB slots (a 9B model's) in 512 MiB: 5, not 256; the pool
        // keeps 262 MiB.
        assert_eq!(
            split_budget(512 * MIB, 50 * MIB, 64 * KIB, 256),
            Ok(StateBudget {
                num_slots: 5,
                kv_bytes: 262 * MIB
            })
        );
        // One byte short of half for 64: 63.
        assert_eq!(
            split_budget(128 * MIB - 1, MIB, KIB, 64).unwrap().num_slots,
            63
        );
    }

    #[test]
    fn each_slot_leaves_at_least_one_block() {
        // Blocks bigger than slots: each slot is charged a block beside it.
        let b = split_budget(100 * KIB, KIB, 9 * KIB, 64).unwrap();
        assert_eq!(b.num_slots, 10);
        assert_eq!(b.kv_bytes, 90 * KIB);
        assert!(b.kv_bytes / (9 * KIB) >= b.num_slots);
    }

    #[test]
    fn a_budget_without_room_for_one_slot_is_an_error_naming_the_options() {
        let err = split_budget(MIB, 600 * KIB, 64 * KIB, 8).unwrap_err();
        assert!(err.contains("1024 KiB") && err.contains("600 KiB"), "{err}");
        assert!(
            err.contains("--kv-cache-memory") && err.contains("--gpu-memory-utilization"),
            "{err}"
        );
        assert!(!err.contains('\n'), "one line: {err}");
        assert!(split_budget(1200 * KIB, 600 * KIB, 64 * KIB, 8).is_ok());
        assert!(split_budget(1200 * KIB - 1, 600 * KIB, 64 * KIB, 8).is_err());
    }

    #[test]
    fn slots_are_taken_until_none_is_free_then_reused() {
        let mut slots = StateSlots::new(2);
        let (mut a, mut b, mut c) = (None, None, None);
        assert!(slots.take(&mut a) && slots.take(&mut b));
        assert_ne!(a, b);
        assert_eq!(slots.num_used(), 2);
        // A holder keeps its slot; none is left for a third.
        let held = a;
        assert!(slots.take(&mut a));
        assert_eq!(a, held);
        assert!(!slots.take(&mut c));
        assert_eq!(c, None);
        slots.release(&mut a);
        assert_eq!((a, slots.num_used()), (None, 1));
        slots.release(&mut a);
        assert_eq!(slots.num_used(), 1, "releasing nothing frees nothing");
        assert!(slots.take(&mut c));
        assert_eq!(c, held, "the freed slot is reused");
    }

    fn seq(id: u64, prompt_len: usize, max_tokens: usize) -> Sequence {
        let params = SamplingParams {
            max_tokens,
            temperature: 0.0,
            ..Default::default()
        };
        Sequence::new(
            id,
            (0..prompt_len as u32).collect::<Vec<u32>>().into(),
            params,
            1 << 20,
            &[],
        )
    }

    fn token(id: u32) -> SampledToken {
        SampledToken {
            id,
            logprob: None,
            top_logprobs: Vec::new(),
        }
    }

    /// Runs `plan` as the engine would: every row that ends its pending
    /// tokens samples token 1.
    fn step(s: &mut Scheduler, plan: &StepPlan) -> Vec<u64> {
        let sampled = plan.rows.iter().map(|r| RowOutput {
            tokens: if r.ends { vec![token(1)] } else { Vec::new() },
            ..RowOutput::default()
        });
        s.update(plan, Ok(sampled.collect()), &[])
            .into_iter()
            .filter(|e| e.finish.is_some())
            .map(|e| e.seq)
            .collect()
    }

    /// Two slots for four sequences: two run, each with its own slot; the
    /// others wait (though blocks and the sequence cap allow them) until a
    /// finished one frees its slot, which the next one takes.
    #[test]
    fn the_scheduler_admits_only_with_a_free_slot_and_frees_it_when_done() {
        let cfg = SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            max_step_slowdown: 0.0,
        };
        let mut s = Scheduler::new(cfg, BlockManager::new(64, 4).with_caching(false))
            .with_states(StateSlots::new(2));
        s.add(seq(1, 5, 1));
        s.add(seq(2, 5, 3));
        s.add(seq(3, 5, 3));
        s.add(seq(4, 5, 3));
        let plan = s.schedule(&|_| true);
        let slots: Vec<_> = s.scheduled().map(|q| (q.id, q.state_slot)).collect();
        assert_eq!(slots.len(), 2);
        assert!(slots.iter().all(|(_, slot)| slot.is_some()));
        assert_ne!(slots[0].1, slots[1].1);
        assert_eq!(s.stats().waiting, 2);
        let freed = s.scheduled().find(|q| q.id == 1).unwrap().state_slot;
        assert_eq!(step(&mut s, &plan), [1], "max_tokens 1");
        s.schedule(&|_| true);
        let third = s.scheduled().find(|q| q.id == 3).map(|q| q.state_slot);
        assert_eq!(third, Some(freed), "seq 3 takes seq 1's slot");
        assert_eq!(s.stats().waiting, 1);
        while s.has_work() {
            let plan = s.schedule(&|_| true);
            step(&mut s, &plan);
        }
        assert_eq!(s.state_slots().map(StateSlots::num_used), Some(0));
    }

    /// A preempted sequence gives its slot back (it starts over), and an
    /// aborted one too.
    #[test]
    fn preemption_and_abort_free_the_slot() {
        let cfg = SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            max_step_slowdown: 0.0,
        };
        // 3 blocks of 4: two sequences of 4 prompt tokens, then each needs
        // a second block for its 5th token.
        let mut s = Scheduler::new(cfg, BlockManager::new(3, 4).with_caching(false))
            .with_states(StateSlots::new(4));
        s.add(seq(1, 4, 8));
        s.add(seq(2, 4, 8));
        let plan = s.schedule(&|_| true);
        step(&mut s, &plan);
        assert_eq!(s.state_slots().unwrap().num_used(), 2);
        let plan = s.schedule(&|_| true);
        assert_eq!(plan.preempted, [2]);
        assert_eq!(s.state_slots().unwrap().num_used(), 1);
        assert!(s.abort(1));
        assert_eq!(s.state_slots().unwrap().num_used(), 0);
    }
}
