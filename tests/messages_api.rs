//! `POST /v1/messages` (Anthropic's Messages API) over raw HTTP against a
//! started `wick serve` on the default model: a reply whole and streamed
//! (the stream's events in Anthropic's order, its text the whole reply's),
//! stop sequences, a forced tool call and the round trip back with its
//! result, thinking blocks on a template that thinks, count_tokens,
//! errors in Anthropic's shape naming their field, and `x-api-key`.

mod common;

use serde_json::{json, Value};

use common::Server;

const VERSION: &str = "2023-06-01";
const THINKING: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/openai_sdk/thinking.jinja"
);

/// Posts `body` as Anthropic's SDK does (`anthropic-version`, and
/// `x-api-key` when given).
async fn send(server: &Server, path: &str, body: &Value, key: Option<&str>) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(server.url(path))
        .header("anthropic-version", VERSION)
        .json(body);
    if let Some(key) = key {
        req = req.header("x-api-key", key);
    }
    req.send().await.unwrap()
}

async fn post(server: &Server, body: Value) -> (u16, Value) {
    let r = send(server, "/v1/messages", &body, None).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// The events of a stream: `(event:, data:)`, each data parsed.
async fn stream(server: &Server, mut body: Value) -> Vec<(String, Value)> {
    body["stream"] = json!(true);
    let r = send(server, "/v1/messages", &body, None).await;
    let text = common::event_stream_text(r).await;
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let (mut name, mut data) = (None, None);
        for line in block.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_string());
            } else if let Some(d) = line.strip_prefix("data: ") {
                data = Some(serde_json::from_str::<Value>(d).unwrap());
            }
        }
        if let (Some(name), Some(data)) = (name, data) {
            assert_eq!(data["type"], name.as_str(), "{block}");
            events.push((name, data));
        }
    }
    events
}

/// A whole reply's content rebuilt from stream events, as the SDK does.
fn rebuild(events: &[(String, Value)]) -> Vec<Value> {
    let mut content: Vec<Value> = Vec::new();
    let mut json_text: Vec<String> = Vec::new();
    for (name, data) in events {
        match name.as_str() {
            "content_block_start" => {
                assert_eq!(data["index"], content.len());
                content.push(data["content_block"].clone());
                json_text.push(String::new());
            }
            "content_block_delta" => {
                let i = data["index"].as_u64().unwrap() as usize;
                let d = &data["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => {
                        let t = content[i]["text"].as_str().unwrap().to_string();
                        content[i]["text"] = json!(t + d["text"].as_str().unwrap());
                    }
                    "thinking_delta" => {
                        let t = content[i]["thinking"].as_str().unwrap().to_string();
                        content[i]["thinking"] = json!(t + d["thinking"].as_str().unwrap());
                    }
                    "input_json_delta" => json_text[i] += d["partial_json"].as_str().unwrap(),
                    other => panic!("delta {other}"),
                }
            }
            "content_block_stop" => {
                let i = data["index"].as_u64().unwrap() as usize;
                if content[i]["type"] == "tool_use" && !json_text[i].is_empty() {
                    content[i]["input"] = serde_json::from_str(&json_text[i]).unwrap();
                }
            }
            _ => {}
        }
    }
    content
}

fn text_of(content: &[Value]) -> String {
    content
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap())
        .collect()
}

fn hello(max_tokens: u32) -> Value {
    json!({"max_tokens": max_tokens, "temperature": 0,
           "system": "You are a helpful assistant.",
           "messages": [{"role": "user", "content": "Write one sentence about the sea."}]})
}

#[track_caller]
fn assert_anthropic_error(status: u16, body: &Value, want: u16, kind: &str, mentions: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(mentions), "{message:?} lacks {mentions:?}");
}

