//! `wick serve` on a Hugging Face checkpoint: the tiny GPT-2 fixture answers
//! completions (streamed and not) with transformers' greedy tokens, enforces
//! n_positions, and refuses chat without a template unless one is given; a
//! mixture of experts serves concurrent requests with transformers' greedy
//! tokens and counts its routing in /metrics.

mod common;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use common::{assert_error, chunks, post, sse, Server};

fn gpt2_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2-tiny")
}

fn reference() -> Value {
    let text = std::fs::read_to_string(gpt2_dir().join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn gpt2_checkpoint_serves_completions_and_refuses_chat_without_template() {
    let dir = gpt2_dir();
    let server = Server::start(&["--model", dir.to_str().unwrap()]);
    let r = reference();
    let tokenizer = wick::load::loader::load_tokenizer(&dir).unwrap();

    let (status, models) = get_json(&server, "/v1/models").await;
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "gpt2-tiny");
    let max_len = models["data"][0]["max_model_len"].as_u64().unwrap();
    assert_eq!(
        Some(max_len),
        serde_json::from_str::<Value>(&std::fs::read_to_string(dir.join("config.json")).unwrap())
            .unwrap()["n_positions"]
            .as_u64()
    );

    // Token-id prompts, so the check covers the model alone.
    for (input, greedy) in r["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(r["greedy"].as_array().unwrap())
    {
        let greedy = ids(greedy);
        let body = json!({
            "model": "gpt2-tiny", "prompt": input, "max_tokens": greedy.len(),
            "temperature": 0, "ignore_eos": true,
        });
        let (status, resp) = post(&server, "/v1/completions", body.clone()).await;
        assert_eq!(status, 200, "{resp}");
        let text = resp["choices"][0]["text"].as_str().unwrap().to_string();
        assert_eq!(text, tokenizer.decode(&greedy).unwrap());
        assert_eq!(resp["usage"]["completion_tokens"], greedy.len());

        let mut stream_body = body;
        stream_body["stream"] = json!(true);
        let streamed: String = chunks(&sse(&server, "/v1/completions", stream_body).await)
            .iter()
            .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
            .collect();
        assert_eq!(streamed, text);
    }

    let (status, body) = post(
        &server,
        "/v1/completions",
        json!({"prompt": "hello", "max_tokens": max_len}),
    )
    .await;
    assert_error(status, &body, 400, None);
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");

    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let (status, body) = post(&server, "/v1/chat/completions", chat).await;
    assert_error(status, &body, 400, None);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("no chat template") && message.contains("--chat-template"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_template_flag_enables_chat_for_gpt2() {
    let template = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        template.path(),
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}\
         {% if add_generation_prompt %}assistant:{% endif %}",
    )
    .unwrap();
    let dir = gpt2_dir();
    let server = Server::start(&[
        "--model",
        dir.to_str().unwrap(),
        "--chat-template",
        template.path().to_str().unwrap(),
    ]);
    let chat = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4, "temperature": 0,
    });
    let (status, body) = post(&server, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{body}");
    let tokenizer = wick::load::loader::load_tokenizer(&dir).unwrap();
    let prompt_ids = tokenizer.encode("user: hi\nassistant:").unwrap();
    assert_eq!(body["usage"]["prompt_tokens"], prompt_ids.len(), "{body}");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
}

async fn get_json(server: &Server, path: &str) -> (u16, Value) {
    let r = reqwest::get(server.url(path)).await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// `log_softmax(row)[id]`, in f64.
fn logprob(row: &Value, id: u32) -> f64 {
    let row: Vec<f64> = row
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
    row[id as usize] - lse
}

/// OpenAI's echo with logprobs: the prompt's tokens come first (the first
/// unscored, null), scored with transformers' logits, offsets into the
/// echoed text; streamed and whole answers agree.
#[tokio::test(flavor = "multi_thread")]
async fn echo_with_logprobs_scores_the_prompt_as_transformers_does() {
    let dir = gpt2_dir();
    let server = Server::start(&["--model", dir.to_str().unwrap()]);
    let r = reference();
    let input = ids(&r["inputs"][1]);
    let max_tokens = 3;
    let body = json!({
        "prompt": input, "echo": true, "logprobs": 2, "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": true,
    });
    let (status, resp) = post(&server, "/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{resp}");
    let choice = &resp["choices"][0];
    let lp = &choice["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), input.len() + max_tokens, "{lp}");
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    for j in 1..input.len() {
        let want = logprob(&r["logits"][1][j - 1], input[j]);
        let got = lp["token_logprobs"][j].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-4,
            "prompt token {j}: {got} vs {want}"
        );
        // Up to 2 entries: distinct ids may decode to the same text key.
        let row = &r["logits"][1][j - 1];
        let mut best: Vec<f64> = (0..row.as_array().unwrap().len() as u32)
            .map(|id| logprob(row, id))
            .collect();
        best.sort_by(|a, b| b.total_cmp(a));
        let top = lp["top_logprobs"][j].as_object().unwrap();
        assert!((1..=2).contains(&top.len()), "{top:?}");
        for v in top.values() {
            let v = v.as_f64().unwrap();
            assert!(
                best[..2].iter().any(|b| (b - v).abs() < 1e-4),
                "{v} vs {best:?}"
            );
        }
    }
    // Offsets walk the echoed prompt and then the completion.
    let text = choice["text"].as_str().unwrap();
    let mut offset = 0;
    for (k, t) in tokens.iter().enumerate() {
        assert_eq!(lp["text_offset"][k], offset, "token {k}");
        offset += t.chars().count();
    }
    assert_eq!(tokens.concat(), text);

    let mut stream_body = body;
    stream_body["stream"] = json!(true);
    let streamed = chunks(&sse(&server, "/v1/completions", stream_body).await);
    let mut joined = Vec::new();
    for c in &streamed {
        if let Some(toks) = c["choices"][0]["logprobs"]["tokens"].as_array() {
            let l = &c["choices"][0]["logprobs"];
            for k in 0..toks.len() {
                joined.push((
                    toks[k].clone(),
                    l["token_logprobs"][k].clone(),
                    l["text_offset"][k].clone(),
                ));
            }
        }
    }
    let whole: Vec<_> = (0..tokens.len())
        .map(|k| {
            (
                lp["tokens"][k].clone(),
                lp["token_logprobs"][k].clone(),
                lp["text_offset"][k].clone(),
            )
        })
        .collect();
    assert_eq!(joined, whole);
}

/// Gemma 3 from llama.cpp's converter's GGUF: completions and chat (its
/// template), and the sliding-window layers' pool in /metrics: room for two
/// sequences' windows, apart from the global layers' pool, and empty again
/// once the requests are done.
#[tokio::test(flavor = "multi_thread")]
async fn gemma3_gguf_serves_with_its_window_pool_in_metrics() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let gguf = fixtures.join("gguf-tiny/gemma3-f32.gguf");
    let server = Server::start(&[
        "--model",
        gguf.to_str().unwrap(),
        "--max-num-seqs",
        "2",
        "--max-num-batched-tokens",
        "8",
        "--block-size",
        "4",
    ]);
    let text = std::fs::read_to_string(fixtures.join("gemma3-tiny/reference.json")).unwrap();
    let long = ids(&serde_json::from_str::<Value>(&text).unwrap()["long"]["ids"]);
    let body = json!({"prompt": long, "max_tokens": 40, "temperature": 0, "ignore_eos": true});
    let (status, resp) = post(&server, "/v1/completions", body).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["usage"]["completion_tokens"], 40);
    let chat = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
                      "max_tokens": 8});
    let (status, resp) = post(&server, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{resp}");
    assert!(
        resp["choices"][0]["message"]["content"].is_string(),
        "{resp}"
    );

    let held = wick::engine::window_blocks::WindowBlocks::held_at_most(16, 4, 8, 256);
    assert_eq!(
        common::metric(&server, "wick:kv_window_blocks_capacity").await,
        (2 * held) as f64
    );
    assert!(common::metric(&server, "wick:kv_blocks_capacity").await > (2 * held) as f64);
    assert_eq!(
        common::metric(&server, "wick:kv_window_blocks_used").await,
        0.0
    );
}

