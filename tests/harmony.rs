//! gpt-oss's chat template served: what wick does because the template
//! speaks OpenAI's harmony format. The default model does not speak it, so
//! its replies carry no headers and read as plain content; how harmony
//! replies map onto reasoning, content and calls is tested where they are
//! read (`text::harmony`, and every API's renderer in `render_parity`).

mod common;

use serde_json::{json, Value};

use common::{chat, chunks, post, sse, Server};

const TEMPLATE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/chat_templates/openai-gpt-oss-120b.jinja"
);

/// `body` posted to chat whole and streamed: the reply, and its stream's
/// deltas.
async fn whole_and_streamed(s: &Server, body: Value) -> (Value, Vec<Value>) {
    let (st, whole) = post(s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 200, "{whole}");
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let events = sse(s, "/v1/chat/completions", streamed).await;
    let deltas = chunks(&events)
        .iter()
        .map(|c| c["choices"][0]["delta"].clone())
        .collect();
    (whole, deltas)
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// The deltas' `field` text, joined.
fn joined(deltas: &[Value], field: &str) -> String {
    deltas.iter().map(|d| text(&d[field])).collect()
}

fn weather() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_harmony_template_as_served() {
    let s = Server::start(&["--chat-template", TEMPLATE]);

    // A reply without harmony's headers is content, whole and streamed.
    let (st, whole) = post(&s, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(st, 200, "{whole}");
    let message = &whole["choices"][0]["message"];
    let content = message["content"].as_str().unwrap();
    assert!(!content.is_empty(), "{whole}");
    assert!(message.get("reasoning_content").is_none(), "{whole}");
    let events = sse(&s, "/v1/chat/completions", chat(json!({"stream": true}))).await;
    let streamed: String = chunks(&events)
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content);

    // gpt-oss's efforts reach the template; others are refused, naming
    // the field each API calls it.
    for effort in ["low", "medium", "high"] {
        let (st, body) = post(
            &s,
            "/v1/chat/completions",
            chat(json!({"reasoning_effort": effort})),
        )
        .await;
        assert_eq!(st, 200, "{effort}: {body}");
    }
    let (st, body) = post(
        &s,
        "/v1/chat/completions",
        chat(json!({"reasoning_effort": "none"})),
    )
    .await;
    common::assert_error(st, &body, 400, Some("reasoning_effort"));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("low, medium, high"),
        "{body}"
    );
    let responses = json!({"input": "What is 2 + 2?", "max_output_tokens": 8,
                           "reasoning": {"effort": "minimal"}});
    let (st, body) = post(&s, "/v1/responses", responses).await;
    common::assert_error(st, &body, 400, Some("reasoning.effort"));

    // An earlier turn that thought, said something and called a tool: the
    // template would refuse thinking beside content, so the thinking goes
    // in alone, as llama.cpp sends it.
    let history = json!({"tools": weather(), "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Look it up.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]});
    let (st, body) = post(&s, "/v1/chat/completions", chat(history)).await;
    assert_eq!(st, 200, "{body}");

    // Output constrained to JSON is a harmony message, its markers written
    // as text by a model without them, and read as that JSON: the final
    // message's as content, a forced call's as the call, whole and
    // streamed.
    let json_reply = chat(json!({"response_format": {"type": "json_object"}, "max_tokens": 64}));
    let (st, body) = post(&s, "/v1/chat/completions", json_reply).await;
    assert_eq!(st, 200, "{body}");
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    if body["choices"][0]["finish_reason"] == "stop" {
        let value: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert!(value.is_object(), "{body}");
    }
    // Offered tools with a format: the call or the answer.
    let either = chat(json!({"tools": weather(), "max_tokens": 64,
                             "response_format": {"type": "json_object"}}));
    let (st, body) = post(&s, "/v1/chat/completions", either).await;
    assert_eq!(st, 200, "{body}");
    let c = &body["choices"][0];
    if c["finish_reason"] == "stop" {
        let content = c["message"]["content"].as_str().unwrap();
        let value: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert!(value.is_object(), "{body}");
    } else if c["finish_reason"] == "tool_calls" {
        assert_eq!(
            c["message"]["tool_calls"][0]["function"]["name"],
            "get_weather"
        );
    }
    let city = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Paris"]}},
                       "required": ["city"]}}}]);
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let forced = chat(json!({"tools": city, "tool_choice": choice, "max_tokens": 64}));
        let (st, whole) = post(&s, "/v1/chat/completions", forced.clone()).await;
        assert_eq!(st, 200, "{whole}");
        let c = &whole["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{choice}: {whole}");
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{whole}");
        assert_eq!(calls[0]["function"]["name"], "get_weather", "{whole}");
        let args = calls[0]["function"]["arguments"].as_str().unwrap();
        let parsed: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{e}: {whole}"));
        assert!(
            ["Oslo", "Paris"].contains(&parsed["city"].as_str().unwrap()),
            "{whole}"
        );
        assert!(!whole.to_string().contains("<|"), "{whole}");
        let mut streamed = forced;
        streamed["stream"] = json!(true);
        let events = chunks(&sse(&s, "/v1/chat/completions", streamed).await);
        let streamed_args: String = events
            .iter()
            .filter_map(|c| {
                c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
            })
            .collect();
        assert_eq!(streamed_args, args, "{choice}");
        let finish = events
            .iter()
            .find_map(|c| c["choices"][0]["finish_reason"].as_str());
        assert_eq!(finish, Some("tool_calls"), "{choice}");
    }

    // Anthropic's thinking: gpt-oss always thinks, so it can be enabled
    // but not disabled.
    let messages = |thinking: Value| {
        json!({"max_tokens": 1025, "stop_sequences": [" "], "thinking": thinking,
               "messages": [{"role": "user", "content": "Hi"}]})
    };
    let enabled = messages(json!({"type": "enabled", "budget_tokens": 1024}));
    let (st, body) = post(&s, "/v1/messages", enabled).await;
    assert_eq!(st, 200, "{body}");
    let (st, body) = post(&s, "/v1/messages", messages(json!({"type": "disabled"}))).await;
    assert_eq!(st, 400, "{body}");
    assert!(body.to_string().contains("always thinks"), "{body}");
}