/// A reply whole: Anthropic's message object; streamed: the events in
/// Anthropic's order, carrying the very same content, stop reason and
/// usage; `max_tokens` ends it as `max_tokens`.
#[tokio::test(flavor = "multi_thread")]
async fn a_reply_whole_and_streamed() {
    let s = Server::start(&[]);
    let (st, whole) = post(&s, hello(40)).await;
    assert_eq!(st, 200, "{whole}");
    assert_eq!(whole["type"], "message");
    assert_eq!(whole["role"], "assistant");
    assert!(whole["id"].as_str().unwrap().starts_with("msg_"), "{whole}");
    assert!(whole["model"].as_str().is_some_and(|m| !m.is_empty()));
    let content = whole["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{whole}");
    assert_eq!(content[0]["type"], "text");
    assert!(!text_of(content).is_empty());
    assert!(
        ["end_turn", "max_tokens"].contains(&whole["stop_reason"].as_str().unwrap()),
        "{whole}"
    );
    assert_eq!(whole["stop_sequence"], Value::Null);
    let usage = &whole["usage"];
    let input = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();
    assert!(input > 10, "{usage}");
    assert_eq!(usage["cache_creation_input_tokens"], 0);
    let output = usage["output_tokens"].as_u64().unwrap();
    assert!((1..=40).contains(&output), "{usage}");

    let events = stream(&s, hello(40)).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..3],
        ["message_start", "ping", "content_block_start"],
        "{names:?}"
    );
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"],
        "{names:?}"
    );
    assert!(names[3..names.len() - 3]
        .iter()
        .all(|n| *n == "content_block_delta"));
    let start = &events[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Value::Null);
    assert_eq!(start["role"], "assistant");
    assert!(start["id"].as_str().unwrap().starts_with("msg_"));
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], whole["stop_reason"]);
    assert_eq!(delta["usage"]["output_tokens"], output);
    assert_eq!(
        delta["usage"]["input_tokens"].as_u64().unwrap()
            + delta["usage"]["cache_read_input_tokens"].as_u64().unwrap(),
        input
    );
    assert_eq!(Value::Array(rebuild(&events)), whole["content"]);

    let (st, cut) = post(&s, hello(3)).await;
    assert_eq!(st, 200, "{cut}");
    assert_eq!(cut["stop_reason"], "max_tokens");
    assert_eq!(cut["usage"]["output_tokens"], 3);

    // count_tokens: the prompt the same request runs.
    let mut count = hello(1);
    count.as_object_mut().unwrap().remove("max_tokens");
    count.as_object_mut().unwrap().remove("temperature");
    let r = send(&s, "/v1/messages/count_tokens", &count, None).await;
    assert_eq!(r.status(), 200);
    let counted: Value = r.json().await.unwrap();
    assert_eq!(counted, json!({"input_tokens": input}));
}

/// A stop sequence ends the reply before it, as `stop_sequence`, naming
/// the one that matched, whole and streamed.
#[tokio::test(flavor = "multi_thread")]
async fn stop_sequences_name_the_match() {
    let s = Server::start(&[]);
    let (_, whole) = post(&s, hello(40)).await;
    let text = text_of(whole["content"].as_array().unwrap());
    // A piece of the reply that does not occur before its place.
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let (at, stop) = (chars.len() / 2..chars.len().saturating_sub(3))
        .map(|k| {
            let (from, _) = chars[k];
            let to = chars.get(k + 3).map_or(text.len(), |&(i, _)| i);
            (from, text[from..to].to_string())
        })
        .find(|(from, piece)| text.find(piece.as_str()) == Some(*from) && !piece.trim().is_empty())
        .expect("a piece of the reply to stop at");
    let mut body = hello(40);
    body["stop_sequences"] = json!(["qqqqzz", stop]);
    let (st, r) = post(&s, body.clone()).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["stop_reason"], "stop_sequence", "{r}");
    assert_eq!(r["stop_sequence"], stop.as_str(), "{r}");
    assert_eq!(text_of(r["content"].as_array().unwrap()), &text[..at]);
    let events = stream(&s, body).await;
    let delta = &events[events.len() - 2].1["delta"];
    assert_eq!(
        (
            delta["stop_reason"].as_str(),
            delta["stop_sequence"].as_str()
        ),
        (Some("stop_sequence"), Some(stop.as_str()))
    );
    assert_eq!(Value::Array(rebuild(&events)), r["content"]);
}

