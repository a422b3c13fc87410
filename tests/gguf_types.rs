//! Every GGUF block type wick has kernels for, in a whole model: the default
//! model re-quantized by candle into each type (and into a file that mixes
//! types per tensor, as llama.cpp's `*_K_M` files do) loads, and its greedy
//! choices on wick's kernels match the same file's weights dequantized to
//! f32 (candle's dequantization, dense f32 matmul) up to near ties.
//!
//! Only the 8-bit activations of wick's kernels differ between the two
//! paths, so the choices may part only where the reference's own top two
//! are close: the reference's token must be wick's best or within
//! `MAX_MARGIN` nats of it, at no more than `MAX_DISAGREEMENT` of the steps.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;
use wick::engine::{Engine, EngineConfig};
use wick::kv_cache::KvDtype;
use wick::loader::{load, LoadedModel};
use wick::models::linear::WeightFormat;

const MAX_MARGIN: f32 = 0.75;
const MAX_DISAGREEMENT: f64 = 0.08;
const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
];
const STEPS: usize = 16;

/// Which type each weight matrix gets: `types(name, k)`, or Q8_0 where the
/// type's blocks do not divide the row (as llama-quantize falls back).
fn requantize(out: &Path, types: impl Fn(&str) -> GgmlDType) -> PathBuf {
    let src = common::model_path();
    let mut reader = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for name in content.tensor_infos.keys() {
        let t = content.tensor(&mut reader, name, &Device::Cpu).unwrap();
        let matrix = name.starts_with("blk.") && name.ends_with(".weight") && t.shape().rank() == 2;
        let t = if matrix {
            let k = t.shape().dims2().unwrap().1;
            let want = types(name);
            let dtype = match k % want.block_size() {
                0 => want,
                _ => GgmlDType::Q8_0,
            };
            let f = t.dequantize(&Device::Cpu).unwrap();
            QTensor::quantize(&f, dtype).unwrap()
        } else {
            t
        };
        tensors.push((name.clone(), t));
    }
    let metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut file = std::fs::File::create(out).unwrap();
    gguf_file::write(&mut file, &metadata, &tensors).unwrap();
    out.to_path_buf()
}

fn load_as(path: &Path, weights: WeightFormat) -> LoadedModel {
    load(path, &weights.into(), &Device::Cpu)
        .unwrap_or_else(|e| panic!("loading {} as {weights:?}: {e:#}", path.display()))
}

/// Greedy continuations on the f32 path, then wick's kernels teacher-forced
/// on them; returns (steps that differ, steps).
fn compare(path: &Path) -> (usize, usize) {
    let reference = load_as(path, WeightFormat::F32);
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| reference.tokenizer.encode(p).unwrap())
        .collect();
    let mut engine = Engine::new(reference.model, Vec::new(), &EngineConfig::default()).unwrap();
    let continuations = common::greedy_batch(
        &mut engine,
        prompts.iter().map(|p| (p.clone(), STEPS)).collect(),
    );
    drop(engine);
    let seqs: Vec<(usize, Vec<u32>)> = prompts
        .iter()
        .zip(&continuations)
        .map(|(p, c)| (p.len(), p.iter().chain(c).copied().collect()))
        .collect();
    let native = load_as(path, WeightFormat::Native);
    let logits = common::teacher_forced_logits(&*native.model, &seqs, KvDtype::F32, false);
    let mut differ = 0;
    let mut total = 0;
    for ((rows, (prompt_len, toks)), prompt) in logits.iter().zip(&seqs).zip(PROMPTS) {
        for (step, row) in rows.iter().enumerate() {
            let (want, got) = (toks[prompt_len + step], common::argmax(row));
            total += 1;
            if got != want {
                let margin = row[got as usize] - row[want as usize];
                assert!(
                    margin <= MAX_MARGIN,
                    "{}: {prompt:?} step {step}: wick picks {got}, the f32 path {want}, \
                     which trails by {margin}",
                    path.display()
                );
                differ += 1;
            }
        }
    }
    (differ, total)
}

#[test]
fn every_type_loads_and_follows_its_dequantized_weights() {
    let dir = tempfile::tempdir().unwrap();
    let mut results = HashMap::new();
    for dtype in [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q8_0,
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ] {
        let path = requantize(&dir.path().join(format!("{dtype:?}.gguf")), |_| dtype);
        results.insert(format!("{dtype:?}"), compare(&path));
    }
    // llama.cpp's Q4_K_M pattern on this model: K-quants where rows divide
    // into 256, Q5_0 elsewhere, Q8_0 for attn_v and Q6_K for some ffn_down,
    // so q/k/v and gate/up mix types and cannot be stacked.
    let mixed = requantize(&dir.path().join("mixed.gguf"), |name| {
        let layer: usize = name.split('.').nth(1).unwrap().parse().unwrap();
        match name {
            n if n.contains("attn_v") => GgmlDType::Q8_0,
            n if n.contains("ffn_down") && layer.is_multiple_of(3) => GgmlDType::Q6K,
            n if n.contains("ffn_down") => GgmlDType::Q4K,
            n if n.contains("ffn_up") => GgmlDType::Q4_1,
            _ => GgmlDType::Q5_0,
        }
    });
    results.insert("mixed".to_string(), compare(&mixed));
    eprintln!("steps that differ from the f32 path: {results:?}");
    for (what, (differ, total)) in &results {
        assert!(
            *differ as f64 <= MAX_DISAGREEMENT * *total as f64,
            "{what}: {differ} of {total} steps differ"
        );
    }
}
