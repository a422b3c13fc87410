//! Engine behaviour on the real default model: batch invariance, chunked
//! prefill and preemption giving the same tokens as solo runs, KV-cache
//! consistency, block accounting and the tensor (non-CPU) fallback path.

mod common;

use std::collections::HashMap;

use candle_core::Device;
use wick::engine::block_manager::BlockManager;
use wick::engine::sequence::SeqId;
use wick::engine::{Engine, EngineConfig};
use wick::error::WickError;
use wick::kv::cache::{KvCache, KvDtype, KvLayout};
use wick::models::linear::WeightFormat;
use wick::models::{FlatBatch, LogitRows, Model};
use wick::sampling::params::SamplingParams;

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Once upon a time, in a land far away, there lived a",
    "def fibonacci(n):",
    "List three colours:",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "In 1492,",
    "Water boils at",
    "A haiku about the sea:\n",
];

fn params(i: usize) -> SamplingParams {
    // Half greedy, half seeded sampling with different knobs.
    if i.is_multiple_of(2) {
        SamplingParams {
            max_tokens: 20,
            temperature: 0.0,
            ignore_eos: true,
            ..Default::default()
        }
    } else {
        SamplingParams {
            max_tokens: 20,
            temperature: 0.9,
            top_p: 0.9,
            top_k: 40,
            seed: Some(1000 + i as u64),
            ignore_eos: true,
            ..Default::default()
        }
    }
}

/// Steps until every id finishes; returns each id's tokens. `late` requests
/// are added after `join_after` steps.
fn drive(
    engine: &mut Engine,
    now: Vec<(Vec<u32>, SamplingParams)>,
    late: Vec<(Vec<u32>, SamplingParams)>,
    join_after: usize,
) -> Vec<Vec<u32>> {
    let mut ids: Vec<SeqId> = now
        .into_iter()
        .map(|(p, s)| engine.add_request(p, s).unwrap())
        .collect();
    let mut out: HashMap<SeqId, Vec<u32>> = HashMap::new();
    let mut late = Some(late);
    let mut steps = 0;
    while engine.has_work() || late.is_some() {
        if steps == join_after {
            for (p, s) in late.take().unwrap() {
                ids.push(engine.add_request(p, s).unwrap());
            }
        }
        for ev in engine.step() {
            assert!(
                !matches!(
                    ev.finish,
                    Some(wick::engine::sequence::FinishReason::Error(_))
                ),
                "{ev:?}"
            );
            if let Some(t) = ev.token {
                out.entry(ev.seq).or_default().push(t.id);
            }
        }
        steps += 1;
    }
    ids.iter()
        .map(|id| out.remove(id).unwrap_or_default())
        .collect()
}

fn requests(tok: &wick::text::tokenizer::Tokenizer) -> Vec<(Vec<u32>, SamplingParams)> {
    PROMPTS
        .iter()
        .enumerate()
        .map(|(i, p)| (tok.encode(p).unwrap(), params(i)))
        .collect()
}

#[test]
fn batched_generation_equals_solo_generation() {
    // A small token budget forces chunked prefill that shares steps with decode rows.
    let cfg = EngineConfig {
        max_num_batched_tokens: 24,
        ..Default::default()
    };
    let (mut engine, tok) = common::engine(&cfg);
    let reqs = requests(&tok);
    let solo: Vec<Vec<u32>> = reqs
        .iter()
        .map(|r| drive(&mut engine, vec![r.clone()], vec![], 0).remove(0))
        .collect();
    // Seven start together; the eighth joins while they are mid-generation.
    let mut now = reqs.clone();
    let late = vec![now.remove(3)];
    let mut together = drive(&mut engine, now, late, 6);
    let joined = together.pop().unwrap();
    together.insert(3, joined);
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(a.len(), 20);
        assert_eq!(a, b, "prompt {i} ({:?}) differs when batched", PROMPTS[i]);
    }
    assert_eq!(
        engine.stats().blocks_used,
        0,
        "every block is free after all requests finish"
    );
}