fn weather_tool() -> Value {
    json!([{"name": "get_weather", "description": "The current weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}])
}

/// A forced call comes back as a `tool_use` block (`stop_reason`
/// `tool_use`), streamed as `input_json_delta`s; sent back with its
/// `tool_result`, the model answers in text.
#[tokio::test(flavor = "multi_thread")]
async fn a_tool_round_trip() {
    let s = Server::start(&[]);
    let question = json!({"role": "user", "content": "What is the weather in Paris?"});
    for choice in [
        json!({"type": "tool", "name": "get_weather"}),
        json!({"type": "any", "disable_parallel_tool_use": true}),
    ] {
        let body = json!({"max_tokens": 60, "temperature": 0, "messages": [question],
                          "tools": weather_tool(), "tool_choice": choice});
        let (st, r) = post(&s, body.clone()).await;
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["stop_reason"], "tool_use", "{r}");
        let content = r["content"].as_array().unwrap();
        assert_eq!(content.len(), 1, "{r}");
        let call = &content[0];
        assert_eq!(call["type"], "tool_use");
        assert_eq!(call["name"], "get_weather");
        let id = call["id"].as_str().unwrap();
        assert!(id.starts_with("toolu_") && id.len() == 30, "{id}");
        assert!(call["input"]["city"].is_string(), "{r}");
        assert_eq!(call["input"].as_object().unwrap().len(), 1, "{r}");

        let events = stream(&s, body).await;
        let streamed = rebuild(&events);
        assert_eq!(streamed.len(), 1);
        assert_eq!(streamed[0]["input"], call["input"]);
        assert!(events
            .iter()
            .any(|(_, d)| d["delta"]["type"] == "input_json_delta"));
        assert_eq!(
            events[events.len() - 2].1["delta"]["stop_reason"],
            "tool_use"
        );

        // The round trip: the call and its result go back.
        let body = json!({"max_tokens": 30, "temperature": 0, "tools": weather_tool(),
                          "tool_choice": {"type": "none"},
                          "messages": [question,
                              {"role": "assistant", "content": content},
                              {"role": "user", "content": [
                                  {"type": "tool_result", "tool_use_id": id,
                                   "content": [{"type": "text", "text": "21 C and sunny"}]}]}]});
        let (st, answer) = post(&s, body).await;
        assert_eq!(st, 200, "{answer}");
        let content = answer["content"].as_array().unwrap();
        assert!(content.iter().all(|b| b["type"] == "text"), "{answer}");
        assert!(!text_of(content).is_empty(), "{answer}");
        assert_ne!(answer["stop_reason"], "tool_use");
    }
}

/// A forced call cut off by `max_tokens`: `stop_reason` says so and the
/// `tool_use` block's `input` is still an object, as Anthropic's type (and
/// the AI SDK) requires. A tool asking for eager
/// input streaming, as the AI SDK sends it, is served.
#[tokio::test(flavor = "multi_thread")]
async fn a_cut_off_call_still_has_an_object_input() {
    let s = Server::start(&[]);
    let mut tools = weather_tool();
    tools[0]["eager_input_streaming"] = json!(true);
    let body = json!({"max_tokens": 4, "temperature": 0, "tools": tools,
                      "tool_choice": {"type": "tool", "name": "get_weather"},
                      "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let (st, r) = post(&s, body.clone()).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["stop_reason"], "max_tokens", "{r}");
    assert_eq!(r["content"][0]["type"], "tool_use", "{r}");
    assert!(r["content"][0]["input"].is_object(), "{r}");
    // Streamed, the block opens with an object and the deltas stop where
    // the tokens did, as Anthropic's do.
    let events = stream(&s, body).await;
    let start = events
        .iter()
        .find(|(e, _)| e == "content_block_start")
        .unwrap();
    assert!(start.1["content_block"]["input"].is_object(), "{events:?}");
    assert_eq!(
        events[events.len() - 2].1["delta"]["stop_reason"],
        "max_tokens"
    );
}

/// A template that thinks: the thinking comes back as a `thinking` block
/// before the text, whole and streamed (`thinking_delta`s).
#[tokio::test(flavor = "multi_thread")]
async fn thinking_comes_back_as_a_thinking_block() {
    let s = Server::start(&["--chat-template", THINKING]);
    let mut messages = Vec::new();
    for (q, thought, answer) in [
        ("What is 2 + 2?", "Two plus two.", "4"),
        ("What is 3 + 3?", "Three plus three.", "6"),
        ("What is 1 + 1?", "One plus one.", "2"),
    ] {
        messages.push(json!({"role": "user", "content": q}));
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": thought, "signature": ""},
            {"type": "text", "text": answer}]}));
    }
    messages.push(json!({"role": "user", "content": "What is 4 + 4?"}));
    // Anthropic's smallest budget, below max_tokens; the reply ends well before.
    let body = json!({"max_tokens": 1100, "temperature": 0, "messages": messages,
                      "thinking": {"type": "enabled", "budget_tokens": 1024}});
    let (st, r) = post(&s, body.clone()).await;
    assert_eq!(st, 200, "{r}");
    let content = r["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{r}");
    assert_eq!(content[0]["type"], "thinking");
    assert_eq!(
        content[0]["thinking"].as_str().unwrap().trim(),
        "Four plus four."
    );
    assert_eq!(content[0]["signature"], "");
    assert_eq!(content[1], json!({"type": "text", "text": "8"}));
    assert_eq!(r["stop_reason"], "end_turn");
    let events = stream(&s, body).await;
    assert_eq!(Value::Array(rebuild(&events)), r["content"]);
    // This template cannot turn thinking off.
    let mut off = json!({"max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}],
                         "thinking": {"type": "disabled"}});
    let (st, e) = post(&s, off.clone()).await;
    assert_anthropic_error(st, &e, 400, "invalid_request_error", "thinking.type");
    off.as_object_mut().unwrap().remove("thinking");
    assert_eq!(post(&s, off).await.0, 200);
}

