//! The KV blocks of sliding-window layers (Gemma 3's local layers): a pool of
//! their own, from which a sequence holds only the blocks its queries can
//! still see. A query at position `p` sees `p + 1 - window..=p`, so once a
//! step's first new token is at `p`, every block wholly before
//! `p + 1 - window` is dead for good and goes back to the pool.
//!
//! A sequence's table keeps one entry per logical block, as the global
//! layers' does, so position `p` stays at entry `p / block_size`; dead
//! entries read [`FREED`]. The attention never reads them: the host kernel
//! starts at the first tile its window touches, and the tensor path masks
//! them (their gather slot is any valid one).
//!
//! Prefix cache: a window block is registered beside the global block of
//! the same positions (the same hash, anchored to that block), and a freed
//! one keeps its content until the pool needs it back, as a global block
//! does. A cached prefix is only of use where the window layers hold every
//! position its next query sees, so a hit found in the global pool is cut
//! back to the longest one whose window is all still here
//! ([`WindowBlocks::share_hit`]); a conversation's next turn finds the
//! window its last turn ended with.

use crate::engine::block_manager::{Anchor, BlockHash, BlockManager};
use crate::kv::{BlockId, FREED};

/// How a KV budget of `budget` bytes splits between the global layers
/// (returned first, blocks per layer) and the sliding-window ones, each
/// given as (layers, bytes of one layer's block): the two may hold heads of
/// different sizes (Gemma 4's). llama.cpp's rule: the window pool holds
/// what every sequence the server runs at once can hold there
/// (`window_need`), the global layers the rest; never more window blocks
/// than global ones, which is where a short-context load leaves them equal.
pub fn split_budget(
    budget: usize,
    (global_layers, global_bytes): (usize, usize),
    (window_layers, window_bytes): (usize, usize),
    window_need: usize,
) -> (usize, usize) {
    let equal = budget / (global_layers * global_bytes + window_layers * window_bytes);
    if global_layers == 0 || window_need >= equal {
        return (equal, equal);
    }
    (
        (budget - window_layers * window_need * window_bytes) / (global_layers * global_bytes),
        window_need,
    )
}

pub struct WindowBlocks {
    blocks: BlockManager,
    window: usize,
}

impl WindowBlocks {
    pub fn new(num_blocks: usize, block_size: usize, window: usize, caching: bool) -> Self {
        assert!(window > 0, "a sliding window holds at least one position");
        WindowBlocks {
            blocks: BlockManager::new(num_blocks, block_size).with_caching(caching),
            window,
        }
    }

    /// Entries wholly before what a query at `first_pos` sees: the block
    /// holding `first_pos + 1 - window` is the first one it needs.
    fn dead_before(&self, first_pos: usize) -> usize {
        (first_pos + 1).saturating_sub(self.window) / self.blocks.block_size()
    }

    /// Most blocks one sequence can hold: a window plus a step's `chunk`
    /// new tokens, one block more for where they straddle block edges;
    /// never more than its whole length needs.
    pub fn held_at_most(window: usize, block_size: usize, chunk: usize, max_len: usize) -> usize {
        ((window + chunk).div_ceil(block_size) + 1).min(max_len.div_ceil(block_size))
    }

    /// [`Self::held_at_most`] in this pool.
    pub fn held_by(&self, chunk: usize, max_len: usize) -> usize {
        Self::held_at_most(self.window, self.blocks.block_size(), chunk, max_len)
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.num_blocks()
    }

    pub fn num_used(&self) -> usize {
        self.blocks.num_used()
    }

    /// Frees the blocks of `table` that no query from `first_pos` on can
    /// see, then grows it to hold `num_tokens`. The growth is all or
    /// nothing, as [`BlockManager::grow`]'s; the freeing stands either way
    /// (those blocks are dead whatever happens next).
    pub fn advance(
        &mut self,
        table: &mut Vec<BlockId>,
        first_pos: usize,
        num_tokens: usize,
    ) -> bool {
        let dead = self.dead_before(first_pos);
        for entry in table.iter_mut().take(dead).filter(|b| **b != FREED) {
            self.blocks.release(&mut vec![*entry]);
            *entry = FREED;
        }
        self.blocks.grow(table, num_tokens)
    }

