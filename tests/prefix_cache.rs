//! Automatic prefix caching on the real default model: whatever the cache
//! supplies, every request's tokens (greedy and seeded), prompt scores and
//! finish are what the same engine computes with caching off, and every
//! block is free once the requests finish.

mod common;

use std::collections::HashMap;

use wick::engine::sequence::{FinishReason, SeqId};
use wick::engine::{Engine, EngineConfig};
use wick::kv::cache::{KvDtype, KvLayout};
use wick::sampling::params::SamplingParams;

/// What one request produced.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    tokens: Vec<u32>,
    prompt_logprobs: Vec<(u32, Option<f32>)>,
    /// Not compared between runs: it is what differs.
    cached: usize,
}

fn same_output(a: &[Outcome], b: &[Outcome]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.tokens, y.tokens, "request {i}: tokens differ");
        assert_eq!(x.prompt_logprobs.len(), y.prompt_logprobs.len());
        for ((tx, lx), (ty, ly)) in x.prompt_logprobs.iter().zip(&y.prompt_logprobs) {
            assert_eq!(tx, ty);
            let (lx, ly) = (lx.unwrap(), ly.unwrap());
            assert!(
                (lx - ly).abs() < 1e-4,
                "request {i}: prompt logprob {lx} vs {ly}"
            );
        }
    }
}

/// Runs request batches one after another (each batch added at once, run
/// to the end), and returns every request's outcome in order.
fn run(engine: &mut Engine, batches: &[Vec<(Vec<u32>, SamplingParams)>]) -> Vec<Outcome> {
    let mut all = Vec::new();
    for batch in batches {
        let ids: Vec<SeqId> = batch
            .iter()
            .map(|(p, s)| engine.add_request(p.clone(), s.clone()).unwrap())
            .collect();
        let mut out: HashMap<SeqId, Outcome> = ids
            .iter()
            .map(|&id| {
                let o = Outcome {
                    tokens: Vec::new(),
                    prompt_logprobs: Vec::new(),
                    cached: 0,
                };
                (id, o)
            })
            .collect();
        while engine.has_work() {
            for ev in engine.step() {
                assert!(!matches!(ev.finish, Some(FinishReason::Error(_))), "{ev:?}");
                let o = out.get_mut(&ev.seq).unwrap();
                if let Some(c) = ev.cached_prompt_tokens {
                    o.cached = c;
                }
                let scored = ev.prompt_logprobs.iter().map(|t| (t.id, t.logprob));
                o.prompt_logprobs.extend(scored);
                o.tokens.extend(ev.token.map(|t| t.id));
            }
        }
        all.extend(ids.iter().map(|id| out.remove(id).unwrap()));
        assert_eq!(engine.stats().blocks_used, 0, "a block is still held");
    }
    all
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        temperature: 0.0,
        ignore_eos: true,
        ..Default::default()
    }
}

fn seeded(max_tokens: usize, seed: u64) -> SamplingParams {
    SamplingParams {
        max_tokens,
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(seed),
        ignore_eos: true,
        ..Default::default()
    }
}

/// A system prompt of a few blocks that many requests start with.
const SYSTEM: &str = "You are a careful assistant. Answer in plain English, keep every answer \
    short, and say so when you do not know something. Never invent facts, names or numbers. \
    When a question is ambiguous, ask which meaning was intended before answering it.";

/// Runs `batches` with caching on and off; the outputs must agree. Returns
/// the cached run's outcomes and the engine, for its counters.
fn on_and_off(
    cfg: EngineConfig,
    batches: &[Vec<(Vec<u32>, SamplingParams)>],
) -> (Vec<Outcome>, Engine) {
    let off_cfg = EngineConfig {
        prefix_caching: false,
        ..cfg.clone()
    };
    let (mut off, _) = common::engine(&off_cfg);
    let reference = run(&mut off, batches);
    assert!(reference.iter().all(|o| o.cached == 0));
    assert_eq!(off.stats().prefix_hits, 0);
    let (mut on, _) = common::engine(&cfg);
    let cached = run(&mut on, batches);
    same_output(&reference, &cached);
    (cached, on)
}

fn tokenizer() -> wick::text::tokenizer::Tokenizer {
    common::load_default(wick::models::linear::WeightFormat::Native).tokenizer
}