/// Qwen3-MoE's checkpoint served with small prefill chunks and prompt-lookup
/// drafting (drafts verified through the experts). One streamed
/// request gives transformers' greedy tokens, and `/metrics` then counts
/// exactly top-k experts per layer for every row the model ran. Then its
/// inputs sent at once, each with `n` 2, batch their rows through the
/// experts (several rows to one expert, experts with none) and must still
/// give transformers' greedy tokens; a chat goes through its template, and
/// a JSON schema constrains one.
#[tokio::test(flavor = "multi_thread")]
async fn moe_checkpoint_serves_batched_requests_and_counts_its_routing() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3moe-tiny");
    let server = Server::start(&[
        "--model",
        dir.to_str().unwrap(),
        "--max-num-batched-tokens",
        "8",
        "--speculative",
        "ngram",
    ]);
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let r: Value = serde_json::from_str(&text).unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let top_k = config["num_experts_per_tok"].as_u64().unwrap() as f64;
    // transformers 5 writes Qwen3-MoE's `num_experts` under Mixtral's name.
    let experts = config["num_local_experts"].as_u64().unwrap();
    let tokenizer = wick::load::loader::load_tokenizer(&dir).unwrap();
    let cases: Vec<(Vec<u32>, Vec<u32>)> = r["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(r["greedy"].as_array().unwrap())
        .map(|(i, g)| (ids(i), ids(g)))
        .collect();

    let (input, greedy) = &cases[0];
    let body = json!({
        "prompt": input, "max_tokens": greedy.len(), "temperature": 0,
        "ignore_eos": true, "stream": true,
    });
    let streamed: String = chunks(&sse(&server, "/v1/completions", body).await)
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, tokenizer.decode(greedy).unwrap());
    // The prompt's rows, every sampled token but the last, and each drafted
    // token that verification turned down.
    let drafted = common::metric(&server, "wick:spec_decode_num_draft_tokens_total").await;
    let accepted = common::metric(&server, "wick:spec_decode_num_accepted_tokens_total").await;
    let rows = (input.len() + greedy.len() - 1) as f64 + drafted - accepted;
    for layer in 0..2 {
        let mut routed = 0.0;
        for e in 0..experts {
            let series =
                format!("wick:moe_expert_tokens_total{{layer=\"{layer}\",expert=\"{e}\"}}");
            routed += common::metric(&server, &series).await;
        }
        assert_eq!(routed, top_k * rows, "layer {layer}");
    }

    let requests = cases.iter().map(|(input, greedy)| {
        let body = json!({
            "prompt": input, "max_tokens": greedy.len(), "temperature": 0,
            "ignore_eos": true, "n": 2,
        });
        post(&server, "/v1/completions", body)
    });
    let answers = futures::future::join_all(requests).await;
    for ((status, resp), (input, greedy)) in answers.into_iter().zip(&cases) {
        assert_eq!(status, 200, "{resp}");
        for choice in resp["choices"].as_array().unwrap() {
            assert_eq!(
                choice["text"],
                tokenizer.decode(greedy).unwrap(),
                "{input:?}"
            );
        }
    }

    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6});
    let (status, resp) = post(&server, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{resp}");
    assert!(
        resp["choices"][0]["message"]["content"].is_string(),
        "{resp}"
    );
    let schema = json!({"type": "string", "enum": ["yes", "no"]});
    let chat = json!({"messages": [{"role": "user", "content": "yes or no?"}], "max_tokens": 8,
                      "response_format": {"type": "json_schema",
                                          "json_schema": {"name": "a", "schema": schema}}});
    let (status, resp) = post(&server, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{resp}");
    let content = resp["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(["\"yes\"", "\"no\""].contains(&content), "{resp}");
}