    /// Gives back every block `table` still holds, and empties it.
    pub fn release(&mut self, table: &mut Vec<BlockId>) {
        table.retain(|&b| b != FREED);
        self.blocks.release(table);
    }

    /// The cached window block of the positions global block `beside`
    /// holds, with that block's `hash`, `tokens` and `keys`.
    pub fn lookup(
        &self,
        hash: BlockHash,
        beside: Anchor,
        tokens: &[u32],
        keys: &[u64],
    ) -> Option<BlockId> {
        self.blocks.lookup_after(hash, Some(beside), tokens, keys)
    }

    /// Registers entry `i` of `table` beside global block `beside`, unless
    /// the entry has left the window.
    pub fn register(
        &mut self,
        table: &[BlockId],
        i: usize,
        hash: BlockHash,
        beside: Anchor,
        tokens: &[u32],
        keys: &[u64],
    ) {
        if table[i] != FREED {
            self.blocks
                .register_after(table[i], hash, Some(beside), tokens, keys);
        }
    }

    /// Of a global hit of `found.len()` blocks, where `found[i]` is the
    /// cached window block beside its block `i`, the longest leading run
    /// whose next query finds every window block it sees: those are
    /// shared into the empty `table` (the ones before them [`FREED`]), and
    /// its length in blocks is returned.
    pub fn share_hit(&mut self, table: &mut Vec<BlockId>, found: &[Option<BlockId>]) -> usize {
        debug_assert!(table.is_empty());
        let bs = self.blocks.block_size();
        let whole = |m: usize| {
            found[self.dead_before(m * bs)..m]
                .iter()
                .all(Option::is_some)
        };
        let kept = (0..=found.len()).rev().find(|&m| whole(m)).unwrap_or(0);
        let dead = self.dead_before(kept * bs);
        table.extend(std::iter::repeat_n(FREED, dead));
        for block in found[dead..kept].iter().flatten() {
            self.blocks.share(*block);
            table.push(*block);
        }
        kept
    }

