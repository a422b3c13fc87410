//! `wick export-hf` on the default model: the directory has what a
//! Hugging Face Llama checkpoint has, and loaded back through wick's
//! safetensors path it continues `../shared/reference/greedy.jsonl`'s
//! prompts as the GGUF path does.

mod common;

use std::process::Command;

use candle_core::Device;
use wick::engine::{Engine, EngineConfig};
use wick::loader::{load, LoadOptions, LoadedModel};
use wick::models::linear::WeightFormat;

#[derive(serde::Deserialize)]
struct Case {
    prompt: String,
    ids: Vec<u32>,
    top2_gap: Vec<f32>,
}

/// Greedy ids for every case, all prompts batched, each as long as
/// llama.cpp's output.
fn greedy(loaded: LoadedModel, cases: &[Case]) -> Vec<Vec<u32>> {
    let prompts: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| loaded.tokenizer.encode(&c.prompt).unwrap())
        .collect();
    let cfg = EngineConfig {
        kv_cache_bytes: 64 << 20,
        ..Default::default()
    };
    let mut engine = Engine::new(loaded.model, loaded.tokenizer.eos_ids().to_vec(), &cfg).unwrap();
    let requests = prompts
        .into_iter()
        .zip(cases)
        .map(|(p, c)| (p, c.ids.len()))
        .collect();
    common::greedy_batch(&mut engine, requests)
}

/// Steps equal before the first difference.
fn agreeing_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Steps before llama.cpp's first top-2 gap under `gap`.
fn before_near_tie(c: &Case, gap: f32) -> usize {
    c.top2_gap
        .iter()
        .position(|&g| g < gap)
        .unwrap_or(c.ids.len())
}

#[test]
fn exported_checkpoint_loads_back_and_continues_like_the_gguf() {
    let gguf = common::model_path();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args(["export-hf", "--model", gguf.to_str().unwrap(), "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
    let gguf_model = common::load_default(WeightFormat::Native);
    let info = gguf_model.model.info().clone();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["model_type"], "llama");
    assert_eq!(config["num_hidden_layers"], info.num_layers);
    assert_eq!(config["num_attention_heads"], info.num_heads);
    assert_eq!(config["num_key_value_heads"], info.num_kv_heads);
    assert_eq!(config["vocab_size"], info.vocab_size);
    assert_eq!(config["max_position_embeddings"], info.max_context);
    // SmolLM2 ties its head to the embeddings: no lm_head.weight is written.
    assert_eq!(config["tie_word_embeddings"], true);

    let exported = load(dir.path(), &LoadOptions::default(), &Device::Cpu).unwrap();
    // Same tokenizer, EOS ids and chat template.
    assert_eq!(exported.tokenizer.eos_ids(), gguf_model.tokenizer.eos_ids());
    let text = std::fs::read_to_string(common::reference_dir().join("tokenize.jsonl")).unwrap();
    for line in text.lines() {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let t = case["text"].as_str().unwrap();
        assert_eq!(
            exported.tokenizer.encode(t).unwrap(),
            gguf_model.tokenizer.encode(t).unwrap(),
            "{t:?}"
        );
    }
    let messages = [wick::chat_template::ChatMessage {
        role: "user".into(),
        content: "Hi".into(),
    }];
    assert_eq!(
        exported
            .chat_template
            .as_ref()
            .unwrap()
            .render(&messages, true)
            .unwrap(),
        gguf_model
            .chat_template
            .as_ref()
            .unwrap()
            .render(&messages, true)
            .unwrap()
    );

    let text = std::fs::read_to_string(common::reference_dir().join("greedy.jsonl")).unwrap();
    let cases: Vec<Case> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let from_export = greedy(exported, &cases);
    let from_f32_gguf = greedy(common::load_default(WeightFormat::F32), &cases);
    let from_native_gguf = greedy(gguf_model, &cases);
    let (mut same_f32, mut same_native, mut total) = (0, 0, 0);
    for (i, c) in cases.iter().enumerate() {
        let f32_prefix = agreeing_prefix(&from_export[i], &from_f32_gguf[i]);
        let native_prefix = agreeing_prefix(&from_export[i], &from_native_gguf[i]);
        eprintln!(
            "prompt {i}: export = GGUF dequantized for {f32_prefix}/{n} steps, = GGUF Q4_1 for {native_prefix}/{n}",
            n = c.ids.len()
        );
        (same_f32, same_native, total) = (
            same_f32 + f32_prefix,
            same_native + native_prefix,
            total + c.ids.len(),
        );
        // The same f32 weights: only the KV dtype (f32 here, f16 for GGUF)
        // differs, so they agree up to llama.cpp's first real near tie.
        assert!(
            f32_prefix >= before_near_tie(c, 0.05),
            "prompt {i}: export and GGUF f32 part at step {f32_prefix}"
        );
        // Q4_1 with 8-bit activations moves logits by up to ~0.5 (see
        // tests/greedy_parity.rs), so the bound is looser there.
        assert!(
            native_prefix >= before_near_tie(c, 0.5),
            "prompt {i}: export and GGUF Q4_1 part at step {native_prefix}"
        );
    }
    eprintln!("agreement: {same_f32}/{total} steps with the dequantized GGUF, {same_native}/{total} with Q4_1");
}
