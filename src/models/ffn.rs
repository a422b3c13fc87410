//! A decoder block's feed-forward: a dense MLP, or a mixture of experts.

use candle_core::{Result, Tensor};

use super::linear::Linear;
use super::mlp::Mlp;
use super::moe::Moe;

pub enum Ffn {
    Dense(Mlp),
    /// Boxed: a mixture's routing state is several times an MLP's size.
    Experts(Box<Moe>),
}

impl Ffn {
    /// `x`: `[rows, hidden]`, already normed. Returns `[rows, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Ffn::Dense(mlp) => mlp.forward(x),
            Ffn::Experts(moe) => moe.forward(x),
        }
    }

    /// The linear layers whose small matrices [`crate::quant::share_pages`]
    /// may gather, in the order a forward reads them: a dense MLP's two, or
    /// the router and a shared expert's. Routed experts keep their own
    /// buffers: gathering a large model's would hold them twice while
    /// copying.
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        match self {
            Ffn::Dense(mlp) => mlp.linears_mut().into(),
            Ffn::Experts(moe) => {
                let mut out = vec![&mut moe.router];
                if let Some(s) = &mut moe.shared {
                    out.extend(s.mlp.linears_mut());
                }
                out
            }
        }
    }
}
