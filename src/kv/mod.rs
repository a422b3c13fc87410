//! The KV layer, below the models and attention: the pool's memory and
//! how a block is named. Which blocks a sequence owns is the engine's
//! policy (`engine::block_manager`); what the blocks hold lives here.

pub mod cache;
