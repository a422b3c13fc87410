//! Speculative decoding by prompt lookup keeps every token what decoding
//! one at a time gives: greedy and seeded sampling alike, batched with rows
//! that draft nothing, through preemption, on the default model and on a
//! random one; and on text that repeats its prompt, most drafts are kept.
//! Tokens sampled from drafted rows pass a chi-square test against the
//! model's own probabilities.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::Device;
use wick::engine::sequence::{FinishReason, SeqId};
use wick::engine::speculation::Speculation;
use wick::engine::{Engine, EngineConfig};
use wick::kv::cache::KvLayout;
use wick::load::loader::{load, LoadOptions};
use wick::models::linear::WeightFormat;
use wick::sampling::params::SamplingParams;
use wick::sampling::sampler::SampledToken;
use wick::text::tokenizer::Tokenizer;

/// A prompt whose answer copies a text, and ones that copy nothing.
const COPY: &str = "<|im_start|>user\nRepeat this text exactly:\nThe quick brown fox jumps over \
    the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick daft zebras \
    jump!<|im_end|>\n<|im_start|>assistant\n";
const PLAIN: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived a",
];

/// Whether a draft pays is decided from measured step costs, so these tests
/// run one at a time: side by side, their step times turned noisy enough
/// to stop drafts that some of them assert.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.blocking_lock()
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        temperature: 0.0,
        ignore_eos: true,
        logprobs: Some(2),
        ..Default::default()
    }
}

fn seeded(max_tokens: usize, seed: u64) -> SamplingParams {
    SamplingParams {
        max_tokens,
        temperature: 0.8,
        top_p: 0.95,
        top_k: 50,
        frequency_penalty: 0.3,
        seed: Some(seed),
        ignore_eos: true,
        logprobs: Some(2),
        ..Default::default()
    }
}

fn speculating(cfg: &EngineConfig) -> EngineConfig {
    EngineConfig {
        speculation: Some(Speculation {
            max_draft: 6,
            ngram_max: 3,
            ngram_min: 1,
        }),
        ..cfg.clone()
    }
}

/// Runs every request together to its end; each one's sampled tokens.
fn run(engine: &mut Engine, requests: &[(Vec<u32>, SamplingParams)]) -> Vec<Vec<SampledToken>> {
    let ids: Vec<SeqId> = requests
        .iter()
        .map(|(p, s)| engine.add_request(p.clone(), s.clone()).unwrap())
        .collect();
    let mut out: HashMap<SeqId, Vec<SampledToken>> = HashMap::new();
    while engine.has_work() {
        for ev in engine.step() {
            assert!(!matches!(ev.finish, Some(FinishReason::Error(_))), "{ev:?}");
            out.entry(ev.seq).or_default().extend(ev.token);
        }
    }
    ids.iter()
        .map(|id| out.remove(id).unwrap_or_default())
        .collect()
}

/// The same requests without speculation (and without their predictions)
/// and with it give the same tokens and logprobs; returns the speculating
/// engine's (drafted, accepted).
fn assert_same(
    plain: &mut Engine,
    spec: &mut Engine,
    requests: &[(Vec<u32>, SamplingParams)],
) -> (u64, u64) {
    let unpredicted: Vec<_> = requests
        .iter()
        .map(|(p, s)| {
            let s = SamplingParams {
                prediction: Vec::new(),
                ..s.clone()
            };
            (p.clone(), s)
        })
        .collect();
    let want = run(plain, &unpredicted);
    let before = spec.stats().drafts;
    let got = run(spec, requests);
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.len(), requests[i].1.max_tokens, "request {i}");
        let ids = |t: &[SampledToken]| t.iter().map(|t| t.id).collect::<Vec<_>>();
        assert_eq!(
            ids(w),
            ids(g),
            "request {i}: tokens differ with speculation"
        );
        for (a, b) in w.iter().zip(g) {
            let (a, b) = (a.logprob.unwrap(), b.logprob.unwrap());
            assert!((a - b).abs() < 1e-3, "request {i}: logprob {a} vs {b}");
        }
    }
    let after = spec.stats().drafts;
    assert_eq!(plain.stats().drafts.drafted, 0);
    assert_eq!(spec.stats().blocks_used, 0, "every block is free again");
    (
        after.drafted - before.drafted,
        after.accepted - before.accepted,
    )
}

