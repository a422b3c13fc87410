//! transformers' reference outputs for tiny random-weight models (written
//! by `scripts/make_fixtures.py` and `scripts/make_gguf_fixtures.py`), and
//! how wick's logits are compared against them.

use wick::kv::cache::KvDtype;
use wick::load::loader::LoadedModel;

#[derive(serde::Deserialize)]
pub struct Reference {
    pub inputs: Vec<Vec<u32>>,
    /// `[input][position][vocab]`
    pub logits: Vec<Vec<Vec<f32>>>,
    pub greedy: Vec<Vec<u32>>,
    /// Per input: the mean, last and first of its final hidden states
    /// (the HF fixtures' references carry them).
    #[serde(default)]
    pub pooled: Vec<Pooled>,
    pub tokenizer: Vec<TokenizerCase>,
    #[serde(default)]
    pub chat: Vec<ChatCase>,
    /// The context to serve the model at for these answers to hold, where
    /// its RoPE depends on it (Phi-3's LongRoPE).
    pub serve_context: Option<usize>,
    /// A prompt past `serve_context`, with the logits at its positions from
    /// `from` on.
    pub long: Option<LongCase>,
}

#[derive(serde::Deserialize)]
pub struct LongCase {
    pub ids: Vec<u32>,
    pub from: usize,
    pub logits: Vec<Vec<f32>>,
}

#[derive(serde::Deserialize)]
pub struct Pooled {
    pub mean: Vec<f32>,
    pub last: Vec<f32>,
    pub first: Vec<f32>,
}

#[derive(serde::Deserialize)]
pub struct TokenizerCase {
    pub text: String,
    pub ids: Vec<u32>,
}

#[derive(serde::Deserialize)]
pub struct ChatCase {
    pub messages: Vec<wick::text::chat_template::ChatMessage>,
    pub prompt: String,
    pub ids: Vec<u32>,
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "vocab sizes differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Largest difference from transformers' logits over every position from
/// each input's prefill on (its first half), all inputs batched together.
pub fn worst_logit_diff(r: &Reference, loaded: &LoadedModel, kv_dtype: Option<KvDtype>) -> f32 {
    let seqs: Vec<(usize, Vec<u32>)> = r
        .inputs
        .iter()
        // A trailing dummy token, so the last input position is scored too.
        .map(|ids| {
            (
                ids.len().div_ceil(2),
                ids.iter().copied().chain([0]).collect(),
            )
        })
        .collect();
    let kv_dtype = kv_dtype.unwrap_or(loaded.model.info().kv_dtype);
    let got = super::teacher_forced_logits(&*loaded.model, &seqs, kv_dtype, false);
    let mut worst = 0f32;
    for (i, rows) in got.iter().enumerate() {
        let prefill = seqs[i].0;
        assert_eq!(rows.len(), r.inputs[i].len() - prefill + 1);
        for (k, row) in rows.iter().enumerate() {
            worst = worst.max(max_abs_diff(row, &r.logits[i][prefill - 1 + k]));
        }
    }
    worst
}

/// Largest difference from transformers' logits on the reference's long
/// prompt (the model loaded at its full context), prefilled up to `from`
/// and then fed a token at a time.
pub fn long_logit_diff(r: &Reference, loaded: &LoadedModel, kv_dtype: Option<KvDtype>) -> f32 {
    let long = r.long.as_ref().expect("the reference has a long prompt");
    let ids = long.ids.iter().copied().chain([0]).collect();
    let kv_dtype = kv_dtype.unwrap_or(loaded.model.info().kv_dtype);
    let got =
        super::teacher_forced_logits(&*loaded.model, &[(long.from + 1, ids)], kv_dtype, false);
    assert_eq!(got[0].len(), long.logits.len());
    got[0]
        .iter()
        .zip(&long.logits)
        .map(|(a, b)| max_abs_diff(a, b))
        .fold(0.0, f32::max)
}

pub fn read_reference(path: &std::path::Path) -> Reference {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap()
}
