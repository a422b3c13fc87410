//! The API surface OpenAI and vLLM clients expect, over real HTTP on the
//! default model: agent-loop chat histories, `/v1/models/{id}`,
//! `/tokenizer_info`, served-name aliases, `--max-model-len`, chat's
//! default `max_tokens`, and fields wick refuses rather than ignores.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wick::text::chat_template::{ChatTemplate, Message};

use common::{assert_error, post, Server};

const LLAMA_31_TEMPLATE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/chat_templates/meta-llama-Llama-3.1-8B-Instruct.jinja"
);

async fn get(server: &Server, path: &str) -> (u16, Value) {
    let r = reqwest::get(server.url(path)).await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Tokens of `text` as the chat endpoint counts a rendered prompt.
async fn token_count(server: &Server, text: &str) -> u64 {
    let (st, t) = post(server, "/tokenize", json!({"prompt": text})).await;
    assert_eq!(st, 200, "{t}");
    t["count"].as_u64().unwrap()
}

/// `template`'s text for `messages`, as transformers renders what it is
/// handed (checked against Jinja2 in `tests/chat_templates.rs`).
fn render(template: &ChatTemplate, messages: Value) -> String {
    let messages: Vec<Message> = serde_json::from_value(messages).unwrap();
    template.render_with_tools(&messages, None, true).unwrap()
}

/// An agent loop's turn, sent as OpenAI's SDK sends it, reaches the
/// template as transformers would be handed it: the developer turn as
/// system, the call's arguments as an object (Llama 3.1's template writes
/// `arguments | tojson`), the tool result with its call id. The prompt the
/// server counted is that render's.
#[tokio::test(flavor = "multi_thread")]
async fn agent_history_renders_as_transformers_is_handed_it() {
    let s = Server::start(&["--chat-template", LLAMA_31_TEMPLATE]);
    let wire = json!([
        {"role": "developer", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "21 C, sunny"}
    ]);
    let handed = |arguments: Value| {
        json!([
            {"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "21 C, sunny"}
        ])
    };
    let source = std::fs::read_to_string(LLAMA_31_TEMPLATE).unwrap();
    // The default model's BOS and EOS, as the server gives the template.
    let template = ChatTemplate::new(source, "<|im_start|>".into(), "<|im_end|>".into()).unwrap();
    let expected = render(&template, handed(json!({"city": "Paris"})));
    assert!(
        expected.contains(r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#),
        "{expected}"
    );
    let unparsed = render(&template, handed(json!("{\"city\": \"Paris\"}")));

    let body = json!({"messages": wire, "max_tokens": 2, "temperature": 0});
    let (st, r) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{r}");
    let prompt_tokens = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(prompt_tokens, token_count(&s, &expected).await);
    assert_ne!(prompt_tokens, token_count(&s, &unparsed).await);
}

/// On the default template (SmolLM2's, which writes any role and no tool
/// calls) a developer turn is the system turn, and tool results are turns
/// of their own.
#[tokio::test(flavor = "multi_thread")]
async fn developer_is_system_and_tool_results_are_turns() {
    let s = Server::start(&[]);
    let prompt_tokens = |messages: Value| {
        let body = json!({"messages": messages, "max_tokens": 1});
        let url = s.url("/v1/chat/completions");
        async move {
            let (st, r) = common::post_url(url, body).await;
            assert_eq!(st, 200, "{r}");
            r["usage"]["prompt_tokens"].as_u64().unwrap()
        }
    };
    let with_role = |role: &str| json!([{"role": role, "content": "Be brief."}, {"role": "user", "content": "Hi"}]);
    assert_eq!(
        prompt_tokens(with_role("developer")).await,
        prompt_tokens(with_role("system")).await
    );
    let history = json!([
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "clock", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "09:07"}
    ]);
    let text = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
                <|im_start|>user\nTime?<|im_end|>\n<|im_start|>assistant\nChecking.<|im_end|>\n\
                <|im_start|>tool\n09:07<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(prompt_tokens(history).await, token_count(&s, text).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn aliases_are_listed_accepted_and_the_first_is_reported() {
    let s = Server::start_with(
        &["--served-model-name", "smol"],
        &[("RUST_LOG", "warn"), ("WICK_SERVED_MODEL_NAME", "ignored")],
        Stdio::inherit(),
    );
    // The command line beats the environment; the environment's list form
    // is checked below.
    let (_, m) = get(&s, "/v1/models").await;
    assert_eq!(m["data"].as_array().unwrap().len(), 1);
    assert_eq!(m["data"][0]["id"], "smol");
    drop(s);

    let s = Server::start_with(
        &[],
        &[
            ("RUST_LOG", "warn"),
            (
                "WICK_SERVED_MODEL_NAME",
                "smol,HuggingFaceTB/SmolLM2-135M-Instruct",
            ),
        ],
        Stdio::inherit(),
    );
    let (st, m) = get(&s, "/v1/models").await;
    assert_eq!(st, 200);
    let ids: Vec<&str> = m["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["smol", "HuggingFaceTB/SmolLM2-135M-Instruct"]);
    for id in ids {
        let (st, card) = get(&s, &format!("/v1/models/{id}")).await;
        assert_eq!(st, 200, "{card}");
        assert_eq!(
            (card["id"].as_str(), card["object"].as_str()),
            (Some(id), Some("model"))
        );
        assert_eq!(card["max_model_len"], 8192);
    }
    let (st, e) = get(&s, "/v1/models/gpt-4").await;
    assert_error(st, &e, 404, Some("model"));
    assert_eq!(e["error"]["code"], "model_not_found");

    let body = json!({"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "prompt": "Hi",
                      "max_tokens": 2, "ignore_eos": true});
    let (st, r) = post(&s, "/v1/completions", body).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["model"], "smol", "responses report the first name");
    let chat =
        json!({"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1});
    let (st, r) = post(&s, "/v1/chat/completions", chat).await;
    assert_eq!((st, r["model"].as_str()), (200, Some("smol")), "{r}");
    let (st, e) = post(
        &s,
        "/v1/completions",
        json!({"model": "gpt-4", "prompt": "Hi"}),
    )
    .await;
    assert_error(st, &e, 404, Some("model"));
    let (st, _) = post(&s, "/tokenize", json!({"model": "smol", "prompt": "Hi"})).await;
    assert_eq!(st, 200);
    let (st, e) = post(&s, "/tokenize", json!({"model": "gpt-4", "prompt": "Hi"})).await;
    assert_error(st, &e, 404, Some("model"));

    let metrics = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("wick:generation_tokens_total{model_name=\"smol\"} 3"),
        "{metrics}"
    );
}

/// lm-eval's remote tokenizer reads these from vLLM's endpoint.
#[tokio::test(flavor = "multi_thread")]
async fn tokenizer_info_answers_as_vllm_and_needs_the_key() {
    let s = Server::start(&["--api-key", "k"]);
    let client = reqwest::Client::new();
    let r = client.get(s.url("/tokenizer_info")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let info: Value = client
        .get(s.url("/tokenizer_info"))
        .bearer_auth("k")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // SmolLM2-135M-Instruct's tokenizer_config.json says the same.
    assert_eq!(info["tokenizer_class"], "PreTrainedTokenizerFast");
    assert_eq!(info["bos_token"], "<|im_start|>");
    assert_eq!(info["eos_token"], "<|im_end|>");
    assert_eq!(info["pad_token"], "<|im_end|>");
    assert_eq!(info["unk_token"], "<|endoftext|>");
    assert_eq!(info["add_bos_token"], false);
    assert_eq!(info["model_max_length"], 8192);
    assert_eq!(
        info["added_tokens_decoder"]["2"],
        json!({"content": "<|im_end|>", "lstrip": false, "normalized": false, "rstrip": false,
               "single_word": false, "special": true})
    );
    let template = info["chat_template"].as_str().unwrap();
    assert!(
        template.starts_with("{% for message in messages %}"),
        "{template}"
    );

    let r = client.get(s.url("/v1/models/nope")).send().await.unwrap();
    assert_eq!(r.status(), 401, "models/{{id}} is behind the key too");
}

/// The environment's form of `--max-model-len` caps every request, and
/// chat without max_tokens gets exactly the rest of it.
#[tokio::test(flavor = "multi_thread")]
async fn max_model_len_caps_the_context() {
    let s = Server::start_with(
        &[],
        &[("RUST_LOG", "warn"), ("WICK_MAX_MODEL_LEN", "96")],
        Stdio::inherit(),
    );
    let (_, m) = get(&s, "/v1/models").await;
    assert_eq!(m["data"][0]["max_model_len"], 96);
    let (_, t) = post(&s, "/tokenize", json!({"prompt": "Hi"})).await;
    assert_eq!(t["max_model_len"], 96);
    let (st, e) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 96}),
    )
    .await;
    assert_error(st, &e, 400, Some("prompt"));
    assert_eq!(e["error"]["code"], "context_length_exceeded");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("96 tokens"),
        "{e}"
    );
    let chat = json!({"messages": [{"role": "user", "content": "Count to a thousand."}],
                      "ignore_eos": true});
    let (st, r) = post(&s, "/v1/chat/completions", chat).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["usage"]["total_tokens"], 96);
    assert_eq!(r["choices"][0]["finish_reason"], "length");
}

#[test]
fn max_model_len_past_the_model_stops_the_start() {
    common::model_path();
    let mut child = Command::new(common::wick_bin())
        .args(["serve", "--port", "0", "--max-model-len", "100000"])
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "wick kept running");
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("--max-model-len 100000 is larger than the model's context of 8192 tokens"),
        "{stderr}"
    );
}

