//! Allocation of KV-cache blocks: reference counts, and the prefix cache.
//!
//! The manager only hands out block numbers; the memory behind them lives in
//! [`crate::kv::cache::KvCache`]. A block shared by several sequences (a
//! common prefix) returns to the pool when its last holder releases it.
//!
//! Prefix cache (vLLM's automatic prefix caching): a full block can be
//! registered under a hash of its tokens chained from its parent block's.
//! Freed, it keeps its content and stays findable until the pool needs it
//! back; blocks without content are reused first, then cached ones, least
//! recently freed first. A lookup shares a block only if its tokens and
//! extra keys (a prompt's cache salt and media, [`crate::engine::prompt`])
//! equal the asker's and its parent is the very block the asker matched
//! before it, in the same incarnation: the hash only finds candidates, so a
//! hash collision can never hand out another prefix's K/V.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use crate::kv::BlockId;

/// A full block's content hash, chained from its parent's.
pub type BlockHash = u64;

/// Hashes a block's tokens and extra keys after its parent's hash.
pub type HashFn = fn(Option<BlockHash>, &[u32], &[u64]) -> BlockHash;

/// The hash wick uses: SipHash with fixed keys, the same in every process.
/// A block without extra keys hashes its tokens alone.
pub fn block_hash(parent: Option<BlockHash>, tokens: &[u32], keys: &[u64]) -> BlockHash {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    if !keys.is_empty() {
        keys.hash(&mut h);
    }
    h.finish()
}

/// A block in one incarnation (its content between two allocations): what
/// a cached block was computed after. In the global pool that is its
/// parent; a sliding-window pool's block names the global block computed
/// beside it ([`crate::engine::window_blocks`]).
pub type Anchor = (BlockId, u64);

/// What a registered block holds, to check a lookup against.
struct Cached {
    hash: BlockHash,
    /// What it was computed after.
    after: Option<Anchor>,
    tokens: Box<[u32]>,
    keys: Box<[u64]>,
}