/// Errors in Anthropic's shape, naming the field at fault; what wick
/// cannot honour is refused, never ignored.
#[tokio::test(flavor = "multi_thread")]
async fn errors_name_their_field_in_anthropic_shape() {
    let s = Server::start(&[]);
    let user = json!([{"role": "user", "content": "Hi"}]);
    let cases = [
        (
            json!({"messages": user}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            json!({"max_tokens": 5, "messages": user, "temperature": 1.5}),
            400,
            "invalid_request_error",
            "temperature",
        ),
        (
            json!({"max_tokens": 5, "messages": user, "model": "not-a-served-model"}),
            404,
            "not_found_error",
            "not-a-served-model",
        ),
        (
            json!({"max_tokens": 5, "messages": user, "top_logprobs": 2}),
            400,
            "invalid_request_error",
            "top_logprobs",
        ),
        (
            json!({"max_tokens": 4096, "messages": user,
                   "thinking": {"type": "enabled", "budget_tokens": 2048}}),
            400,
            "invalid_request_error",
            "thinking.type",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}),
            400,
            "invalid_request_error",
            "messages[0].content[0].type",
        ),
        (
            json!({"max_tokens": 5, "messages": user, "tools": weather_tool(),
                   "tool_choice": {"type": "tool", "name": "nope"}}),
            400,
            "invalid_request_error",
            "tool_choice.name",
        ),
        (
            json!({"max_tokens": 5, "messages": user, "stop_sequences": [""]}),
            400,
            "invalid_request_error",
            "stop_sequences",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"},
                                                  {"role": "assistant", "content": "Hello, I"}]}),
            400,
            "invalid_request_error",
            "messages[1].role",
        ),
        (
            json!({"max_tokens": 0, "messages": user}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
    ];
    for (body, status, kind, mentions) in cases {
        let (st, e) = post(&s, body.clone()).await;
        assert_anthropic_error(st, &e, status, kind, mentions);
    }
    // A context too small for max_tokens.
    let (st, e) = post(&s, json!({"max_tokens": 100000000, "messages": user})).await;
    assert_anthropic_error(
        st,
        &e,
        400,
        "invalid_request_error",
        "maximum context length",
    );
    // The body itself: not JSON, or not declared as JSON.
    let r = reqwest::Client::new()
        .post(s.url("/v1/messages"))
        .header("content-type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    assert_anthropic_error(
        st,
        &r.json().await.unwrap(),
        400,
        "invalid_request_error",
        "JSON",
    );
    let r = reqwest::Client::new()
        .post(s.url("/v1/messages/count_tokens"))
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    assert_anthropic_error(
        st,
        &r.json().await.unwrap(),
        415,
        "invalid_request_error",
        "application/json",
    );
    // A wrong method, in the same shape.
    let r = reqwest::get(s.url("/v1/messages")).await.unwrap();
    let st = r.status().as_u16();
    assert_anthropic_error(
        st,
        &r.json().await.unwrap(),
        405,
        "invalid_request_error",
        "Method not allowed",
    );
    // count_tokens takes no sampling fields.
    let r = send(
        &s,
        "/v1/messages/count_tokens",
        &json!({"messages": user, "max_tokens": 5}),
        None,
    )
    .await;
    let st = r.status().as_u16();
    assert_anthropic_error(
        st,
        &r.json().await.unwrap(),
        400,
        "invalid_request_error",
        "max_tokens",
    );
}

/// With `--api-key`, the key is taken as `x-api-key` (Anthropic's header)
/// or as a bearer token, on every endpoint; a request without a valid one
/// to /v1/messages gets Anthropic's 401.
#[tokio::test(flavor = "multi_thread")]
async fn x_api_key_is_accepted() {
    let s = Server::start(&["--api-key", "sk-ant-test"]);
    let body = json!({"max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]});
    let r = send(&s, "/v1/messages", &body, Some("sk-ant-test")).await;
    assert_eq!(r.status(), 200);
    for key in [Some("sk-wrong"), None] {
        let r = send(&s, "/v1/messages", &body, key).await;
        let st = r.status().as_u16();
        let e: Value = r.json().await.unwrap();
        assert_anthropic_error(st, &e, 401, "authentication_error", "key");
    }
    let r = reqwest::Client::new()
        .post(s.url("/v1/messages"))
        .bearer_auth("sk-ant-test")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The other endpoints take x-api-key too, and keep OpenAI's 401.
    let chat = json!({"max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]});
    let r = send(&s, "/v1/chat/completions", &chat, Some("sk-ant-test")).await;
    assert_eq!(r.status(), 200);
    let r = send(&s, "/v1/chat/completions", &chat, Some("sk-wrong")).await;
    assert_eq!(r.status(), 401);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "invalid_api_key", "{e}");
}
