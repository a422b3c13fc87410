//! `wick serve` over real HTTP on the default model: every endpoint, the
//! OpenAI response and stream shapes, bad input, disconnects, overload,
//! preemption and graceful shutdown.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use common::{
    assert_error, choice_chunks, chunks, long_stream, metric, metrics_text, open_stream, post, sse,
    Server,
};

/// Waits (up to 5 s) for a metric that follows an asynchronous effect,
/// such as an abort reaching the scheduler, to reach `value`.
async fn settles_at(server: &Server, name: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = metric(server, name).await;
        if now == value {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} stayed at {now}, not {value}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn completions_stream_equals_non_stream_and_shapes_match_openai() {
    let s = Server::start(&[]);
    let body = json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0});
    let (status, whole) = post(&s, "/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    assert_eq!(whole["usage"]["completion_tokens"], 12);
    assert_eq!(whole["choices"][0]["finish_reason"], "length");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let cs = chunks(&sse(&s, "/v1/completions", streamed).await);
    let id = cs[0]["id"].clone();
    assert!(cs
        .iter()
        .all(|c| c["id"] == id && c["object"] == "text_completion"));
    let joined: String = cs
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap())
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(joined, text);
    let finishes: Vec<&Value> = cs
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap())
        .filter(|c| !c["finish_reason"].is_null())
        .collect();
    assert_eq!(finishes.len(), 1);
    let last = cs.last().unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    assert_eq!(last["usage"]["completion_tokens"], 12);
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_streams_role_first_and_one_finish_per_choice() {
    let s = Server::start(&[]);
    let body = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
                      "max_completion_tokens": 16, "temperature": 0, "n": 2});
    let (status, whole) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"].as_array().unwrap().len(), 2);
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let cs = chunks(&sse(&s, "/v1/chat/completions", streamed).await);
    for index in 0..2 {
        let mine = choice_chunks(&cs, index);
        assert_eq!(mine[0]["delta"]["role"], "assistant");
        assert_eq!(
            mine.iter()
                .filter(|c| !c["finish_reason"].is_null())
                .count(),
            1
        );
        let text: String = mine
            .iter()
            .filter_map(|c| c["delta"]["content"].as_str())
            .collect();
        assert_eq!(
            text,
            whole["choices"][index]["message"]["content"]
                .as_str()
                .unwrap()
        );
    }
    assert!(cs.iter().all(|c| c["object"] == "chat.completion.chunk"));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_openai_errors() {
    let s = Server::start(&["--max-body-bytes", "4096"]);
    let client = reqwest::Client::new();
    let raw = |body: &'static str| {
        client
            .post(s.url("/v1/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let r = raw("{not json").await.unwrap();
    let st = r.status().as_u16();
    assert_error(st, &r.json().await.unwrap(), 400, None);
    for (body, param) in [
        (json!({"prompt": "x", "temperature": 3}), "temperature"),
        (json!({"prompt": "x", "top_p": 1.5}), "top_p"),
        (json!({"prompt": "x", "n": 0}), "n"),
        (json!({"prompt": "x", "max_tokens": 0}), "max_tokens"),
        (
            json!({"prompt": "x", "presence_penalty": 2.5}),
            "presence_penalty",
        ),
        (json!({"prompt": "x", "logprobs": 21}), "logprobs"),
        (
            json!({"prompt": "x", "stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (json!({"prompt": [1, 2, 999999]}), "prompt"),
        (
            json!({"prompt": "x", "logit_bias": {"999999": 1}}),
            "logit_bias",
        ),
    ] {
        let (st, b) = post(&s, "/v1/completions", body).await;
        assert_error(st, &b, 400, Some(param));
    }
    let (st, b) = post(&s, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 21, "logprobs": true})).await;
    assert_error(st, &b, 400, Some("top_logprobs"));
    let (st, b) = post(&s, "/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(st, 200, "a minimal request works: {b}");
    let (st, b) = post(
        &s,
        "/v1/completions",
        json!({"model": "gpt-4", "prompt": "x"}),
    )
    .await;
    assert_error(st, &b, 404, None);
    assert_eq!(b["error"]["code"], "model_not_found");
    let (st, b) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 9000}),
    )
    .await;
    assert_error(st, &b, 400, None);
    assert_eq!(b["error"]["code"], "context_length_exceeded");
    let streamed = json!({"prompt": "x", "max_tokens": 9000, "stream": true});
    let (st, b) = post(&s, "/v1/completions", streamed).await;
    assert_eq!(
        b["error"]["code"], "context_length_exceeded",
        "decided before the stream starts ({st})"
    );
    let r = client.get(s.url("/v1/completions")).send().await.unwrap();
    let st = r.status().as_u16();
    assert_error(st, &r.json().await.unwrap(), 405, None);
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(10_000));
    let r = client
        .post(s.url("/v1/completions"))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    assert_error(st, &r.json().await.unwrap(), 413, None);
    // The server is still fine.
    let (st, _) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(st, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn tokenize_detokenize_models_health_metrics() {
    let s = Server::start(&[]);
    let (st, a) = post(&s, "/tokenize", json!({"prompt": "Hello, world!"})).await;
    assert_eq!(st, 200);
    assert_eq!(
        a["tokens"],
        json!([19556, 28, 905, 17]),
        "llama.cpp's ids for this text"
    );
    assert_eq!(a["count"], 4);
    let (_, b) = post(&s, "/tokenize", json!({"content": "Hello, world!"})).await;
    assert_eq!(a["tokens"], b["tokens"]);
    let (st, d) = post(&s, "/detokenize", json!({"tokens": [19556, 28, 905, 17]})).await;
    assert_eq!(st, 200);
    assert_eq!(d["prompt"], "Hello, world!");
    assert_eq!(d["content"], "Hello, world!");
    let m: Value = reqwest::get(s.url("/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["object"], "model");
    assert_eq!(m["data"][0]["max_model_len"], 8192);
    let (st, _) = post(
        &s,
        "/v1/completions",
        json!({"model": m["data"][0]["id"], "prompt": "Hi", "max_tokens": 3, "ignore_eos": true}),
    )
    .await;
    assert_eq!(st, 200);
    assert!(metric(&s, "wick:prompt_tokens_total").await > 0.0);
    assert_eq!(metric(&s, "wick:generation_tokens_total").await, 3.0);
    assert!(metric(&s, "wick:kv_blocks_capacity").await > 0.0);
    assert_eq!(
        metric(&s, "wick:time_to_first_token_seconds_count").await,
        1.0
    );
    // vLLM's dashboards select series by the served model's name.
    let labelled = format!(
        "wick:generation_tokens_total{{model_name={}}} 3",
        m["data"][0]["id"]
    );
    let text = metrics_text(&s).await;
    assert!(
        text.lines().any(|l| l == labelled),
        "{labelled} in:\n{text}"
    );
}

/// Greedy output of each prompt alone, then all at once.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_streams_equal_their_solo_output() {
    let s = Server::start(&[]);
    let prompts: Vec<String> = (0..32)
        .map(|i| format!("Fact number {i} about the ocean:"))
        .collect();
    let body = |p: &str| json!({"prompt": p, "max_tokens": 10, "temperature": 0, "stream": true});
    let collect = |events: Vec<String>| -> String {
        chunks(&events)
            .iter()
            .flat_map(|c| c["choices"].as_array().unwrap().clone())
            .map(|c| c["text"].as_str().unwrap().to_string())
            .collect()
    };
    let mut solo = Vec::new();
    for p in &prompts {
        solo.push(collect(sse(&s, "/v1/completions", body(p)).await));
    }
    let all =
        futures::future::join_all(prompts.iter().map(|p| sse(&s, "/v1/completions", body(p))))
            .await;
    for (i, events) in all.into_iter().enumerate() {
        assert_eq!(collect(events), solo[i], "prompt {i}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn disconnect_frees_blocks() {
    let s = Server::start(&[]);
    let r = reqwest::Client::new()
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": "Write a very long story.", "max_tokens": 2000, "stream": true, "ignore_eos": true}))
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    body.next().await.unwrap().unwrap();
    assert!(metric(&s, "wick:kv_blocks_used").await > 0.0);
    drop(body);
    settles_at(&s, "wick:kv_blocks_used", 0.0).await;
    assert_eq!(metric(&s, "wick:num_requests_running").await, 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn full_queue_answers_503_with_retry_after() {
    let s = Server::start(&["--max-num-seqs", "1", "--max-waiting", "1"]);
    let client = reqwest::Client::new();
    let send = || {
        client
            .post(s.url("/v1/completions"))
            .json(&json!({"prompt": "Count slowly:", "max_tokens": 300, "ignore_eos": true}))
            .send()
    };
    let results = futures::future::join_all((0..6).map(|_| send())).await;
    let statuses: Vec<u16> = results
        .iter()
        .map(|r| r.as_ref().unwrap().status().as_u16())
        .collect();
    assert!(statuses.contains(&503), "{statuses:?}");
    assert!(statuses.contains(&200), "{statuses:?}");
    let busy = results
        .into_iter()
        .map(Result::unwrap)
        .find(|r| r.status() == 503)
        .unwrap();
    assert!(busy.headers().contains_key("retry-after"));
    let b: Value = busy.json().await.unwrap();
    assert_error(503, &b, 503, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn tiny_kv_budget_preempts_and_still_gives_solo_output() {
    // 1 MiB holds 11 blocks of 4 tokens for this model: one request of ~35
    // tokens needs 9, so six at once must preempt each other.
    let s = Server::start(&["--kv-cache-memory", "1", "--block-size", "4"]);
    let body = |i: usize| json!({"prompt": format!("List {i} animals:"), "max_tokens": 30, "temperature": 0, "ignore_eos": true});
    let mut solo = Vec::new();
    for i in 0..6 {
        let (st, b) = post(&s, "/v1/completions", body(i)).await;
        assert_eq!(st, 200, "{b}");
        solo.push(b["choices"][0]["text"].as_str().unwrap().to_string());
    }
    let together =
        futures::future::join_all((0..6).map(|i| post(&s, "/v1/completions", body(i)))).await;
    for (i, (st, b)) in together.iter().enumerate() {
        assert_eq!(*st, 200, "{b}");
        assert_eq!(b["choices"][0]["text"].as_str().unwrap(), solo[i]);
    }
    assert!(metric(&s, "wick:num_preemptions_total").await > 0.0);
    assert_eq!(metric(&s, "wick:kv_blocks_used").await, 0.0);
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_finishes_in_flight_requests_and_exits_zero() {
    let mut s = Server::start(&[]);
    let client = reqwest::Client::new();
    let req = client
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": "Once", "max_tokens": 64, "ignore_eos": true}))
        .send();
    let pending = tokio::spawn(req);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = s.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let r = pending.await.unwrap().unwrap();
    assert_eq!(r.status(), 200);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["usage"]["completion_tokens"], 64);
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// `--kv-cache-dtype int8` stores head_dim + 4 bytes per token and head
/// instead of f16's 2 * head_dim, so a budget holds that many more blocks,
/// and the server answers from it.
#[tokio::test(flavor = "multi_thread")]
async fn int8_kv_cache_fits_more_blocks_and_serves() {
    // The pool's size shows in /metrics after the first step.
    async fn blocks_after_a_request(s: &Server) -> f64 {
        let body = json!({"prompt": "The capital of France is", "max_tokens": 8,
                          "temperature": 0, "ignore_eos": true});
        let (st, body) = post(s, "/v1/completions", body).await;
        assert_eq!(st, 200, "{body}");
        assert_eq!(body["usage"]["completion_tokens"], 8);
        metric(s, "wick:kv_blocks_capacity").await
    }
    let budget = ["--kv-cache-memory", "16"];
    let f16_blocks = blocks_after_a_request(&Server::start(&budget)).await;
    let s = Server::start(&[budget[0], budget[1], "--kv-cache-dtype", "int8"]);
    let int8_blocks = blocks_after_a_request(&s).await;
    // SmolLM2: head_dim 64, so 128 against 68 bytes per token and head.
    let ratio = int8_blocks / f16_blocks;
    assert!(
        (ratio - 128.0 / 68.0).abs() < 0.01,
        "{int8_blocks} vs {f16_blocks}"
    );
}

/// The request_success_total series by finish reason, summed.
async fn finished_requests(s: &Server) -> f64 {
    let text = metrics_text(s).await;
    text.lines()
        .filter(|l| l.starts_with("wick:request_success_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A stop string ends its choice once: one finish chunk, no text or tokens
/// after it, and one finished request in the metrics (n > 1 included).
#[tokio::test(flavor = "multi_thread")]
async fn a_stop_string_finishes_once_with_usage_to_match() {
    let s = Server::start(&[]);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0,
                      "stop": ["."], "n": 2});
    let before = finished_requests(&s).await;
    let (st, whole) = post(&s, "/v1/completions", body.clone()).await;
    assert_eq!(st, 200, "{whole}");
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    // The same request without the stop string shows where it would match:
    // the text before it, and the tokens up to the one completing it are all
    // that may be counted.
    let mut free = body.clone();
    free["stop"] = json!(null);
    free["logprobs"] = json!(0);
    let (_, free) = post(&s, "/v1/completions", free).await;
    let free_text = free["choices"][0]["text"].as_str().unwrap();
    assert_eq!(text, free_text[..free_text.find('.').unwrap()]);
    let tokens = free["choices"][0]["logprobs"]["tokens"].as_array().unwrap();
    let mut seen = String::new();
    let upto = 1 + tokens
        .iter()
        .position(|t| {
            seen.push_str(t.as_str().unwrap());
            seen.contains('.')
        })
        .unwrap();
    assert_eq!(whole["usage"]["completion_tokens"], 2 * upto as u64);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let cs = chunks(&sse(&s, "/v1/completions", streamed).await);
    for index in 0..2 {
        let mine = choice_chunks(&cs, index);
        let finishes: Vec<usize> = (0..mine.len())
            .filter(|&i| !mine[i]["finish_reason"].is_null())
            .collect();
        assert_eq!(finishes, [mine.len() - 1], "one finish, and last");
        let joined: String = mine.iter().map(|c| c["text"].as_str().unwrap()).collect();
        assert_eq!(joined, whole["choices"][index]["text"].as_str().unwrap());
    }
    assert_eq!(cs.last().unwrap()["usage"], whole["usage"]);
    assert_eq!(
        finished_requests(&s).await - before,
        3.0,
        "three requests, each counted once"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_request_timeout_ends_a_long_generation_as_length() {
    let s = Server::start(&["--request-timeout-secs", "1"]);
    let body = json!({"prompt": "Count:", "max_tokens": 4000, "ignore_eos": true});
    let (st, whole) = post(&s, "/v1/completions", body.clone()).await;
    assert_eq!(st, 200, "{whole}");
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    let n = whole["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..4000).contains(&n), "{n}");
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let cs = chunks(&sse(&s, "/v1/completions", streamed).await);
    let last = &cs.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "length");
    // The sequences are aborted in the engine, which frees their blocks.
    settles_at(&s, "wick:num_requests_running", 0.0).await;
    settles_at(&s, "wick:kv_blocks_used", 0.0).await;
}

/// --max-waiting counts what waits beyond the free batch slots: a burst
/// the slots can take is admitted whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_is_admitted_while_batch_slots_are_free() {
    let s = Server::start(&["--max-waiting", "2"]);
    let body = json!({"prompt": "Hi", "max_tokens": 4});
    let all =
        futures::future::join_all((0..60).map(|_| post(&s, "/v1/completions", body.clone()))).await;
    let refused = all.iter().filter(|(st, _)| *st != 200).count();
    assert_eq!(refused, 0, "{:?}", all.iter().find(|(st, _)| *st != 200));
}

/// A streaming client that leaves while its request is still queued frees
/// it at once, without waiting for it to be scheduled.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_gone_while_queued_is_dropped_from_the_queue() {
    let s = Server::start(&["--max-num-seqs", "1"]);
    let mut running = open_stream(&s, &long_stream()).await.bytes_stream();
    running.next().await.unwrap().unwrap();
    let aborted_before = metric(&s, "wick:request_success_total{finished_reason=\"abort\"}").await;
    let queued = open_stream(&s, &long_stream()).await;
    assert_eq!(queued.status(), 200);
    assert_eq!(metric(&s, "wick:num_requests_waiting").await, 1.0);
    drop(queued);
    settles_at(&s, "wick:num_requests_waiting", 0.0).await;
    let aborted = metric(&s, "wick:request_success_total{finished_reason=\"abort\"}").await;
    assert_eq!(aborted - aborted_before, 1.0);
    // The running one was untouched.
    assert!(running.next().await.unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn request_values_are_not_echoed_back_whole() {
    let s = Server::start(&[]);
    let huge = "m".repeat(1 << 20);
    let (st, b) = post(&s, "/v1/completions", json!({"model": huge, "prompt": "x"})).await;
    assert_error(st, &b, 404, Some("model"));
    assert!(b.to_string().len() < 2048, "{} bytes", b.to_string().len());
    let (st, b) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "x", "temperature": huge}),
    )
    .await;
    assert_error(st, &b, 400, Some("temperature"));
    assert!(b.to_string().len() < 2048, "{} bytes", b.to_string().len());
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_requests_are_refused_before_they_run() {
    let s = Server::start(&["--max-body-bytes", "20000000"]);
    // Far past the context: refused by its length, not tokenized.
    let (st, b) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "word ".repeat(3 << 20)}),
    )
    .await;
    assert_error(st, &b, 400, Some("prompt"));
    assert_eq!(b["error"]["code"], "context_length_exceeded");
    // More sequences than the server runs and queues at once.
    let prompts = vec!["a"; 700];
    let (st, b) = post(&s, "/v1/completions", json!({"prompt": prompts, "n": 2})).await;
    assert_error(st, &b, 400, Some("prompt"));
    let r = reqwest::Client::new()
        .post(s.url("/v1/completions"))
        .header("content-type", "text/plain")
        .body(r#"{"prompt": "x"}"#)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    assert_error(st, &r.json().await.unwrap(), 415, None);
    // A compressed body is refused, not parsed as text.
    let r = reqwest::Client::new()
        .post(s.url("/v1/completions"))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3])
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    let b: Value = r.json().await.unwrap();
    assert_error(st, &b, 415, None);
    assert!(
        b["error"]["message"].as_str().unwrap().contains("gzip"),
        "{b}"
    );
    assert_eq!(metric(&s, "wick:num_requests_waiting").await, 0.0);
}

/// The second turn of a chat finds the first turn in the prefix cache; the
/// usage says how much, streamed or not, and the counters add up.
#[tokio::test(flavor = "multi_thread")]
async fn later_turns_report_cached_prompt_tokens() {
    let s = Server::start(&[]);
    let system = "You are a patient tutor. Explain every idea with one short example, \
                  avoid jargon, and end each answer with a question that checks understanding."
        .repeat(2);
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "What is a verb?"}),
    ];
    let ask = |messages: &Vec<Value>| json!({"messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let (st, first) = post(&s, "/v1/chat/completions", ask(&messages)).await;
    assert_eq!(st, 200, "{first}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let p1 = first["usage"]["prompt_tokens"].as_u64().unwrap();

    let answer = first["choices"][0]["message"]["content"].clone();
    messages.push(json!({"role": "assistant", "content": answer}));
    messages.push(json!({"role": "user", "content": "And an adverb?"}));
    let mut streamed = ask(&messages);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let cs = chunks(&sse(&s, "/v1/chat/completions", streamed).await);
    let usage = &cs.last().unwrap()["usage"];
    let (p2, cached) = (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    );
    // The whole first prompt is a prefix of the second: at least its full
    // blocks come from the cache, and never the second's last token.
    assert!(
        cached >= p1 / 16 * 16 && cached < p2 && cached % 16 == 0,
        "{usage}"
    );

    // n > 1: the prompt is counted once, and nothing was cached before it.
    let (st, n3) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "Three facts about owls:", "n": 3, "max_tokens": 4, "seed": 3}),
    )
    .await;
    assert_eq!(st, 200, "{n3}");
    let p3 = n3["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(n3["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    assert_eq!(
        metric(&s, "wick:prefix_cache_hits_total").await,
        cached as f64
    );
    // Every sequence's prompt is looked up once: the n = 3 prompt thrice.
    assert_eq!(
        metric(&s, "wick:prefix_cache_queries_total").await,
        (p1 + p2 + 3 * p3) as f64
    );
}

/// vLLM's `cache_salt`: a prompt finds cached blocks only under the salt it
/// was cached with (none is a salt of its own), on both endpoints; an
/// empty salt is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_cache_salt_shares_the_prefix_cache_only_within_it() {
    let s = Server::start(&[]);
    let prompt = "A field guide to the birds of the northern coast, with notes on each \
                  species' calls, nests, winter range and the best season to watch it."
        .repeat(2);
    let cached = |salt: Option<&'static str>, path: &'static str| {
        let mut body = match path {
            "/v1/completions" => json!({"prompt": prompt}),
            _ => json!({"messages": [{"role": "user", "content": prompt}]}),
        };
        body["max_tokens"] = json!(2);
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        let s = &s;
        async move {
            let (st, v) = post(s, path, body).await;
            assert_eq!(st, 200, "{v}");
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        }
    };
    for path in ["/v1/completions", "/v1/chat/completions"] {
        assert_eq!(cached(Some("alice"), path).await, 0, "{path}");
        assert!(cached(Some("alice"), path).await > 0, "{path}");
        assert_eq!(cached(Some("bob"), path).await, 0, "{path}");
        assert_eq!(cached(None, path).await, 0, "{path}");
        assert!(cached(None, path).await > 0, "{path}");
    }
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 1, "cache_salt": ""}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "cache_salt");
}
