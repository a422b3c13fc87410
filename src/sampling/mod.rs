//! Choosing each sequence's next token: its parameters as validated from a
//! request, the sampler that draws from a row of logits under them (by an
//! exponential race), and the grammar that may mask that row first.

pub mod argmax;
pub mod constraint;
pub mod device;
pub mod params;
pub mod race;
pub mod sampler;
pub mod schema_rules;
pub mod token;