fn default_engines(cfg: &EngineConfig) -> (Engine, Engine, Tokenizer) {
    let (plain, tok) = common::engine(cfg);
    let (spec, _) = common::engine(&speculating(cfg));
    (plain, spec, tok)
}

#[test]
fn greedy_and_seeded_outputs_are_unchanged_and_copies_are_drafted() {
    let _alone = alone();
    let (mut plain, mut spec, tok) = default_engines(&EngineConfig::default());
    let copy = tok.encode(COPY).unwrap();
    // Alone, greedy: the answer repeats the prompt, so most drafts hold.
    let (drafted, accepted) = assert_same(&mut plain, &mut spec, &[(copy.clone(), greedy(40))]);
    eprintln!("copy, greedy: {accepted} of {drafted} drafted tokens kept");
    assert!(
        accepted * 2 > drafted && accepted >= 20,
        "{accepted} of {drafted}"
    );
    // Seeded sampling, with penalties that read every kept token.
    let (drafted, accepted) = assert_same(&mut plain, &mut spec, &[(copy.clone(), seeded(40, 7))]);
    eprintln!("copy, seeded: {accepted} of {drafted} drafted tokens kept");
    assert!(accepted > 0);
    // Together with rows that find nothing to draft, greedy and sampled.
    let mut batch = vec![(copy.clone(), greedy(32)), (copy, seeded(32, 11))];
    for (i, p) in PLAIN.iter().enumerate() {
        batch.push((tok.encode(p).unwrap(), seeded(24, i as u64)));
    }
    let (drafted, accepted) = assert_same(&mut plain, &mut spec, &batch);
    assert!(accepted > 0, "{accepted} of {drafted}");
}

#[test]
fn a_batch_of_copies_agrees_as_rows_finish() {
    let _alone = alone();
    let (mut plain, mut spec, tok) = default_engines(&EngineConfig::default());
    let copy = tok.encode(COPY).unwrap();
    // Twelve rows draft little; as the short ones finish, the long ones
    // draft more.
    let mut batch: Vec<_> = (0..10).map(|i| (copy.clone(), seeded(8, i))).collect();
    batch.push((copy.clone(), greedy(40)));
    batch.push((copy, greedy(40)));
    let (drafted, accepted) = assert_same(&mut plain, &mut spec, &batch);
    assert!(accepted > 0 && drafted > 0, "{accepted} of {drafted}");
}

#[test]
fn a_pool_too_small_for_drafts_preempts_and_still_agrees() {
    let _alone = alone();
    // 12 blocks of 16 tokens: three copies of ~60 prompt + 40 out cannot
    // all fit, so sequences are preempted and recomputed mid-draft.
    let info = common::load_default(WeightFormat::Native)
        .model
        .info()
        .clone();
    let per_block = KvLayout::bytes_per_block(
        info.num_layers,
        info.num_kv_heads,
        info.head_dim,
        16,
        info.kv_dtype,
    );
    let cfg = EngineConfig {
        block_size: 16,
        kv_cache_bytes: 12 * per_block,
        ..Default::default()
    };
    let (mut plain, mut spec, tok) = default_engines(&cfg);
    let copy = tok.encode(COPY).unwrap();
    let batch = vec![
        (copy.clone(), greedy(40)),
        (copy.clone(), seeded(40, 3)),
        (copy, greedy(40)),
    ];
    let (drafted, accepted) = assert_same(&mut plain, &mut spec, &batch);
    assert!(
        spec.stats().preemptions > 0,
        "the pool was meant to run dry"
    );
    assert!(accepted > 0, "{accepted} of {drafted}");
}