/// Chat without max_tokens takes what the KV pool can hold for one
/// sequence when that is less than the context, instead of being refused.
#[tokio::test(flavor = "multi_thread")]
async fn chat_without_max_tokens_fits_the_kv_pool() {
    let s = Server::start(&["--kv-cache-memory", "4"]);
    let chat = json!({"messages": [{"role": "user", "content": "Count to a thousand."}],
                      "ignore_eos": true});
    let (st, r) = post(&s, "/v1/chat/completions", chat).await;
    assert_eq!(st, 200, "{r}");
    let metrics = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let blocks: u64 = metrics
        .lines()
        .find(|l| l.starts_with("wick:kv_blocks_capacity"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap() as u64;
    assert!(blocks * 16 < 8192);
    assert_eq!(r["usage"]["total_tokens"], blocks * 16);
    // Completions keep OpenAI's default of 16.
    let (_, r) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "Hi", "ignore_eos": true}),
    )
    .await;
    assert_eq!(r["usage"]["completion_tokens"], 16);
}

/// Each field wick does not implement is a 400 naming it, never ignored;
/// metadata and nulls pass.
#[tokio::test(flavor = "multi_thread")]
async fn unsupported_fields_answer_400_naming_them() {
    let s = Server::start(&[]);
    let completion = |extra: Value| {
        let mut body = json!({"prompt": "Hi", "max_tokens": 1});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    for (extra, param) in [
        (json!({"suffix": "!"}), "suffix"),
        (json!({"best_of": 3}), "best_of"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"guided_json": {"type": "object"}}), "guided_json"),
        (json!({"prompt_logprobs": 1}), "prompt_logprobs"),
        (json!({"frobnicate": true}), "frobnicate"),
    ] {
        let (st, e) = post(&s, "/v1/completions", completion(extra)).await;
        assert_error(st, &e, 400, Some(param));
        let code = e["error"]["code"].as_str().unwrap();
        assert!(code.starts_with("unsupported_"), "{e}");
    }
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    for (extra, param) in [
        (json!({"echo": true}), "echo"),
        (
            json!({"audio": {"voice": "alloy", "format": "wav"}}),
            "audio",
        ),
        (json!({"modalities": ["text", "audio"]}), "modalities"),
        (
            json!({"prediction": {"type": "embedding", "content": "Hi"}}),
            "prediction.type",
        ),
        (json!({"guided_choice": ["a", "b"]}), "guided_choice"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "Hi", "reasoning_content": "hmm"}]}),
            "messages[0].reasoning_content",
        ),
    ] {
        let (st, e) = post(&s, "/v1/chat/completions", chat(extra)).await;
        assert_error(st, &e, 400, Some(param));
    }
    let (st, e) = post(
        &s,
        "/tokenize",
        json!({"prompt": "Hi", "return_token_strs": true}),
    )
    .await;
    assert_error(st, &e, 400, Some("return_token_strs"));

    let (st, r) = post(
        &s,
        "/v1/chat/completions",
        chat(
            json!({"user": "u1", "store": false, "metadata": {"run": "7"},
                    "service_tier": "auto", "modalities": ["text"], "suffix": null,
                    "tool_choice": "none", "response_format": {"type": "text"}}),
        ),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    let (st, r) = post(
        &s,
        "/v1/completions",
        completion(json!({"best_of": 1, "user": "u1"})),
    )
    .await;
    assert_eq!(st, 200, "{r}");
}
