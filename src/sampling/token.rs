//! What sampling one token gives: the token, and the logprobs asked for.

/// One sampled token with its logprobs under the raw logits.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    pub id: u32,
    /// Log-softmax of the raw logits at `id`, when logprobs were requested
    /// (a pass over the vocabulary that greedy decoding otherwise skips).
    pub logprob: Option<f32>,
    /// The `logprobs` most likely tokens under the raw logits with their
    /// logprobs, most likely first (ties: lowest id first). Empty unless
    /// requested; the chosen token is included only if it is among them.
    pub top_logprobs: Vec<(u32, f32)>,
}

impl SampledToken {
    /// A token without logprobs.
    pub fn plain(id: u32) -> Self {
        SampledToken {
            id,
            logprob: None,
            top_logprobs: Vec::new(),
        }
    }
}