    /// Drops every cached window block (after a failed step).
    pub fn forget_all(&mut self) {
        self.blocks.forget_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3 1B's 22 window layers and 4 global ones: a few sequences'
    /// windows leave most of the budget to the global layers; many
    /// sequences' windows (or no global layer) split it evenly.
    #[test]
    fn the_budget_goes_to_global_layers_past_the_windows_needed() {
        let (global, window) = split_budget(26_000, (4, 1), (22, 1), 4 * 34);
        assert_eq!(window, 136);
        assert_eq!(global, (26_000 - 22 * 136) / 4);
        assert!(4 * global + 22 * window <= 26_000);
        assert_eq!(
            split_budget(26_000, (4, 1), (22, 1), 256 * 34),
            (1000, 1000)
        );
        assert_eq!(split_budget(26_000, (0, 1), (26, 1), 10), (1000, 1000));
        // Global blocks twice the window's bytes (heads twice as wide).
        let (global, window) = split_budget(60_000, (2, 2), (4, 1), 100);
        assert_eq!((global, window), ((60_000 - 4 * 100) / 4, 100));
        assert!(2 * 2 * global + 4 * window <= 60_000);
        assert_eq!(split_budget(8_000, (2, 2), (4, 1), 5_000), (1000, 1000));
    }

    /// A sequence decoding far past its window never holds more than the
    /// window's blocks (plus the one being filled), and what it holds
    /// covers every position its next query sees.
    #[test]
    fn decode_holds_only_the_window() {
        let (bs, window) = (4, 10);
        let mut w = WindowBlocks::new(8, bs, window, false);
        let mut table = Vec::new();
        for pos in 0..200 {
            assert!(
                w.advance(&mut table, pos, pos + 1),
                "out of blocks at {pos}"
            );
            assert_eq!(table.len(), pos / bs + 1);
            let live: Vec<usize> = (0..table.len()).filter(|&b| table[b] != FREED).collect();
            assert!(live.len() <= WindowBlocks::held_at_most(window, bs, 1, pos + 1));
            // Every position pos + 1 - window..=pos has its block.
            for p in (pos + 1).saturating_sub(window)..=pos {
                assert!(live.contains(&(p / bs)), "position {p} lost at {pos}");
            }
            assert_eq!(w.num_used(), live.len());
        }
        w.release(&mut table);
        assert!(table.is_empty());
        assert_eq!(w.num_used(), 0);
    }

    /// A prompt chunk keeps the window before its first token; a growth the
    /// pool cannot supply allocates nothing, yet the dead blocks are freed.
    #[test]
    fn chunks_keep_the_window_before_them_and_growth_is_all_or_nothing() {
        let (bs, window) = (4, 6);
        let mut w = WindowBlocks::new(6, bs, window, false);
        let mut table = Vec::new();
        assert!(w.advance(&mut table, 0, 16));
        assert_eq!(w.num_used(), 4);
        // The next chunk starts at 16 and sees from 11: blocks 0 and 1 die.
        assert!(w.advance(&mut table, 16, 24));
        assert_eq!(&table[..2], &[FREED, FREED]);
        assert_eq!(w.num_used(), 4);
        // 24..48 would need 6 more blocks with 2 free after freeing 2: no.
        assert!(!w.advance(&mut table, 24, 48));
        assert_eq!(table.len(), 6);
        assert_eq!(table[..4].iter().filter(|&&b| b == FREED).count(), 4);
        assert_eq!(w.num_used(), 2);
        assert_eq!(WindowBlocks::held_at_most(window, bs, 8, 1000), 5);
        assert_eq!(WindowBlocks::held_at_most(window, bs, 8, 5), 2);
    }

    /// A global hit keeps only as many blocks as leave the next query its
    /// whole window: with entry 3 of 5 gone, a hit of 5 or 4 blocks would
    /// need it, one of 3 does not.
    #[test]
    fn a_hit_is_cut_back_to_where_its_window_is_cached() {
        let (bs, window) = (4, 6);
        let mut w = WindowBlocks::new(8, bs, window, true);
        let mut table = Vec::new();
        assert!(w.advance(&mut table, 0, 20));
        let tokens = |i: u32| [4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3];
        let beside = |i: usize| (i as BlockId + 100, 1);
        for i in 0..5 {
            w.register(&table, i, i as u64, beside(i), &tokens(i as u32), &[]);
        }
        let written = table.clone();
        w.release(&mut table);
        assert_eq!(w.num_used(), 0);
        let found = |w: &WindowBlocks, skip: Option<usize>| -> Vec<Option<BlockId>> {
            (0..5)
                .map(|i| {
                    let hit = w.lookup(i as u64, beside(i), &tokens(i as u32), &[]);
                    hit.filter(|_| Some(i) != skip)
                })
                .collect()
        };
        // Another global block beside, or other tokens: no match.
        assert_eq!(w.lookup(0, (100, 2), &tokens(0), &[]), None);
        assert_eq!(w.lookup(0, beside(0), &tokens(1), &[]), None);
        // All there: a query at 20 sees from 15, entries 3 and 4.
        let mut hit = Vec::new();
        assert_eq!(w.share_hit(&mut hit, &found(&w, None)), 5);
        assert_eq!(hit, [FREED, FREED, FREED, written[3], written[4]]);
        assert_eq!(w.num_used(), 2);
        w.release(&mut hit);
        // Entry 3 gone: at 16 the query sees from 11 (entries 2, 3), so
        // the hit stops at 12, seeing from 7 (entries 1, 2).
        let mut hit = Vec::new();
        assert_eq!(w.share_hit(&mut hit, &found(&w, Some(3))), 3);
        assert_eq!(hit, [FREED, written[1], written[2]]);
        w.release(&mut hit);
        // Entry 0 gone: nothing short of a whole block needs it but 1 and
        // 2 blocks' windows do.
        let mut hit = Vec::new();
        assert_eq!(w.share_hit(&mut hit, &found(&w, Some(0))[..2]), 0);
        assert!(hit.is_empty());
        assert_eq!(w.num_used(), 0);
    }
}