pub struct BlockManager {
    block_size: usize,
    ref_counts: Vec<u32>,
    /// Per block: how many times it has been handed out with new content.
    incarnation: Vec<u64>,
    cached: Vec<Option<Cached>>,
    /// Registered blocks by hash. Usually one each; more after a collision,
    /// or when a prefix was computed again because its first copy went
    /// stale (a parent evicted).
    by_hash: HashMap<BlockHash, Vec<BlockId>>,
    /// Free blocks without content, popped from the end: the most recently
    /// freed block is reused first, while its memory is still warm in cache.
    empty: Vec<BlockId>,
    /// Free blocks that keep cached content, by when they were freed.
    evictable: BTreeMap<u64, BlockId>,
    /// Per block: its key in `evictable` while it is there.
    freed_at: Vec<u64>,
    clock: u64,
    caching: bool,
    hash_fn: HashFn,
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "block size must be positive");
        BlockManager {
            block_size,
            ref_counts: vec![0; num_blocks],
            incarnation: vec![0; num_blocks],
            cached: (0..num_blocks).map(|_| None).collect(),
            by_hash: HashMap::new(),
            empty: (0..num_blocks as BlockId).rev().collect(),
            evictable: BTreeMap::new(),
            freed_at: vec![0; num_blocks],
            clock: 0,
            caching: true,
            hash_fn: block_hash,
        }
    }

    /// With prefix caching off, nothing is registered and lookups miss.
    pub fn with_caching(mut self, caching: bool) -> Self {
        self.caching = caching;
        self
    }

    /// Another hash function (tests force collisions with it).
    pub fn with_hash_fn(mut self, hash_fn: HashFn) -> Self {
        self.hash_fn = hash_fn;
        self
    }

    pub fn caching(&self) -> bool {
        self.caching
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks no sequence holds (cached content may still be reused).
    pub fn num_free(&self) -> usize {
        self.empty.len() + self.evictable.len()
    }

    pub fn num_used(&self) -> usize {
        self.num_blocks() - self.num_free()
    }

    /// Free blocks that still hold a cached prefix.
    pub fn num_cached_free(&self) -> usize {
        self.evictable.len()
    }

    /// Blocks a sequence of `num_tokens` tokens occupies.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// A free block for new content: an empty one, else the least recently
    /// freed cached one, whose content is then forgotten.
    fn take_free(&mut self) -> BlockId {
        let block = match self.empty.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.evictable.pop_first().expect("caller checked num_free");
                self.forget(b);
                b
            }
        };
        self.ref_counts[block as usize] = 1;
        self.incarnation[block as usize] += 1;
        block
    }

    fn forget(&mut self, block: BlockId) {
        let Some(c) = self.cached[block as usize].take() else {
            return;
        };
        if let Some(blocks) = self.by_hash.get_mut(&c.hash) {
            blocks.retain(|&b| b != block);
            if blocks.is_empty() {
                self.by_hash.remove(&c.hash);
            }
        }
    }

    /// Grows `table` so it can hold `num_tokens` tokens. All or nothing: when
    /// the pool cannot supply every missing block, nothing is allocated and
    /// `false` is returned so the caller can preempt or wait.
    pub fn grow(&mut self, table: &mut Vec<BlockId>, num_tokens: usize) -> bool {
        let needed = self.blocks_for(num_tokens).saturating_sub(table.len());
        if needed > self.num_free() {
            return false;
        }
        for _ in 0..needed {
            let block = self.take_free();
            table.push(block);
        }
        true
    }

    /// Another holder of `block` (a sequence sharing a prefix); a cached
    /// block nobody held leaves the eviction queue.
    pub fn share(&mut self, block: BlockId) {
        let rc = &mut self.ref_counts[block as usize];
        if *rc == 0 {
            let at = self.freed_at[block as usize];
            let taken = self.evictable.remove(&at);
            assert_eq!(
                taken,
                Some(block),
                "sharing a free block {block} with no content"
            );
        }
        self.ref_counts[block as usize] += 1;
    }

    /// Releases every block of `table` and empties it. Last block first, so
    /// the tail of a prefix is evicted before its head, which more
    /// sequences share and without which the tail is of no use.
    pub fn release(&mut self, table: &mut Vec<BlockId>) {
        for block in table.drain(..).rev() {
            let rc = &mut self.ref_counts[block as usize];
            assert!(*rc > 0, "double free of block {block}");
            *rc -= 1;
            if *rc > 0 {
                continue;
            }
            if self.cached[block as usize].is_some() {
                self.clock += 1;
                self.freed_at[block as usize] = self.clock;
                self.evictable.insert(self.clock, block);
            } else {
                self.empty.push(block);
            }
        }
    }

    /// The hash of a full block of `tokens` with extra `keys` after a block
    /// hashed `parent`.
    pub fn hash(&self, parent: Option<BlockHash>, tokens: &[u32], keys: &[u64]) -> BlockHash {
        (self.hash_fn)(parent, tokens, keys)
    }

    /// `block` in its present incarnation.
    pub fn anchor(&self, block: BlockId) -> Anchor {
        (block, self.incarnation[block as usize])
    }

    /// The cached block holding `tokens` with `keys` right after block
    /// `parent` (the first block when `None`), if any: same hash, same
    /// tokens and keys, and computed after that very parent.
    pub fn lookup(
        &self,
        hash: BlockHash,
        parent: Option<BlockId>,
        tokens: &[u32],
        keys: &[u64],
    ) -> Option<BlockId> {
        self.lookup_after(hash, parent.map(|p| self.anchor(p)), tokens, keys)
    }

    /// [`Self::lookup`] with what the block was computed after given as
    /// an anchor, which may be in another pool.
    pub fn lookup_after(
        &self,
        hash: BlockHash,
        after: Option<Anchor>,
        tokens: &[u32],
        keys: &[u64],
    ) -> Option<BlockId> {
        if !self.caching {
            return None;
        }
        self.by_hash.get(&hash)?.iter().copied().find(|&b| {
            self.cached[b as usize]
                .as_ref()
                .is_some_and(|c| c.after == after && *c.tokens == *tokens && *c.keys == *keys)
        })
    }

    /// Records that `block`, held by the caller, holds the full block of
    /// `tokens` with `keys` after `parent`.
    pub fn register(
        &mut self,
        block: BlockId,
        hash: BlockHash,
        parent: Option<BlockId>,
        tokens: &[u32],
        keys: &[u64],
    ) {
        let after = parent.map(|p| self.anchor(p));
        self.register_after(block, hash, after, tokens, keys);
    }

    /// [`Self::register`] with what the block was computed after given as
    /// an anchor, which may be in another pool.
    pub fn register_after(
        &mut self,
        block: BlockId,
        hash: BlockHash,
        after: Option<Anchor>,
        tokens: &[u32],
        keys: &[u64],
    ) {
        if !self.caching || self.cached[block as usize].is_some() {
            return;
        }
        debug_assert_eq!(tokens.len(), self.block_size);
        self.by_hash.entry(hash).or_default().push(block);
        self.cached[block as usize] = Some(Cached {
            hash,
            after,
            tokens: tokens.into(),
            keys: keys.into(),
        });
    }

    /// Drops every cached prefix (after a failed step, when registered
    /// blocks may never have been computed).
    pub fn forget_all(&mut self) {
        for b in 0..self.num_blocks() as BlockId {
            self.forget(b);
        }
        let evicted: Vec<BlockId> = std::mem::take(&mut self.evictable).into_values().collect();
        self.empty.extend(evicted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grow_allocates_only_missing_blocks() {
        let mut bm = BlockManager::new(4, 16);
        let mut table = Vec::new();
        assert!(bm.grow(&mut table, 1));
        assert_eq!(table.len(), 1);
        assert!(bm.grow(&mut table, 16));
        assert_eq!(table.len(), 1, "16 tokens still fit one block");
        assert!(bm.grow(&mut table, 17));
        assert_eq!(table.len(), 2);
        assert_eq!(bm.num_free(), 2);
        let mut unique = table.clone();
        unique.dedup();
        assert_eq!(unique.len(), 2);
    }

    #[test]
    fn grow_is_all_or_nothing() {
        let mut bm = BlockManager::new(3, 4);
        let mut a = Vec::new();
        assert!(bm.grow(&mut a, 8));
        let mut b = Vec::new();
        assert!(!bm.grow(&mut b, 8), "needs 2 blocks, only 1 free");
        assert!(b.is_empty());
        assert_eq!(bm.num_free(), 1);
        assert!(bm.grow(&mut b, 4));
        assert_eq!(bm.num_free(), 0);
    }

    #[test]
    fn release_returns_every_block() {
        let mut bm = BlockManager::new(8, 2);
        let mut tables: Vec<Vec<BlockId>> = (0..3).map(|_| Vec::new()).collect();
        for (i, t) in tables.iter_mut().enumerate() {
            assert!(bm.grow(t, 2 * i + 1));
        }
        assert_eq!(bm.num_used(), 1 + 2 + 3);
        for t in tables.iter_mut() {
            bm.release(t);
            assert!(t.is_empty());
        }
        assert_eq!(bm.num_free(), 8);
    }

    #[test]
    fn shared_block_is_freed_by_its_last_holder() {
        let mut bm = BlockManager::new(2, 4);
        let mut a = Vec::new();
        assert!(bm.grow(&mut a, 4));
        let mut b = a.clone();
        bm.share(b[0]);
        bm.release(&mut a);
        assert_eq!(bm.num_free(), 1, "b still holds the block");
        bm.release(&mut b);
        assert_eq!(bm.num_free(), 2);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_is_caught() {
        let mut bm = BlockManager::new(1, 4);
        let mut a = Vec::new();
        assert!(bm.grow(&mut a, 1));
        let mut copy = a.clone();
        bm.release(&mut a);
        bm.release(&mut copy);
    }

    /// One sequence's two full blocks, registered as they would be.
    fn cache_two_blocks(bm: &mut BlockManager, tokens: &[u32]) -> (Vec<BlockId>, [BlockHash; 2]) {
        let mut table = Vec::new();
        assert!(bm.grow(&mut table, 8));
        let h0 = bm.hash(None, &tokens[..4], &[]);
        bm.register(table[0], h0, None, &tokens[..4], &[]);
        let h1 = bm.hash(Some(h0), &tokens[4..8], &[]);
        bm.register(table[1], h1, Some(table[0]), &tokens[4..8], &[]);
        (table, [h0, h1])
    }

    #[test]
    fn freed_cached_blocks_are_found_shared_and_evicted_last() {
        let mut bm = BlockManager::new(4, 4);
        let tokens = [1, 2, 3, 4, 5, 6, 7, 8];
        let (mut table, [h0, h1]) = cache_two_blocks(&mut bm, &tokens);
        let blocks = table.clone();
        bm.release(&mut table);
        assert_eq!((bm.num_free(), bm.num_cached_free()), (4, 2));
        // Found again after the holder left, and shared out of the free pool.
        assert_eq!(bm.lookup(h0, None, &tokens[..4], &[]), Some(blocks[0]));
        assert_eq!(
            bm.lookup(h1, Some(blocks[0]), &tokens[4..], &[]),
            Some(blocks[1])
        );
        bm.share(blocks[0]);
        assert_eq!((bm.num_free(), bm.num_cached_free()), (3, 1));
        // New content takes the two empty blocks first, then evicts the
        // cached block nobody holds.
        let mut other = Vec::new();
        assert!(bm.grow(&mut other, 8));
        assert_eq!(
            bm.lookup(h1, Some(blocks[0]), &tokens[4..], &[]),
            Some(blocks[1])
        );
        assert!(bm.grow(&mut other, 12));
        assert_eq!(other[2], blocks[1], "the least recently freed cached block");
        assert_eq!(bm.lookup(h1, Some(blocks[0]), &tokens[4..], &[]), None);
        assert_eq!(
            bm.lookup(h0, None, &tokens[..4], &[]),
            Some(blocks[0]),
            "still held"
        );
    }

    #[test]
    fn a_hash_collision_is_not_shared() {
        // Every block hashes alike: only the tokens and the parent decide.
        let mut bm = BlockManager::new(8, 4).with_hash_fn(|_, _, _| 7);
        let (table, [h0, h1]) = cache_two_blocks(&mut bm, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!((h0, h1), (7, 7));
        assert_eq!(bm.lookup(7, None, &[1, 2, 3, 4], &[]), Some(table[0]));
        assert_eq!(bm.lookup(7, None, &[1, 2, 3, 9], &[]), None, "other tokens");
        // Same tokens as the second block, but after another parent.
        let mut elsewhere = Vec::new();
        assert!(bm.grow(&mut elsewhere, 4));
        assert_eq!(bm.lookup(7, Some(elsewhere[0]), &[5, 6, 7, 8], &[]), None);
    }

    /// Extra keys (a salt, an image) set equal tokens apart: in the hash,
    /// and in the lookup even when the hashes collide. A block without
    /// keys hashes as its tokens alone.
    #[test]
    fn extra_keys_set_equal_tokens_apart() {
        let tokens = [1, 2, 3, 4];
        let plain = block_hash(None, &tokens, &[]);
        let keyed = block_hash(None, &tokens, &[5]);
        assert_ne!(plain, keyed);
        assert_ne!(keyed, block_hash(None, &tokens, &[6]));
        let mut h = std::collections::hash_map::DefaultHasher::new();
        None::<BlockHash>.hash(&mut h);
        tokens.hash(&mut h);
        assert_eq!(plain, h.finish());
        // The chain carries a first block's key into every later hash.
        let after = |parent| block_hash(Some(parent), &[9, 9, 9, 9], &[]);
        assert_ne!(after(plain), after(keyed));

        let mut bm = BlockManager::new(4, 4).with_hash_fn(|_, _, _| 7);
        let mut table = Vec::new();
        assert!(bm.grow(&mut table, 4));
        bm.register(table[0], 7, None, &tokens, &[5]);
        assert_eq!(bm.lookup(7, None, &tokens, &[5]), Some(table[0]));
        assert_eq!(bm.lookup(7, None, &tokens, &[]), None);
        assert_eq!(bm.lookup(7, None, &tokens, &[6]), None);
    }

    #[test]
    fn a_reused_parent_invalidates_its_children() {
        let mut bm = BlockManager::new(2, 4);
        let tokens = [1, 2, 3, 4, 5, 6, 7, 8];
        let (mut table, [h0, h1]) = cache_two_blocks(&mut bm, &tokens);
        let (parent, child) = (table[0], table[1]);
        bm.release(&mut table);
        // With the child held, new content can only evict the parent, which
        // comes back with the same tokens: the child, computed after the
        // old incarnation, is stale.
        bm.share(child);
        let mut again = Vec::new();
        assert!(bm.grow(&mut again, 4));
        assert_eq!(again[0], parent);
        bm.register(parent, h0, None, &tokens[..4], &[]);
        assert_eq!(bm.lookup(h0, None, &tokens[..4], &[]), Some(parent));
        assert_eq!(bm.lookup(h1, Some(parent), &tokens[4..], &[]), None);
    }

    #[test]
    fn caching_off_and_forget_all() {
        let mut off = BlockManager::new(4, 4).with_caching(false);
        let (mut table, [h0, _]) = cache_two_blocks(&mut off, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(off.lookup(h0, None, &[1, 2, 3, 4], &[]), None);
        off.release(&mut table);
        assert_eq!(off.num_cached_free(), 0);

        let mut on = BlockManager::new(4, 4);
        let (mut table, [h0, _]) = cache_two_blocks(&mut on, &[1, 2, 3, 4, 5, 6, 7, 8]);
        on.release(&mut table);
        on.forget_all();
        assert_eq!((on.num_free(), on.num_cached_free()), (4, 0));
        assert_eq!(on.lookup(h0, None, &[1, 2, 3, 4], &[]), None);
    }
}
