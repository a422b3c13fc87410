//! `POST /v1/responses` over HTTP on the default model: a Response object
//! whole and streamed (typed events, each with its `sequence_number`, the
//! same text either way), function calls forced by `tool_choice` and
//! continued by `previous_response_id` exactly as a client replaying the
//! items would, `GET` and `DELETE /v1/responses/{id}`, `text.format`
//! json_schema, reasoning items under a template that thinks, and every
//! field wick cannot honour refused in OpenAI's error shape, naming it.

mod common;

use serde_json::{json, Value};

use common::{assert_error, post, Server};

const WEATHER: &str = r#"{"type": "function", "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}"#;

fn weather() -> Value {
    serde_json::from_str(WEATHER).unwrap()
}

/// A stream's events as `(event name, data)`, each name checked against
/// the data's `type`.
async fn events(server: &Server, body: Value) -> Vec<Value> {
    let r = reqwest::Client::new()
        .post(server.url("/v1/responses"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let text = common::event_stream_text(r).await;
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty() && !e.starts_with(':'))
        .map(|e| {
            let (name, data) = e.split_once('\n').expect("an event line and a data line");
            let name = name.strip_prefix("event: ").expect("event: line");
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], name, "{data}");
            data
        })
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

async fn get(server: &Server, path: &str) -> (u16, Value) {
    let r = reqwest::get(server.url(path)).await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn delete(server: &Server, path: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .delete(server.url(path))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// The text of a response's message items.
fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap())
        .map(|c| c["text"].as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn whole_and_streamed_responses() {
    let server = Server::start(&[]);
    let body = json!({
        "input": "What is the capital of France?", "instructions": "Answer briefly.",
        "max_output_tokens": 24, "temperature": 0, "metadata": {"k": "v"}, "user": "u1",
    });
    let (status, whole) = post(&server, "/v1/responses", body.clone()).await;
    assert_eq!(status, 200, "{whole}");
    assert!(whole["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(whole["object"], "response");
    assert!(["completed", "incomplete"].contains(&whole["status"].as_str().unwrap()));
    assert_eq!(whole["instructions"], "Answer briefly.");
    assert_eq!(
        (&whole["metadata"], &whole["user"]),
        (&json!({"k": "v"}), &json!("u1"))
    );
    assert_eq!(whole["max_output_tokens"], 24);
    assert_eq!(whole["temperature"], 0.0);
    assert_eq!(whole["text"], json!({"format": {"type": "text"}}));
    let item = &whole["output"][0];
    assert_eq!(
        (&item["type"], &item["role"]),
        (&json!("message"), &json!("assistant"))
    );
    assert_eq!(item["content"][0]["type"], "output_text");
    let text = output_text(&whole);
    assert!(!text.is_empty());
    let u = &whole["usage"];
    let (input, output) = (
        u["input_tokens"].as_u64().unwrap(),
        u["output_tokens"].as_u64().unwrap(),
    );
    assert!(input > 5 && output > 0 && output <= 24, "{u}");
    assert_eq!(u["total_tokens"], input + output);
    assert!(u["input_tokens_details"]["cached_tokens"].is_u64());
    assert_eq!(u["output_tokens_details"]["reasoning_tokens"], 0);

    // Kept by default: GET answers the very object.
    let id = whole["id"].as_str().unwrap();
    let (status, got) = get(&server, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got, whole);

    // Streamed: the same text, in typed events numbered from 0.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let ev = events(&server, streamed).await;
    let seq: Vec<u64> = ev
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seq, (0..ev.len() as u64).collect::<Vec<_>>());
    let t = types(&ev);
    assert_eq!(
        t[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    let last = ev.last().unwrap();
    let kind = format!("response.{}", whole["status"].as_str().unwrap());
    assert_eq!(
        t[t.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            kind.as_str(),
        ]
    );
    assert_eq!(ev[0]["response"]["status"], "in_progress");
    assert_eq!(ev[0]["response"]["output"], json!([]));
    let deltas: String = ev
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text);
    let done = &ev[ev.len() - 4];
    assert_eq!(done["text"], text.as_str());
    let final_response = &last["response"];
    assert_eq!(output_text(final_response), text);
    assert_eq!(
        final_response["usage"]["output_tokens"],
        whole["usage"]["output_tokens"]
    );
    let item_id = &ev[2]["item"]["id"];
    assert!(ev[3..ev.len() - 1]
        .iter()
        .all(|e| &e["item_id"] == item_id || &e["item"]["id"] == item_id));
    // The streamed response is kept too, as its last event showed it.
    let (_, got) = get(
        &server,
        &format!("/v1/responses/{}", final_response["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(&got, final_response);

    // store: false keeps nothing.
    let mut unkept = body.clone();
    unkept["store"] = json!(false);
    let (_, r) = post(&server, "/v1/responses", unkept).await;
    assert_eq!(r["store"], false);
    let (status, e) = get(
        &server,
        &format!("/v1/responses/{}", r["id"].as_str().unwrap()),
    )
    .await;
    assert_error(status, &e, 404, None);

    // Cut off at max_output_tokens: incomplete, and said why.
    let cut = json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "Count to a hundred."}]}],
                     "max_output_tokens": 3, "temperature": 0});
    let (_, r) = post(&server, "/v1/responses", cut).await;
    assert_eq!(r["status"], "incomplete", "{r}");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(r["usage"]["output_tokens"], 3);

    // text.format json_schema: the reply is the schema's object.
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"},
                        "country": {"type": "string"}}, "required": ["name", "country"]});
    let format = json!({"type": "json_schema", "name": "city", "schema": schema, "strict": true});
    let body = json!({"input": "Name a city in Norway.", "text": {"format": format},
                      "max_output_tokens": 60, "temperature": 0});
    let (status, r) = post(&server, "/v1/responses", body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["text"]["format"]["name"], "city");
    let city: Value = serde_json::from_str(&output_text(&r)).unwrap();
    let keys: Vec<&String> = city.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["name", "country"], "{city}");
}

