//! The KV layer, below the models and attention: the pool's memory and
//! how a block is named. Which blocks a sequence owns is the engine's
//! policy (`engine::block_manager`); what the blocks hold lives here.

pub mod batch;
pub mod cache;
pub mod state_store;
pub mod step_meta;

/// A block number in the KV pool.
pub type BlockId = u32;

/// A sliding-window table's entry whose block has left the window and gone
/// back to the pool.
pub const FREED: BlockId = BlockId::MAX;
