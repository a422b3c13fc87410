//! GGUF architectures against transformers: tiny random-weight Llama (Llama
//! 3.1 RoPE scaling, so the file carries `rope_freqs.weight`), Qwen2 (q/k/v
//! biases, NEOX RoPE, tied head), Qwen3 (per-head q/k norms, head size
//! not hidden / heads), SmolLM3 (every fourth layer without RoPE) and Phi-3
//! (fused q/k/v and gate/up, partial rotary, LongRoPE factor tensors) and
//! Gemma 3 (sandwich norms, GeGLU, local sliding-window layers)
//! converted by llama.cpp's own
//! `convert_hf_to_gguf.py` (`scripts/make_gguf_fixtures.py`), compared with
//! transformers' logits and greedy continuations for the same weights.

mod common;

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Content;
use candle_core::Device;
use common::transformers_ref::{read_reference, worst_logit_diff, Reference};
use wick::engine::kv_cache::KvDtype;
use wick::engine::{Engine, EngineConfig};
use wick::load::loader::{load, LoadOptions, LoadedModel};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// `(GGUF stem, its transformers reference, a tensor only that feature has)`.
const CASES: [(&str, &str, &str); 6] = [
    (
        "llama3-rope",
        "llama-tiny/reference.json",
        "rope_freqs.weight",
    ),
    (
        "qwen2",
        "gguf-tiny/qwen2-reference.json",
        "blk.0.attn_q.bias",
    ),
    (
        "qwen3",
        "qwen3-tiny/reference.json",
        "blk.0.attn_q_norm.weight",
    ),
    // The fourth layer is the one without RoPE.
    (
        "smollm3",
        "smollm3-tiny/reference.json",
        "blk.3.attn_q.weight",
    ),
    // Fused q/k/v, partial rotary, LongRoPE factors as tensors.
    (
        "phi3",
        "phi3-tiny/reference.json",
        "rope_factors_long.weight",
    ),
    // Norms after attention and MLP; sliding-window layers.
    (
        "gemma3",
        "gemma3-tiny/reference.json",
        "blk.0.post_ffw_norm.weight",
    ),
];

fn gguf(stem: &str, ty: &str) -> PathBuf {
    fixtures().join(format!("gguf-tiny/{stem}-{ty}.gguf"))
}

/// Served at the context `r` holds for (Phi-3's LongRoPE depends on it).
fn load_gguf(path: &Path, r: &Reference) -> LoadedModel {
    let options = LoadOptions {
        context: r.serve_context,
        ..Default::default()
    };
    load(path, &options, &Device::Cpu).unwrap()
}

/// The feature under test is really in the file, so a pass means it was read.
fn assert_has_tensor(path: &Path, name: &str) {
    let mut f = std::fs::File::open(path).unwrap();
    let content = Content::read(&mut f).unwrap();
    assert!(
        content.tensor_infos.contains_key(name),
        "{} has no {name}",
        path.display()
    );
}

fn reference(rel: &str) -> Reference {
    read_reference(&fixtures().join(rel))
}

#[test]
fn f32_gguf_logits_match_transformers() {
    for (stem, rel, marker) in CASES {
        let path = gguf(stem, "f32");
        assert_has_tensor(&path, marker);
        // f32 K/V too: GGUF models default to f16 K/V, whose rounding alone
        // moves these logits by about 3e-3.
        let r = reference(rel);
        let d = worst_logit_diff(&r, &load_gguf(&path, &r), Some(KvDtype::F32));
        eprintln!("{stem} f32: max |logit - transformers| = {d:e}");
        assert!(d <= 1e-4, "{stem}: logits differ from transformers by {d}");
    }
}

/// Phi-3's LongRoPE from the file's factor tensors and attention factor:
/// at its full context, the long factors, as transformers uses past the
/// pretrained context.
#[test]
fn phi3_gguf_long_rope_matches_transformers_past_the_pretrained_context() {
    let r = reference("phi3-tiny/reference.json");
    let options = LoadOptions {
        context: Some(256),
        ..Default::default()
    };
    let loaded = load(&gguf("phi3", "f32"), &options, &Device::Cpu).unwrap();
    let d = common::transformers_ref::long_logit_diff(&r, &loaded, Some(KvDtype::F32));
    eprintln!("phi3 f32 long: max |logit - transformers| = {d:e}");
    assert!(
        d <= 1e-4,
        "long prompt: logits differ from transformers by {d}"
    );
}

#[test]
fn q8_0_gguf_logits_stay_close() {
    // llama.cpp's own Q8_0 of the weights, with wick's 8-bit activations:
    // a broken layer moves logits spanning -5..5 by units.
    for (stem, rel, marker) in CASES {
        let path = gguf(stem, "q8_0");
        assert_has_tensor(&path, marker);
        let r = reference(rel);
        let d = worst_logit_diff(&r, &load_gguf(&path, &r), None);
        eprintln!("{stem} q8_0: max |logit - transformers| = {d:e}");
        assert!(d <= 0.5, "{stem} q8_0: logits differ by {d}");
    }
}

#[test]
fn f32_gguf_greedy_continuations_match_transformers() {
    for (stem, rel, _) in CASES {
        let r = reference(rel);
        let loaded = load_gguf(&gguf(stem, "f32"), &r);
        let cfg = EngineConfig {
            block_size: 4,
            kv_cache_bytes: 4 << 20,
            kv_dtype: Some(KvDtype::F32),
            ..Default::default()
        };
        let mut engine =
            Engine::new(loaded.model, loaded.tokenizer.eos_ids().to_vec(), &cfg).unwrap();
        common::assert_greedy_matches(&mut engine, &r.inputs, &r.greedy, stem);
    }
}