/// The tiny gpt-oss, as llama.cpp's converter wrote it and as its
/// checkpoint is: harmony's markers are single tokens that decode to
/// their text (the parser reads them there), generation ends at
/// `<|return|>` and `<|call|>` but not at `<|end|>`, and served, its chat
/// replies (random weights: whatever it says) come back the same whole and
/// streamed, with no marker in their text.
#[tokio::test(flavor = "multi_thread")]
async fn a_tiny_gpt_oss_speaks_through_its_markers() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let gguf = fixtures.join("gguf-tiny/gpt-oss-q8_0.gguf");
    for path in [gguf.clone(), fixtures.join("gpt-oss-tiny")] {
        let tok = wick::load::loader::load_tokenizer(&path).unwrap();
        let id = |t: &str| tok.token_to_id(t).unwrap_or_else(|| panic!("no {t}"));
        for marker in [
            "<|start|>",
            "<|channel|>",
            "<|message|>",
            "<|end|>",
            "<|constrain|>",
        ] {
            assert_eq!(tok.encode(marker).unwrap(), [id(marker)], "{marker}");
            assert_eq!(tok.decode(&[id(marker)]).unwrap(), marker);
        }
        let eos = tok.eos_ids();
        assert!(
            eos.contains(&id("<|return|>")) && eos.contains(&id("<|call|>")),
            "{eos:?}"
        );
        assert!(
            !eos.contains(&id("<|end|>")),
            "{}: stops at <|end|>",
            path.display()
        );
    }

    let s = Server::start(&["--model", gguf.to_str().unwrap()]);
    let body = json!({"messages": [{"role": "user", "content": "What is 2 + 2?"}],
                      "max_tokens": 24, "temperature": 0});
    let (whole, deltas) = whole_and_streamed(&s, body).await;
    let message = &whole["choices"][0]["message"];
    assert_eq!(
        joined(&deltas, "content"),
        text(&message["content"]),
        "{whole}"
    );
    assert_eq!(
        joined(&deltas, "reasoning_content"),
        text(&message["reasoning_content"]),
        "{whole}"
    );
    for t in [
        text(&message["content"]),
        text(&message["reasoning_content"]),
    ] {
        assert!(!t.contains("<|"), "a marker in the reply's text: {whole}");
    }
}

/// gpt-oss with `response_format`: the reply keeps harmony's messages (an
/// analysis first if the model wants one, then the final message), so the
/// JSON arrives as content and any analysis as reasoning, whole and
/// streamed alike. `<|end|>` is favoured so that an analysis ends at once
/// (the tiny model's text is random). Forced calls are served in
/// `a_harmony_template_as_served`: with tools, the tiny model's prompt
/// outgrows its 256 positions.
#[tokio::test(flavor = "multi_thread")]
async fn a_tiny_gpt_oss_answers_in_json_when_told() {
    let gguf = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gguf-tiny/gpt-oss-q8_0.gguf"
    );
    let tok = wick::load::loader::load_tokenizer(std::path::Path::new(gguf)).unwrap();
    let end = tok.token_to_id("<|end|>").unwrap();
    let s = Server::start(&["--model", gguf]);
    let answer = json!({"type": "object", "properties": {"answer": {"enum": [3, 4, 5]}},
                        "required": ["answer"]});
    let body = json!({"messages": [{"role": "user", "content": "What is 2 + 2?"}],
                      "max_tokens": 40, "temperature": 0,
                      "logit_bias": {end.to_string(): 100},
                      "response_format": {"type": "json_schema",
                                          "json_schema": {"name": "sum", "schema": answer}}});
    let (whole, deltas) = whole_and_streamed(&s, body).await;
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{whole}");
    let content = text(&choice["message"]["content"]);
    let value: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("{e}: {whole}"));
    assert!(
        [3, 4, 5].contains(&value["answer"].as_i64().unwrap()),
        "{whole}"
    );
    assert!(!whole.to_string().contains("<|"), "{whole}");
    assert_eq!(joined(&deltas, "content"), content);
    assert_eq!(
        joined(&deltas, "reasoning_content"),
        text(&choice["message"]["reasoning_content"])
    );
}