#[test]
fn preempted_sequences_give_the_same_tokens() {
    // A pool of 6 blocks x 16 tokens cannot hold 8 sequences at once.
    let info_cfg = EngineConfig::default();
    let (mut engine, tok) = common::engine(&info_cfg);
    let reqs = requests(&tok);
    let solo = drive(&mut engine, reqs.clone(), vec![], 0);
    let bytes_per_block = KvLayout::bytes_per_block(30, 3, 64, 16, KvDtype::F16);
    let cfg = EngineConfig {
        kv_cache_bytes: 6 * bytes_per_block,
        ..Default::default()
    };
    let (mut small, _) = common::engine(&cfg);
    let squeezed = drive(&mut small, reqs, vec![], 0);
    assert!(
        small.stats().preemptions > 0,
        "the small pool should have forced preemption"
    );
    assert_eq!(solo, squeezed);
    assert_eq!(small.stats().blocks_used, 0);
}

#[test]
fn kv_budget_too_small_is_an_error_not_a_hang() {
    let bytes_per_block = KvLayout::bytes_per_block(30, 3, 64, 16, KvDtype::F16);
    let cfg = EngineConfig {
        kv_cache_bytes: 2 * bytes_per_block,
        ..Default::default()
    };
    let (mut engine, tok) = common::engine(&cfg);
    let prompt = tok.encode(&"word ".repeat(40)).unwrap();
    let err = engine
        .add_request(
            prompt,
            SamplingParams {
                max_tokens: 8,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(matches!(err, WickError::KvCacheTooSmall(_)), "{err:?}");
    assert!(!engine.has_work());
    // A request that fits still runs in the same engine.
    let out = drive(
        &mut engine,
        vec![(tok.encode("Hi").unwrap(), params(0))],
        vec![],
        0,
    );
    assert_eq!(out[0].len(), 20);

    let none = EngineConfig {
        kv_cache_bytes: bytes_per_block - 1,
        ..Default::default()
    };
    let loaded = common::load_default(WeightFormat::Native);
    assert!(Engine::new(loaded.model, vec![], &none).is_err());
}

#[test]
fn abort_frees_blocks_at_once() {
    let (mut engine, tok) = common::engine(&EngineConfig::default());
    let a = engine
        .add_request(tok.encode("Tell me a long story.").unwrap(), params(0))
        .unwrap();
    let b = engine
        .add_request(tok.encode("Count to ten:").unwrap(), params(1))
        .unwrap();
    engine.step();
    engine.step();
    assert!(engine.stats().blocks_used > 0);
    assert!(engine.abort(a));
    assert!(engine.abort(b));
    assert!(!engine.abort(b), "already gone");
    assert_eq!(engine.stats().blocks_used, 0);
    assert!(!engine.has_work());
}

#[test]
fn prompt_and_params_are_validated() {
    let (mut engine, _) = common::engine(&EngineConfig::default());
    let vocab = engine.model().info().vocab_size as u32;
    assert!(matches!(
        engine.add_request(vec![], params(0)),
        Err(WickError::InvalidRequest { .. })
    ));
    assert!(matches!(
        engine.add_request(vec![1, vocab], params(0)),
        Err(WickError::InvalidRequest { .. })
    ));
    let too_long = SamplingParams {
        max_tokens: 8192,
        ..Default::default()
    };
    assert!(matches!(
        engine.add_request(vec![1, 2], too_long),
        Err(WickError::ContextLengthExceeded { .. })
    ));
    let bad = SamplingParams {
        temperature: -1.0,
        ..Default::default()
    };
    assert!(matches!(
        engine.add_request(vec![1], bad),
        Err(WickError::InvalidRequest { .. })
    ));
}

/// A pool of 8 blocks of 16 tokens for `model`, on the host kernel's path
/// or the devices' (`device_path`).
fn small_pool(model: &dyn Model, device_path: bool) -> KvCache {
    let info = model.info();
    let layout = KvLayout {
        num_layers: info.num_layers,
        num_kv_heads: info.num_kv_heads,
        head_dim: info.head_dim,
        block_size: 16,
        num_blocks: 8,
        dtype: info.kv_dtype,
        window_kv: None,
    };
    KvCache::new(layout, &Device::Cpu, device_path).unwrap()
}

/// Runs `tokens` through `model` in the given chunk sizes against a fresh
/// pool, returning the last logits row.
fn logits_in_chunks(
    model: &dyn Model,
    tokens: &[u32],
    chunks: &[usize],
    force_tensor: bool,
) -> Vec<f32> {
    let mut cache = small_pool(model, force_tensor);
    let mut blocks = BlockManager::new(8, 16);
    let mut table = Vec::new();
    let mut pos = 0;
    let mut last = Vec::new();
    for &n in chunks {
        assert!(blocks.grow(&mut table, pos + n));
        let mut batch = FlatBatch::default();
        batch.push(tokens, pos..pos + n, table.clone(), LogitRows::Last);
        last = model
            .forward(&batch, &mut cache)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
            .remove(0);
        pos += n;
    }
    last
}

/// Largest difference relative to the largest logit: float reordering (gemm
/// blocking that depends on the row count, attention summed in another
/// order) stays around 2e-4; a real bug moves logits by O(1).
fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().map(|x| x.abs()).fold(0.0, f32::max);
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / scale
}

#[test]
fn cached_decode_matches_a_full_forward() {
    let loaded = common::load_default(WeightFormat::F32);
    let tokens = loaded.tokenizer.encode("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg").unwrap();
    let n = tokens.len();
    assert!(n > 12);
    let full = logits_in_chunks(loaded.model.as_ref(), &tokens, &[n], false);
    // Prefill all but eight, then eight single-token decode steps.
    let mut chunks = vec![n - 8];
    chunks.extend([1; 8]);
    let stepped = logits_in_chunks(loaded.model.as_ref(), &tokens, &chunks, false);
    let d = max_rel_diff(&full, &stepped);
    assert!(
        d < 1e-3,
        "prefill+decode logits differ from a full forward by {d}"
    );
}

#[test]
fn tensor_kv_fallback_matches_the_cpu_kernel() {
    let loaded = common::load_default(WeightFormat::F32);
    let tokens = loaded
        .tokenizer
        .encode("Paged attention keeps each sequence's keys in blocks of sixteen tokens, so")
        .unwrap();
    let n = tokens.len();
    let chunks = [n - 3, 1, 1, 1];
    let host = logits_in_chunks(loaded.model.as_ref(), &tokens, &chunks, false);
    let tensor = logits_in_chunks(loaded.model.as_ref(), &tokens, &chunks, true);
    let d = max_rel_diff(&host, &tensor);
    assert!(
        d < 1e-3,
        "tensor KV path differs from the host kernel by {d}"
    );
}

/// The devices' path picks a row's argmax before the logits come back,
/// where the flags say it suffices; the other rows come back whole. Run on
/// the CPU: the picks must be the host's argmax of the same rows.
#[test]
fn rows_picked_on_the_device_are_the_hosts_argmax() {
    use wick::engine::model_runner::{LogitRow, ModelRunner, Pick};

    let loaded = common::load_default(WeightFormat::Native);
    let tok = &loaded.tokenizer;
    let prompts: Vec<Vec<u32>> = PROMPTS[..3]
        .iter()
        .map(|p| tok.encode(p).unwrap())
        .collect();
    let runner = |device_path: bool| {
        let model = common::load_default(WeightFormat::Native).model;
        let cache = small_pool(model.as_ref(), device_path);
        ModelRunner::new(model, cache, device_path)
    };
    let mut blocks = BlockManager::new(8, 16);
    let mut batch = FlatBatch::default();
    for p in &prompts {
        let mut table = Vec::new();
        assert!(blocks.grow(&mut table, p.len()));
        // The second prompt's every row, as prompt scoring asks.
        let rows = match batch.seqs.len() {
            1 => LogitRows::All,
            _ => LogitRows::Last,
        };
        batch.push(p, 0..p.len(), table, rows);
    }
    let n = batch.logit_rows().len();
    let mut flags = vec![true; n];
    flags[1] = false;
    let picks = |flags: &[bool]| -> Vec<Pick> {
        flags
            .iter()
            .map(|&f| if f { Pick::Argmax } else { Pick::Whole })
            .collect()
    };
    let (host, _) = runner(false).run(&batch, &picks(&flags)).unwrap();
    assert!(
        host.iter().all(|r| matches!(r, LogitRow::Logits(_))),
        "the CPU's own path"
    );
    let (whole, _) = runner(true).run(&batch, &picks(&vec![false; n])).unwrap();
    for flags in [flags, vec![true; n]] {
        let (picked, _) = runner(true).run(&batch, &picks(&flags)).unwrap();
        assert_eq!(picked.len(), n);
        for (r, (got, want)) in picked.iter().zip(&whole).enumerate() {
            match (flags[r], got) {
                (true, LogitRow::Argmax(id)) => assert_eq!(Some(*id), want.argmax(), "row {r}"),
                (false, LogitRow::Logits(row)) => {
                    let LogitRow::Logits(want) = want else {
                        unreachable!()
                    };
                    assert!(max_rel_diff(want, row) < 1e-3, "row {r}");
                }
                (flag, got) => panic!("row {r}: flag {flag}, got {got:?}"),
            }
        }
    }
}

/// On the devices' path, a batch whose greedy rows are picked on the
/// device samples exactly what the same batch does with every row brought
/// back whole (each request also asking for logprobs, which needs the row):
/// plain and drafting greedy rows beside rows that need their logits
/// (sampled, with logprobs, penalties, a min_tokens mask, prompt scores).
#[test]
fn greedy_rows_picked_on_the_device_sample_as_whole_rows_do() {
    let cfg = EngineConfig {
        force_device_path: true,
        speculation: Some(Default::default()),
        ..Default::default()
    };
    let greedy = SamplingParams {
        max_tokens: 12,
        temperature: 0.0,
        ..Default::default()
    };
    let variants = [
        greedy.clone(),
        SamplingParams {
            logprobs: Some(2),
            ..greedy.clone()
        },
        SamplingParams {
            presence_penalty: 1.5,
            ..greedy.clone()
        },
        SamplingParams {
            min_tokens: 12,
            ..greedy.clone()
        },
        SamplingParams {
            prompt_logprobs: Some(1),
            ..greedy.clone()
        },
        params(1),
    ];
    let (mut picking, tok) = common::engine(&cfg);
    let copy = "Repeat: the cat sat on the mat, the cat sat on the mat, the cat sat on";
    let reqs: Vec<(Vec<u32>, SamplingParams)> = variants
        .iter()
        .enumerate()
        .map(|(i, p)| (tok.encode(PROMPTS[i]).unwrap(), p.clone()))
        .chain([(tok.encode(copy).unwrap(), greedy.clone())])
        .collect();
    let whole_rows: Vec<_> = reqs
        .iter()
        .map(|(p, s)| {
            let s = SamplingParams {
                logprobs: s.logprobs.or(Some(0)),
                ..s.clone()
            };
            (p.clone(), s)
        })
        .collect();
    type Tokens = Vec<(u32, Option<f32>)>;
    let run = |engine: &mut Engine, reqs: &[(Vec<u32>, SamplingParams)]| {
        let ids: Vec<SeqId> = reqs
            .iter()
            .map(|(p, s)| engine.add_request(p.clone(), s.clone()).unwrap())
            .collect();
        let mut out: HashMap<SeqId, (Tokens, Vec<f32>)> = HashMap::new();
        while engine.has_work() {
            for ev in engine.step() {
                let o = out.entry(ev.seq).or_default();
                o.0.extend(ev.token.map(|t| (t.id, t.logprob)));
                o.1.extend(ev.prompt_logprobs.iter().filter_map(|t| t.logprob));
            }
        }
        (
            ids.iter()
                .map(|id| out.remove(id).unwrap())
                .collect::<Vec<_>>(),
            engine.stats().drafts,
        )
    };
    let (got, drafts) = run(&mut picking, &reqs);
    let (want, _) = run(&mut common::engine(&cfg).0, &whole_rows);
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        let ids = |t: &Tokens| t.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(&w.0), ids(&g.0), "request {i}: tokens");
        if reqs[i].1.logprobs.is_some() {
            assert_eq!(w.0, g.0, "request {i}: logprobs");
        }
        assert_eq!(w.1, g.1, "request {i}: prompt scores");
    }
    assert!(
        got[0].0.iter().all(|t| t.1.is_none()),
        "picked: no logprobs"
    );
    assert!(got[4].1.len() > 1, "the prompt scored");
    assert!(drafts.drafted > 0, "the copy drafted");
}