/// Sampled tokens that come from drafted rows follow the model's own
/// distribution: a chi-square test over 600 seeded draws, against the
/// exact probabilities read from the plain engine's logprobs (not from
/// sampling). Each draw continues a copy already under way with three
/// tokens at temperature 1.5 and top-k 4; its third token comes from a
/// drafted row whenever the draft of its second held. A verifier that kept
/// drafts too readily would over-count the copied token.
#[test]
fn tokens_sampled_from_drafted_rows_keep_the_distribution() {
    let _alone = alone();
    const DRAWS: u64 = 600;
    const TOP_K: usize = 4;
    const TEMPERATURE: f32 = 1.5;
    let (mut plain, mut spec, tok) = default_engines(&EngineConfig::default());
    let copy = tok.encode(COPY).unwrap();
    let mut prompt = copy.clone();
    prompt.extend(
        run(&mut plain, &[(copy, greedy(4))])[0]
            .iter()
            .map(|t| t.id),
    );
    let params = |seed| SamplingParams {
        max_tokens: 3,
        temperature: TEMPERATURE,
        top_k: TOP_K,
        seed: Some(seed),
        ignore_eos: true,
        ..Default::default()
    };
    let before = spec.stats().drafts;
    let mut draws = Vec::new();
    // Two at a time, so that the plan drafts even when the test threads
    // beside this one make its step times noisy.
    for group in (0..DRAWS).collect::<Vec<_>>().chunks(2) {
        let requests: Vec<_> = group.iter().map(|&s| (prompt.clone(), params(s))).collect();
        draws.extend(run(&mut spec, &requests));
    }
    let drafts = spec.stats().drafts;
    let accepted = drafts.accepted - before.accepted;
    // The commonest first two tokens; the third's among the draws with them.
    let mut prefixes: HashMap<(u32, u32), usize> = HashMap::new();
    for d in &draws {
        *prefixes.entry((d[0].id, d[1].id)).or_default() += 1;
    }
    let (&(a, b), &n) = prefixes.iter().max_by_key(|&(_, n)| *n).unwrap();
    let mut seen: HashMap<u32, usize> = HashMap::new();
    for d in draws.iter().filter(|d| (d[0].id, d[1].id) == (a, b)) {
        *seen.entry(d[2].id).or_default() += 1;
    }
    // The exact distribution: the raw logprobs' top k, at the temperature.
    let mut context = prompt.clone();
    context.extend([a, b]);
    let scored = SamplingParams {
        logprobs: Some(TOP_K),
        ..greedy(1)
    };
    let top = run(&mut plain, &[(context, scored)])[0][0]
        .top_logprobs
        .clone();
    let weights: Vec<f64> = top
        .iter()
        .map(|&(_, lp)| (f64::from(lp) / f64::from(TEMPERATURE)).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut chi2 = 0.0;
    let mut counted = 0;
    for (&(id, _), w) in top.iter().zip(&weights) {
        let expected = n as f64 * w / total;
        let observed = seen.get(&id).copied().unwrap_or(0);
        counted += observed;
        chi2 += (observed as f64 - expected).powi(2) / expected;
        eprintln!("token {id}: {observed} drawn, {expected:.1} expected");
    }
    eprintln!(
        "{n} draws continue ({a}, {b}); {accepted} drafted tokens kept over {DRAWS} draws; \
         chi-square {chi2:.2}"
    );
    assert_eq!(counted, n, "a third token outside the top {TOP_K}");
    // The third token came from a drafted row in most draws.
    assert!(accepted * 2 > DRAWS, "{accepted} drafted tokens kept");
    assert!(n >= 250, "only {n} draws share a prefix");
    // 3 degrees of freedom: 16.27 is the 0.1% tail.
    assert!(chi2 < 16.27, "chi-square {chi2:.2} over {n} draws");
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Random-weight models: a Llama, and a Gemma 3 whose sliding-window layers
/// (a 16-token window) hold only their window's blocks, on both K/V
/// storages: drafted rows past the window leave what the next step needs.
#[test]
fn random_models_give_the_same_tokens() {
    let _alone = alone();
    for (name, device_path) in [
        ("llama-tiny", false),
        ("gemma3-tiny", false),
        ("gemma3-tiny", true),
    ] {
        let engine = |cfg: &EngineConfig| {
            let loaded = load(&fixture(name), &LoadOptions::default(), &Device::Cpu).unwrap();
            let eos = loaded.tokenizer.eos_ids().to_vec();
            let cfg = EngineConfig {
                force_device_path: device_path,
                ..cfg.clone()
            };
            (
                Engine::new(loaded.model, eos, &cfg).unwrap(),
                loaded.tokenizer,
            )
        };
        let cfg = EngineConfig::default();
        let (mut plain, tok) = engine(&cfg);
        let (mut spec, _) = engine(&speculating(&cfg));
        let text = "one two three four five one two three four five one two three";
        let prompt = tok.encode(text).unwrap();
        let batch = vec![
            (prompt.clone(), greedy(48)),
            (prompt, seeded(48, 5)),
            (tok.encode(PLAIN[0]).unwrap(), greedy(32)),
        ];
        let (drafted, accepted) = assert_same(&mut plain, &mut spec, &batch);
        eprintln!("{name}: {accepted} of {drafted} drafted tokens kept");
        assert!(
            drafted > 0,
            "{name}: the repeated prompt was meant to draft"
        );
    }
}

/// Over HTTP: the same text whole and streamed as without speculation, the
/// drafts in `usage` and in `/metrics`.
#[tokio::test(flavor = "multi_thread")]
async fn served_answers_match_and_report_their_drafts() {
    let _alone = ONE_AT_A_TIME.lock().await;
    use common::{chunks, metric, post, sse, Server};
    use serde_json::json;

    let plain = Server::start(&[]);
    let spec = Server::start(&["--speculative", "ngram"]);
    let body = json!({
        "messages": [{"role": "user", "content":
            "Repeat this text exactly:\nThe quick brown fox jumps over the lazy dog. Pack my \
             box with five dozen liquor jugs. How vexingly quick daft zebras jump!"}],
        "max_tokens": 40, "temperature": 0,
    });
    let (status, want) = post(&plain, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{want}");
    assert!(want["usage"].get("completion_tokens_details").is_none());
    let (status, got) = post(&spec, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{got}");
    let text = got["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text, want["choices"][0]["message"]["content"]);
    let details = &got["usage"]["completion_tokens_details"];
    let accepted = details["accepted_prediction_tokens"].as_u64().unwrap();
    let rejected = details["rejected_prediction_tokens"].as_u64().unwrap();
    assert!(accepted > 0, "{details}");
    assert_eq!(
        metric(&spec, "wick:spec_decode_num_accepted_tokens_total").await,
        accepted as f64
    );
    assert_eq!(
        metric(&spec, "wick:spec_decode_num_draft_tokens_total").await,
        (accepted + rejected) as f64
    );

    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let cs = chunks(&sse(&spec, "/v1/chat/completions", streamed).await);
    let joined: String = cs
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap())
        .filter_map(|c| c["delta"]["content"].as_str())
        .collect();
    assert_eq!(joined, text);
    // How much is drafted follows the step times measured, so only the
    // report's presence is the same.
    let usage = &cs.last().unwrap()["usage"];
    let streamed = &usage["completion_tokens_details"];
    assert!(
        streamed["accepted_prediction_tokens"].as_u64().unwrap() > 0,
        "{usage}"
    );
}

/// A request's prediction drafts even without `--speculative`: the whole
/// expected answer is mostly kept, a wrong one costs only its rows, and
/// neither changes the output.
#[test]
fn a_prediction_drafts_without_prompt_lookup_and_changes_nothing() {
    let _alone = alone();
    let (mut plain, tok) = common::engine(&EngineConfig::default());
    let copy = tok.encode(COPY).unwrap();
    let want = run(&mut plain, &[(copy.clone(), greedy(40))]).remove(0);
    let want_ids: Vec<u32> = want.iter().map(|t| t.id).collect();
    let with = |prediction: Vec<u32>| SamplingParams {
        prediction,
        ..greedy(40)
    };
    let (drafted, accepted) = assert_same(
        &mut plain,
        &mut common::engine(&EngineConfig::default()).0,
        &[(copy.clone(), with(want_ids.clone()))],
    );
    eprintln!("exact prediction: {accepted} of {drafted} drafted tokens kept");
    assert!(
        accepted >= 20 && accepted * 10 >= drafted * 9,
        "{accepted} of {drafted}"
    );
    // A prediction that is nothing like the answer, and one with an edit.
    let wrong: Vec<u32> = (0..40).map(|i| 100 + i).collect();
    let mut edited = want_ids.clone();
    edited.insert(10, 100);
    let (_, accepted) = assert_same(
        &mut plain,
        &mut common::engine(&EngineConfig::default()).0,
        &[
            (copy.clone(), with(wrong)),
            (copy, with(edited)),
            (tok.encode(PLAIN[0]).unwrap(), greedy(16)),
        ],
    );
    assert!(accepted >= 20, "the edited one realigns: {accepted}");
}

#[test]
fn a_model_that_cannot_take_drafts_back_refuses_a_prediction() {
    let _alone = alone();
    // Qwen3.5's recurrent state cannot be cut back to the kept tokens.
    let loaded = load(
        &fixture("qwen35-tiny"),
        &LoadOptions::default(),
        &Device::Cpu,
    )
    .unwrap();
    let mut engine = Engine::new(loaded.model, vec![], &EngineConfig::default()).unwrap();
    let params = SamplingParams {
        prediction: vec![1, 2, 3],
        ..greedy(4)
    };
    match engine.add_request(vec![1, 2], params) {
        Err(wick::error::WickError::InvalidRequest { param, message }) => {
            assert_eq!(param.as_deref(), Some("prediction"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(engine.add_request(vec![1, 2], greedy(4)).is_ok());
}

/// Over HTTP, OpenAI's `prediction` field on a server started without
/// `--speculative`.
#[tokio::test(flavor = "multi_thread")]
async fn served_predictions_report_their_drafts() {
    let _alone = ONE_AT_A_TIME.lock().await;
    use common::{post, Server};
    use serde_json::json;

    let s = Server::start(&[]);
    let mut body = json!({
        "messages": [{"role": "user", "content": "Say the alphabet from a to k, with spaces."}],
        "max_tokens": 24, "temperature": 0,
    });
    let (status, plain) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{plain}");
    let text = plain["choices"][0]["message"]["content"].as_str().unwrap();
    body["prediction"] = json!({"type": "content", "content": text});
    let (status, got) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["choices"][0]["message"]["content"], text);
    let details = &got["usage"]["completion_tokens_details"];
    assert!(
        details["accepted_prediction_tokens"].as_u64().unwrap() > 0,
        "{details}"
    );
}

/// The default model in f32 (its Q4_1 weights dequantized) without drafts,
/// and drafted for by its Q4_1 form: nearly the same model, several times
/// cheaper a token, so the plan keeps drafting (a draft model as dear as
/// the target would stop once its rounds were timed).
fn drafted_for_by_q4_1() -> (Engine, Engine, Tokenizer) {
    let f32_engine = |cfg: &EngineConfig| {
        let loaded = common::load_default(WeightFormat::F32);
        let eos = loaded.tokenizer.eos_ids().to_vec();
        (
            Engine::new(loaded.model, eos, cfg).unwrap(),
            loaded.tokenizer,
        )
    };
    let (plain, tok) = f32_engine(&EngineConfig::default());
    let draft = common::load_default(WeightFormat::Native).model;
    // Small steps: the copy prompt prefills in chunks, which the draft
    // model caches alongside the target.
    let chunked = EngineConfig {
        max_num_batched_tokens: 16,
        ..EngineConfig::default()
    };
    let spec = f32_engine(&chunked)
        .0
        .with_draft_model(draft, 64 << 20)
        .unwrap();
    (plain, spec, tok)
}

/// `--draft-model`: the default model's Q4_1 drafting for its f32 form,
/// near the upper bound on acceptance, keeps the output and nearly every
/// greedy draft.
#[test]
fn a_draft_model_drafting_for_its_f32_form_keeps_the_output() {
    let _alone = alone();
    let (mut plain, mut spec, tok) = drafted_for_by_q4_1();
    let greedy_only = [
        (tok.encode(COPY).unwrap(), greedy(30)),
        (tok.encode(PLAIN[2]).unwrap(), greedy(30)),
    ];
    let (drafted, accepted) = assert_same(&mut plain, &mut spec, &greedy_only);
    eprintln!("Q4_1 drafting for f32, greedy: {accepted} of {drafted} drafted tokens kept");
    assert!(
        // Nearly the same model: about 90% hold (a draft model that had
        // not cached the prompt rightly keeps about 15%).
        drafted >= 20 && accepted * 4 >= drafted * 3,
        "{accepted} of {drafted}"
    );
    // Sampled rows keep their seeded tokens too, beside a grammar-free
    // greedy one and a prediction.
    let copy = tok.encode(COPY).unwrap();
    let mixed = [
        (copy.clone(), seeded(30, 4)),
        (tok.encode(PLAIN[0]).unwrap(), greedy(20)),
        (
            copy,
            SamplingParams {
                prediction: tok.encode("The quick brown fox").unwrap(),
                ..greedy(20)
            },
        ),
    ];
    let (drafted, _) = assert_same(&mut plain, &mut spec, &mixed);
    assert!(drafted > 0);
}

/// A draft model proposes what the request's own sampler draws from it
/// with the keys the target's rows will be sampled with, so sampled
/// drafts hold about as often as greedy ones, where the two models agree,
/// and the seeded output is still the target's.
#[test]
fn sampled_drafts_hold_where_the_draft_model_agrees() {
    let _alone = alone();
    let (mut plain, mut spec, tok) = drafted_for_by_q4_1();
    let hot = |seed| SamplingParams {
        temperature: 1.0,
        ..seeded(40, seed)
    };
    let requests: Vec<_> = PLAIN
        .iter()
        .zip(1..)
        .map(|(p, seed)| (tok.encode(p).unwrap(), hot(seed)))
        .collect();
    let (drafted, accepted) = assert_same(&mut plain, &mut spec, &requests);
    eprintln!("Q4_1 drafting for f32, sampled: {accepted} of {drafted} drafted tokens kept");
    // 74-94% hold; greedy proposals, which hold with the target's
    // probability of the draft's argmax, kept 47%.
    assert!(
        drafted >= 20 && accepted * 3 >= drafted * 2,
        "{accepted} of {drafted}"
    );
}

#[test]
fn a_draft_model_must_share_the_vocabulary() {
    let _alone = alone();
    let (engine, _) = common::engine(&EngineConfig::default());
    let other = load(
        &fixture("llama-tiny"),
        &LoadOptions::default(),
        &Device::Cpu,
    )
    .unwrap();
    let err = engine.with_draft_model(other.model, 1 << 20).err().unwrap();
    assert!(err.to_string().contains("vocabulary"), "{err}");
}

/// `wick serve --draft-model`: the same answer, its drafts in `usage`.
#[tokio::test(flavor = "multi_thread")]
async fn served_with_a_draft_model() {
    let _alone = ONE_AT_A_TIME.lock().await;
    use common::{post, Server};
    use serde_json::json;

    let path = common::model_path();
    // The f32 form, drafted for by the file's own Q4_1 (the draft model
    // keeps its file's format): drafts pay, and go on after the first.
    let plain = Server::start(&["--weights", "f32"]);
    let spec = Server::start(&["--weights", "f32", "--draft-model", path.to_str().unwrap()]);
    let body = json!({
        "messages": [{"role": "user", "content": "Write a haiku about rivers."}],
        "max_tokens": 24, "temperature": 0,
    });
    let (status, want) = post(&plain, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{want}");
    let (status, got) = post(&spec, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        got["choices"][0]["message"]["content"],
        want["choices"][0]["message"]["content"]
    );
    let details = &got["usage"]["completion_tokens_details"];
    assert!(
        details["accepted_prediction_tokens"].as_u64().unwrap() > 0,
        "{details}"
    );
}
