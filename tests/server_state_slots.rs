//! `wick serve` on the tiny Qwen3.5 checkpoint with a KV budget too small
//! for a state slot per `--max-num-seqs` sequence: it makes fewer, serves
//! concurrent requests as transformers continues them, and `/metrics`
//! reports the slots.

mod common;

use std::path::{Path, PathBuf};

use candle_core::Device;
use serde_json::{json, Value};

use common::{post, Server};
use wick::engine::state_slots;
use wick::kv::cache::KvLayout;
use wick::load::loader::{load, LoadOptions};

fn qwen35_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen35-tiny")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_small_budget_makes_fewer_state_slots_and_metrics_report_them() {
    // What the rule gives 1 MiB with --max-num-seqs 64: fewer slots.
    let loaded = load(&qwen35_dir(), &LoadOptions::default(), &Device::Cpu).unwrap();
    let info = loaded.model.info();
    let block_bytes = KvLayout::bytes_per_block(
        info.num_layers,
        info.num_kv_heads,
        info.head_dim,
        4,
        info.kv_dtype,
    );
    let state = loaded.model.state_bytes().unwrap();
    let split = state_slots::split_budget(1 << 20, state, block_bytes, 64).unwrap();
    assert!(split.num_slots < 64, "{split:?}");

    let dir = qwen35_dir();
    let server = Server::start(&[
        "--model",
        dir.to_str().unwrap(),
        "--max-num-seqs",
        "64",
        "--kv-cache-memory",
        "1",
        "--block-size",
        "4",
    ]);
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let requests = (0..4).map(|i| {
        let body = json!({
            "prompt": reference["inputs"][i],
            "max_tokens": reference["greedy"][i].as_array().unwrap().len(),
            "temperature": 0,
            "ignore_eos": true,
        });
        post(&server, "/v1/completions", body)
    });
    for (i, (status, resp)) in futures::future::join_all(requests)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(status, 200, "{resp}");
        let greedy: Vec<u32> = serde_json::from_value(reference["greedy"][i].clone()).unwrap();
        let want = loaded.tokenizer.decode(&greedy).unwrap();
        assert_eq!(resp["choices"][0]["text"], want, "request {i}: {resp}");
    }
    assert_eq!(
        common::metric(&server, "wick:state_slots_capacity").await,
        split.num_slots as f64
    );
    assert_eq!(common::metric(&server, "wick:state_slots_used").await, 0.0);
    assert_eq!(
        common::metric(&server, "wick:kv_blocks_capacity").await,
        (split.kv_bytes / block_bytes) as f64
    );
}
