//! The dense feed-forward block: a projection up, an activation, a
//! projection down. Llama's and Qwen3.5's gated MLPs (gate and up stacked
//! in one matrix) and GPT-2's plain GELU one are this block; a
//! mixture-of-experts block would stand beside it.

use candle_core::{Result, Tensor};

use super::elementwise::{self, Act};
use super::linear::Linear;

/// What runs between the two projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `act(gate) * up`: the first projection gives gate and up stacked,
    /// gate first, as [`elementwise::glu`] expects.
    Glu(Act),
    /// GELU, the tanh approximation (GPT-2's `gelu_new`,
    /// `gelu_pytorch_tanh`).
    GeluTanh,
    /// GELU, the exact erf form (`gelu`).
    GeluErf,
}

pub struct Mlp {
    up: Linear,
    down: Linear,
    act: Activation,
}

impl Mlp {
    pub fn new(up: Linear, down: Linear, act: Activation) -> Self {
        Mlp { up, down, act }
    }

    /// Its two linear layers, in the order a forward reads them.
    pub fn linears_mut(&mut self) -> [&mut Linear; 2] {
        [&mut self.up, &mut self.down]
    }

    /// `x`: `[rows, hidden]`, already normed. Returns `[rows, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.up.forward(x)?;
        let h = match self.act {
            Activation::Glu(act) => elementwise::glu(&h, act)?,
            Activation::GeluTanh => elementwise::gelu(&h)?,
            Activation::GeluErf => h.gelu_erf()?,
        };
        self.down.forward(&h)
    }
}
