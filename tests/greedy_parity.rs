//! wick's greedy choices against llama.cpp's on the default model
//! (`tests/fixtures/llama-cpp/greedy.jsonl`: llama-server at temperature 0, with
//! the logprob gap between its top two tokens at each step).
//!
//! The comparison is teacher-forced: every sequence is fed llama.cpp's own
//! tokens, and at every step llama.cpp's token must be wick's argmax or within
//! `MAX_MARGIN` nats of it, with at most `MAX_DISAGREEMENT` of the steps
//! differing. Both KV storages (the CPU kernel and the candle-op fallback)
//! are checked, and the CPU pool's int8 format.
//!
//! Exact agreement is not a usable test on this model: both programs quantize
//! activations to 8 bits before every Q4_1 matmul, which amplifies float
//! rounding differences. Measured on this machine: llama.cpp itself with
//! `-fa off` instead of the reference's default flash attention disagrees
//! with the reference at 6 of 225 teacher-forced steps, at gaps up to 0.139;
//! three attention implementations in wick that are all exact in f32 but sum
//! in different orders (two CPU kernels and the candle-op path) move logits by
//! up to 0.45 between them, and leave llama.cpp's token up to 0.51 below
//! wick's best at a step where llama.cpp's own gap was 0.08.

mod common;

use wick::kv::cache::KvDtype;
use wick::models::linear::WeightFormat;

/// llama.cpp's token may trail wick's best by at most this many nats.
const MAX_MARGIN: f32 = 0.75;
/// At most this fraction of all steps may disagree (near ties included).
const MAX_DISAGREEMENT: f64 = 0.05;
/// The int8 K/V format rounds every cached value to one of 255 steps of its
/// head vector's largest magnitude, on top of the above. Measured: 12 of 225
/// steps (f16: 10), every one at a near-tie (llama.cpp's gap ≤ 0.41, wick's
/// margin ≤ 0.32); a broken int8 path moves logits by whole nats and fails
/// `MAX_MARGIN` instead.
const MAX_DISAGREEMENT_INT8: f64 = 0.08;

#[derive(serde::Deserialize)]
struct Case {
    prompt: String,
    ids: Vec<u32>,
    top2_gap: Vec<f32>,
}

/// The default model and its fixture; `WICK_PARITY_MODEL` and
/// `WICK_PARITY_REFERENCE` check another GGUF against a reference made by
/// `scripts/llama_greedy_reference.py` from llama-server on that file.
#[test]
fn greedy_choices_match_llama_cpp_within_quantization_noise() {
    let (model, reference) = match (
        std::env::var_os("WICK_PARITY_MODEL"),
        std::env::var_os("WICK_PARITY_REFERENCE"),
    ) {
        (Some(m), Some(r)) => (m.into(), r.into()),
        _ => (
            common::model_path(),
            common::reference_dir().join("greedy.jsonl"),
        ),
    };
    let text = std::fs::read_to_string(&reference).expect("reference file");
    let cases: Vec<Case> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(cases.len(), 8);
    let loaded = wick::load::loader::load(
        &model,
        &WeightFormat::Native.into(),
        &candle_core::Device::Cpu,
    )
    .expect("loading the model");
    // Both storages, and the CPU pool's int8 format (llama.cpp's reference
    // ran with f16 K/V, so int8 must keep within the same bounds).
    for (force_tensor_kv, dtype) in [
        (false, KvDtype::F16),
        (true, KvDtype::F16),
        (false, KvDtype::Int8),
    ] {
        check_storage(&loaded, &cases, force_tensor_kv, dtype);
    }
}

fn check_storage(
    loaded: &wick::load::loader::LoadedModel,
    cases: &[Case],
    force_tensor_kv: bool,
    dtype: KvDtype,
) {
    // Each sequence: prompt ids followed by llama.cpp's generated ids.
    let seqs: Vec<(usize, Vec<u32>)> = cases
        .iter()
        .map(|c| {
            let prompt = loaded.tokenizer.encode(&c.prompt).unwrap();
            (
                prompt.len(),
                prompt.into_iter().chain(c.ids.iter().copied()).collect(),
            )
        })
        .collect();
    let logits = common::teacher_forced_logits(&*loaded.model, &seqs, dtype, force_tensor_kv);
    let (mut disagreements, mut total) = (Vec::new(), 0);
    for (i, rows) in logits.iter().enumerate() {
        for (step, row) in rows.iter().enumerate() {
            let (want, gap) = (cases[i].ids[step], cases[i].top2_gap[step]);
            let got = common::argmax(row);
            total += 1;
            if got != want {
                let margin = row[got as usize] - row[want as usize];
                assert!(
                    margin <= MAX_MARGIN,
                    "prompt {:?} step {step} ({dtype:?}, tensor KV: {force_tensor_kv}): wick picks {got}, \
                     llama.cpp's {want} (its top-2 gap {gap}) trails it by {margin}",
                    cases[i].prompt
                );
                disagreements.push((i, step, gap, margin));
            }
        }
    }
    let max_disagreement = match dtype {
        KvDtype::Int8 => MAX_DISAGREEMENT_INT8,
        _ => MAX_DISAGREEMENT,
    };
    eprintln!(
        "{dtype:?} tensor KV {force_tensor_kv}: {} of {total} steps differ from llama.cpp \
         (prompt, step, llama.cpp's gap, wick's margin): {disagreements:?}",
        disagreements.len()
    );
    assert!(
        (disagreements.len() as f64) <= max_disagreement * total as f64,
        "{dtype:?} tensor KV {force_tensor_kv}: {} of {total} steps differ",
        disagreements.len()
    );
}