#[tokio::test(flavor = "multi_thread")]
async fn function_calls_and_the_kept_conversation() {
    let server = Server::start(&[]);
    let first = json!({
        "input": "What is the weather in Paris?", "tools": [weather()],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 40, "temperature": 0,
    });
    let (status, r1) = post(&server, "/v1/responses", first).await;
    assert_eq!(status, 200, "{r1}");
    assert_eq!(r1["status"], "completed", "{r1}");
    let call = &r1["output"][0];
    assert_eq!(r1["output"].as_array().unwrap().len(), 1, "{r1}");
    assert_eq!(
        (&call["type"], &call["name"]),
        (&json!("function_call"), &json!("get_weather"))
    );
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{args}");
    assert_eq!(r1["tools"][0]["name"], "get_weather");
    assert_eq!(
        r1["tool_choice"],
        json!({"type": "function", "name": "get_weather"})
    );

    // The result goes back by previous_response_id.
    let result = json!({"type": "function_call_output", "call_id": call["call_id"],
                        "output": "22 C and sunny"});
    let follow = json!({
        "previous_response_id": r1["id"], "input": [result], "tools": [weather()],
        "tool_choice": "none", "max_output_tokens": 20, "temperature": 0,
    });
    let (status, r2) = post(&server, "/v1/responses", follow).await;
    assert_eq!(status, 200, "{r2}");
    assert_eq!(r2["previous_response_id"], r1["id"]);
    assert_eq!(r2["output"][0]["type"], "message", "{r2}");
    // The same conversation sent whole, as a client replays the items,
    // is the very same prompt and reply.
    let replay = json!({
        "input": [{"role": "user", "content": "What is the weather in Paris?"}, call, result],
        "tools": [weather()], "tool_choice": "none", "max_output_tokens": 20, "temperature": 0,
    });
    let (status, r3) = post(&server, "/v1/responses", replay).await;
    assert_eq!(status, 200, "{r3}");
    assert_eq!(r3["usage"]["input_tokens"], r2["usage"]["input_tokens"]);
    assert_eq!(output_text(&r3), output_text(&r2));
    assert!(r2["usage"]["input_tokens"].as_u64() > r1["usage"]["input_tokens"].as_u64());

    // A chain: the follow-up continues the first turn's conversation too.
    let third = json!({"previous_response_id": r2["id"], "input": "Thanks!",
                       "max_output_tokens": 5, "temperature": 0});
    let (status, r4) = post(&server, "/v1/responses", third).await;
    assert_eq!(status, 200, "{r4}");
    assert!(r4["usage"]["input_tokens"].as_u64() > r2["usage"]["input_tokens"].as_u64());

    // DELETE forgets it; then GET, DELETE and previous_response_id are 404.
    let path = format!("/v1/responses/{}", r1["id"].as_str().unwrap());
    let (status, d) = delete(&server, &path).await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(
        d,
        json!({"id": r1["id"], "object": "response.deleted", "deleted": true})
    );
    let (status, e) = get(&server, &path).await;
    assert_error(status, &e, 404, None);
    let (status, e) = delete(&server, &path).await;
    assert_error(status, &e, 404, None);
    let again = json!({"previous_response_id": r1["id"], "input": "And tomorrow?"});
    let (status, e) = post(&server, "/v1/responses", again).await;
    assert_error(status, &e, 404, Some("previous_response_id"));
    // What was built on it stays.
    let (status, _) = get(
        &server,
        &format!("/v1/responses/{}", r2["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(status, 200);

    // A forced call streamed: its arguments in deltas, then whole.
    let body = json!({"input": "Weather in Rome?", "tools": [weather()], "tool_choice": "required",
                      "max_output_tokens": 60, "temperature": 0, "stream": true});
    let ev = events(&server, body).await;
    let t = types(&ev);
    assert_eq!(t[2], "response.output_item.added");
    assert_eq!(ev[2]["item"]["type"], "function_call");
    assert_eq!(ev[2]["item"]["arguments"], "");
    let deltas: String = ev
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    let done = ev
        .iter()
        .find(|e| e["type"] == "response.function_call_arguments.done")
        .unwrap();
    assert_eq!(done["arguments"], deltas.as_str());
    assert_eq!(done["name"], "get_weather");
    let last = ev.last().unwrap();
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["output"][0]["arguments"], deltas.as_str());
    serde_json::from_str::<Value>(&deltas).unwrap();
}

/// Reasoning items both ways, under a template that opens a `<think>`
/// block (tests/openai_sdk/thinking.jinja): earlier turns' reasoning items
/// reach the template as those turns' thinking, and the reply's thinking
/// comes back as a `reasoning` item before its message, as chat
/// completions splits the same reply.
#[tokio::test(flavor = "multi_thread")]
async fn reasoning_items() {
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/openai_sdk/thinking.jinja"
    );
    let server = Server::start(&["--chat-template", template]);
    let shots = [
        ("What is 2 + 2?", "Two plus two.", "4"),
        ("What is 3 + 3?", "Three plus three.", "6"),
        ("What is 1 + 1?", "One plus one.", "2"),
    ];
    let mut items = Vec::new();
    let mut messages = Vec::new();
    for (q, thought, answer) in shots {
        items.push(json!({"role": "user", "content": q}));
        items.push(json!({"type": "reasoning", "id": "rs_1", "summary": [],
                          "content": [{"type": "reasoning_text", "text": thought}]}));
        items.push(
            json!({"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                          "content": [{"type": "output_text", "text": answer, "annotations": []}]}),
        );
        messages.push(json!({"role": "user", "content": q}));
        messages
            .push(json!({"role": "assistant", "reasoning_content": thought, "content": answer}));
    }
    items.push(json!({"role": "user", "content": "What is 4 + 4?"}));
    messages.push(json!({"role": "user", "content": "What is 4 + 4?"}));
    let chat = json!({"messages": messages, "max_tokens": 40, "temperature": 0});
    let (status, c) = post(&server, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{c}");
    let m = &c["choices"][0]["message"];
    let body = json!({"input": items, "max_output_tokens": 40, "temperature": 0});
    let (status, r) = post(&server, "/v1/responses", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    let out = r["output"].as_array().unwrap();
    assert_eq!(out.len(), 2, "{r}");
    assert_eq!(out[0]["type"], "reasoning");
    assert!(out[0]["id"].as_str().unwrap().starts_with("rs_"));
    assert_eq!(out[0]["content"][0]["type"], "reasoning_text");
    assert_eq!(
        out[0]["content"][0]["text"], m["reasoning_content"],
        "{r}\n{c}"
    );
    assert!(!m["reasoning_content"].as_str().unwrap().trim().is_empty());
    assert_eq!(out[1]["type"], "message");
    assert_eq!(output_text(&r), m["content"].as_str().unwrap());
    assert_eq!(r["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
    let reasoning = r["usage"]["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        reasoning > 0 && reasoning < r["usage"]["output_tokens"].as_u64().unwrap(),
        "{r}"
    );

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let ev = events(&server, streamed).await;
    let thought: String = ev
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(thought, m["reasoning_content"].as_str().unwrap());
    assert_eq!(ev[3]["part"]["type"], "reasoning_text");
    let last = &ev.last().unwrap()["response"];
    assert_eq!(without_ids(&last["output"]), without_ids(&r["output"]));
}

/// Output items without their ids, fresh on every response.
fn without_ids(items: &Value) -> Value {
    let mut items = items.clone();
    for item in items.as_array_mut().unwrap() {
        item.as_object_mut().unwrap().remove("id");
    }
    items
}

/// What wick cannot honour is a 400 naming the field; what changes no
/// output is accepted.
#[tokio::test(flavor = "multi_thread")]
async fn refused_and_accepted_fields() {
    let server = Server::start(&[]);
    let image = json!([{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]);
    let cases = [
        (
            json!({"tools": [{"type": "web_search"}]}),
            400,
            "tools[0].type",
        ),
        (
            json!({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}),
            400,
            "tools[0].type",
        ),
        (
            json!({"tools": [{"type": "function", "name": "a b"}]}),
            400,
            "tools[0].name",
        ),
        (
            json!({"tools": [{"type": "function"}]}),
            400,
            "tools[0].name",
        ),
        (
            json!({"tools": [{"type": "function", "name": "f", "defer_loading": true}]}),
            400,
            "tools[0].defer_loading",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "web_search_preview"}}),
            400,
            "tool_choice.type",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}),
            400,
            "tool_choice.type",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "function", "name": "nope"}}),
            400,
            "tool_choice.name",
        ),
        (json!({"tool_choice": "required"}), 400, "tool_choice"),
        (json!({"background": true}), 400, "background"),
        (json!({"truncation": "auto"}), 400, "truncation"),
        (
            json!({"include": ["message.output_text.logprobs"]}),
            400,
            "include",
        ),
        (json!({"top_logprobs": 3}), 400, "top_logprobs"),
        (
            json!({"reasoning": {"summary": "auto"}}),
            400,
            "reasoning.summary",
        ),
        (
            json!({"reasoning": {"effort": "high"}}),
            400,
            "reasoning.effort",
        ),
        (json!({"text": {"verbosity": "low"}}), 400, "text.verbosity"),
        (
            json!({"text": {"format": {"type": "json_schema", "name": "x", "schema": 3}}}),
            400,
            "text.format.schema",
        ),
        (
            json!({"text": {"format": {"type": "grammar"}}}),
            400,
            "text.format.type",
        ),
        (
            json!({"stream_options": {"include_obfuscation": false}}),
            400,
            "stream_options",
        ),
        (
            json!({"stream": true, "stream_options": {"include_obfuscation": true}}),
            400,
            "stream_options.include_obfuscation",
        ),
        (json!({"conversation": "conv_1"}), 400, "conversation"),
        (json!({"prompt": {"id": "pmpt_1"}}), 400, "prompt"),
        (json!({"input": image}), 400, "input[0].content[1].type"),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            400,
            "input[0].type",
        ),
        (
            json!({"input": [{"type": "web_search_call", "id": "ws_1"}]}),
            400,
            "input[0].type",
        ),
        (
            json!({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "xyz"}]}),
            400,
            "input[0].encrypted_content",
        ),
        (
            json!({"input": [{"role": "tool", "content": "x"}]}),
            400,
            "input[0].role",
        ),
        (
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            400,
            "input[0].call_id",
        ),
        (
            json!({"input": [{"role": "user", "content": "hi", "extra": 1}]}),
            400,
            "input[0].extra",
        ),
        (json!({"input": 3}), 400, "input"),
        (json!({"input": null}), 400, "input"),
        (json!({"max_output_tokens": 0}), 400, "max_output_tokens"),
        (json!({"temperature": 9}), 400, "temperature"),
        (json!({"model": "gpt-4o"}), 404, "model"),
    ];
    for (extra, want, param) in cases {
        let mut body = json!({"input": "hi", "max_output_tokens": 4});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, e) = post(&server, "/v1/responses", body.clone()).await;
        assert_error(status, &e, want, Some(param));
        assert!(
            e["error"]["message"].as_str().unwrap().len() > 10,
            "{body}: {e}"
        );
    }
    // Fields with no effect on the output are accepted (and echoed).
    let body = json!({
        "input": "hi", "max_output_tokens": 4, "metadata": {"a": "b"}, "user": "u",
        "safety_identifier": "s", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
        "store": false, "service_tier": "auto", "max_tool_calls": 2, "truncation": "disabled",
        "include": [], "tools": [], "background": false, "parallel_tool_calls": false,
        "reasoning": {"effort": null}, "top_logprobs": 0, "text": {"format": {"type": "text"}},
        "tool_choice": "auto", "seed": 3, "top_k": 5, "stop": ["\n\n"],
    });
    let (status, r) = post(&server, "/v1/responses", body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["safety_identifier"], "s");
    assert_eq!(r["prompt_cache_key"], "k");
    assert_eq!(r["parallel_tool_calls"], false);

    // GET takes no options; an unknown id is a 404.
    let (status, e) = get(&server, "/v1/responses/resp_nope?include=x").await;
    assert_error(status, &e, 400, Some("include"));
    let (status, e) = get(&server, "/v1/responses/resp_nope").await;
    assert_error(status, &e, 404, None);
}