/// Each turn resends the conversation so far: the earlier turns come from
/// the cache, on every KV storage.
#[test]
fn multi_turn_chat_reuses_earlier_turns() {
    let tok = tokenizer();
    let questions = [
        "What is a prime number?",
        "Give me two examples.",
        "And a third?",
    ];
    for (kv_dtype, force_tensor_kv) in [(None, false), (Some(KvDtype::Int8), false), (None, true)] {
        let cfg = EngineConfig {
            kv_dtype,
            force_device_path: force_tensor_kv,
            ..Default::default()
        };
        // The conversation grows by the model's own (greedy) answers, which
        // the caching-off engine produces for the turn texts.
        let (mut plain, _) = common::engine(&EngineConfig {
            prefix_caching: false,
            ..cfg.clone()
        });
        let mut history = tok.encode(SYSTEM).unwrap();
        let mut turns = Vec::new();
        for q in questions {
            history.extend(tok.encode(&format!("\nUser: {q}\nAssistant:")).unwrap());
            turns.push(vec![(history.clone(), greedy(12))]);
            let answer = run(&mut plain, &turns[turns.len() - 1..]).remove(0);
            history.extend(answer.tokens);
        }
        let (out, engine) = on_and_off(cfg, &turns);
        let bs = EngineConfig::default().block_size;
        assert_eq!(out[0].cached, 0, "nothing is cached before the first turn");
        for (i, o) in out.iter().enumerate().skip(1) {
            // Every full block of the previous turn's prompt and answer,
            // except the one holding the answer's last token (never computed).
            let prev_len = turns[i - 1][0].0.len() + 11;
            assert_eq!(
                o.cached,
                prev_len / bs * bs,
                "turn {i} ({kv_dtype:?}, {force_tensor_kv})"
            );
        }
        let stats = engine.stats();
        let cached: usize = out.iter().map(|o| o.cached).sum();
        assert_eq!(stats.prefix_hits, cached as u64);
        let prompts: usize = turns.iter().map(|t| t[0].0.len()).sum();
        assert_eq!(stats.prefix_queries, prompts as u64);
    }
}

/// n > 1 and prompts with a common start, all added at once: the shared
/// blocks are computed by the first and taken by the rest in the same step.
#[test]
fn a_batch_with_shared_prefixes_prefills_them_once() {
    let tok = tokenizer();
    let system = tok.encode(SYSTEM).unwrap();
    let ask = |q: &str| [system.clone(), tok.encode(q).unwrap()].concat();
    let batch = vec![
        (ask(" What is rain?"), greedy(10)),
        (ask(" What is rain?"), seeded(10, 1)),
        (ask(" What is rain?"), seeded(10, 2)),
        (ask(" Why is the sky blue?"), greedy(10)),
        (ask(" Why is the sky blue?"), seeded(10, 3)),
    ];
    let (out, engine) = on_and_off(EngineConfig::default(), &[batch]);
    let bs = EngineConfig::default().block_size;
    assert_eq!(out[0].cached, 0);
    for o in &out[1..] {
        assert!(o.cached >= system.len() / bs * bs, "{}", o.cached);
    }
    assert!(engine.stats().prefix_hits > 0);
}

/// A small token budget chunks the prefills: the second prompt is admitted
/// while the first is still prefilling, takes the blocks it has written so
/// far, and chunks the rest; a third finds its prefix mid-conversation.
#[test]
fn cache_hits_in_the_middle_of_chunked_prefills() {
    let tok = tokenizer();
    let system = tok.encode(&format!("{SYSTEM} {SYSTEM}")).unwrap();
    let ask = |q: &str| [system.clone(), tok.encode(q).unwrap()].concat();
    let cfg = EngineConfig {
        max_num_batched_tokens: 24,
        ..Default::default()
    };
    let batches = [
        vec![
            (ask(" Name a river."), greedy(8)),
            (ask(" Name a mountain."), seeded(8, 5)),
        ],
        vec![(ask(" Name a lake, and a sea."), greedy(8))],
    ];
    let (out, _) = on_and_off(cfg, &batches);
    assert!(out[1].cached > 0 && out[2].cached > 0, "{out:?}");
}

/// A pool too small to keep every prefix: cached blocks are evicted and
/// sequences preempted, and the outputs still agree.
#[test]
fn eviction_and_preemption_keep_outputs_identical() {
    let tok = tokenizer();
    let system = tok.encode(SYSTEM).unwrap();
    let bytes_per_block = KvLayout::bytes_per_block(30, 3, 64, 16, KvDtype::F16);
    let cfg = EngineConfig {
        kv_cache_bytes: 8 * bytes_per_block,
        ..Default::default()
    };
    let topics = ["rain", "snow", "wind", "fog", "hail", "sun"];
    let batches: Vec<_> = topics
        .chunks(3)
        .map(|ts| {
            ts.iter()
                .enumerate()
                .map(|(i, t)| {
                    let p = [
                        system.clone(),
                        tok.encode(&format!(" Describe {t}.")).unwrap(),
                    ];
                    (p.concat(), seeded(32, i as u64))
                })
                .collect()
        })
        .collect();
    let (out, engine) = on_and_off(cfg, &batches);
    let stats = engine.stats();
    assert!(stats.preemptions > 0, "the pool should force preemption");
    assert!(out.iter().any(|o| o.cached > 0));
}

/// Prompt scoring (echo with logprobs) needs every prompt row, so it takes
/// nothing from the cache and scores every token; it still fills the cache
/// for others.
#[test]
fn prompt_logprobs_score_every_token_cached_or_not() {
    let tok = tokenizer();
    let prompt = tok.encode(&format!("{SYSTEM} Is it raining?")).unwrap();
    let scoring = SamplingParams {
        prompt_logprobs: Some(1),
        ..greedy(4)
    };
    let batches = [
        vec![(prompt.clone(), greedy(4))],
        vec![(prompt.clone(), scoring.clone())],
        vec![(prompt.clone(), greedy(4))],
    ];
    let (out, _) = on_and_off(EngineConfig::default(), &batches);
    assert_eq!(out[1].cached, 0);
    assert_eq!(out[1].prompt_logprobs.len(), prompt.len() - 1);
    assert!(out[2].cached > 0);
}
