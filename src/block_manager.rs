//! Allocation of KV-cache blocks: a free list plus per-block reference counts.
//!
//! The manager only hands out block numbers; the memory behind them lives in
//! [`crate::kv_cache::KvCache`]. Reference counts let two sequences share a
//! block (prefix sharing); a block returns to the free list when its last
//! holder releases it.

/// A block number in the KV pool.
pub type BlockId = u32;

#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    /// Free blocks, popped from the end: the most recently freed block is
    /// reused first, while its memory is still warm in cache.
    free: Vec<BlockId>,
    ref_counts: Vec<u32>,
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "block size must be positive");
        BlockManager {
            block_size,
            free: (0..num_blocks as BlockId).rev().collect(),
            ref_counts: vec![0; num_blocks],
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn num_used(&self) -> usize {
        self.num_blocks() - self.num_free()
    }

    /// Blocks a sequence of `num_tokens` tokens occupies.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// Grows `table` so it can hold `num_tokens` tokens. All or nothing: when
    /// the pool cannot supply every missing block, nothing is allocated and
    /// `false` is returned so the caller can preempt or wait.
    pub fn grow(&mut self, table: &mut Vec<BlockId>, num_tokens: usize) -> bool {
        let needed = self.blocks_for(num_tokens).saturating_sub(table.len());
        if needed > self.free.len() {
            return false;
        }
        for _ in 0..needed {
            let block = self.free.pop().expect("checked above");
            self.ref_counts[block as usize] = 1;
            table.push(block);
        }
        true
    }

    /// Another holder of `block` (a sequence sharing a prefix).
    pub fn share(&mut self, block: BlockId) {
        let rc = &mut self.ref_counts[block as usize];
        assert!(*rc > 0, "sharing a free block {block}");
        *rc += 1;
    }

    /// Releases every block of `table` and empties it.
    pub fn release(&mut self, table: &mut Vec<BlockId>) {
        for block in table.drain(..) {
            let rc = &mut self.ref_counts[block as usize];
            assert!(*rc > 0, "double free of block {block}");
            *rc -= 1;
            if *rc == 0 {
                self.free.push(block);
            }
        }
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
}
