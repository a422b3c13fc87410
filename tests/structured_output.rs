//! Constrained output over HTTP on the default model: `response_format`
//! (JSON object, JSON schema) and forced tool calls (`tool_choice`
//! required or named) always give output that parses and follows its
//! schema, sampled hot, streamed or whole; rows without a grammar are
//! untouched by the constrained rows beside them.

mod common;

use serde_json::{json, Value};

use common::{chunks, post, sse, Server};

/// The schema the tests constrain to, and a check of a value against it
/// written out by hand: every required key, its type and bounds, and no
/// other key.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "mood": {"enum": ["happy", "sad", "calm"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        },
        "required": ["name", "age", "mood", "tags"],
        "additionalProperties": false,
    })
}

fn assert_person(v: &Value) {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["age", "mood", "name", "tags"], "{v}");
    assert!(
        v["name"].as_str().is_some_and(|s| s.chars().count() <= 24),
        "{v}"
    );
    assert!(
        v["age"].as_i64().is_some_and(|a| (0..=130).contains(&a)),
        "{v}"
    );
    assert!(
        ["happy", "sad", "calm"].contains(&v["mood"].as_str().unwrap_or("")),
        "{v}"
    );
    let tags = v["tags"].as_array().unwrap();
    assert!(
        tags.len() <= 3
            && tags
                .iter()
                .all(|t| t.as_str().is_some_and(|s| s.chars().count() <= 12)),
        "{v}"
    );
}

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Describe a person."}],
        "max_tokens": 120,
        "temperature": 1.0,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The text of choice 0 of a stream, and its finish reason.
fn streamed_content(events: &[String]) -> (String, String) {
    let cs = chunks(events);
    let text = cs
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let finish = cs
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str())
        .unwrap()
        .to_string();
    (text, finish)
}

#[tokio::test(flavor = "multi_thread")]
async fn json_outputs_parse_and_follow_their_schema_at_temperature_1() {
    let s = Server::start(&[]);
    let schema = json!({"type": "json_schema",
                        "json_schema": {"name": "person", "schema": person_schema(), "strict": true}});
    for seed in 0..6 {
        let (st, r) = post(
            &s,
            "/v1/chat/completions",
            ask(json!({"seed": seed, "response_format": schema})),
        )
        .await;
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        let text = r["choices"][0]["message"]["content"].as_str().unwrap();
        assert_person(&serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}")));

        let mut body = ask(json!({"seed": seed, "response_format": schema, "stream": true}));
        body["max_tokens"] = json!(120);
        let (text, finish) = streamed_content(&sse(&s, "/v1/chat/completions", body).await);
        assert_eq!(finish, "stop");
        assert_person(&serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")));

        let object = json!({"type": "json_object"});
        let (st, r) = post(
            &s,
            "/v1/chat/completions",
            ask(json!({"seed": seed, "response_format": object})),
        )
        .await;
        assert_eq!(st, 200, "{r}");
        if r["choices"][0]["finish_reason"] == "stop" {
            let text = r["choices"][0]["message"]["content"].as_str().unwrap();
            let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(v.is_object(), "{v}");
        }
        // Completions take response_format too.
        let (st, r) = post(
            &s,
            "/v1/completions",
            json!({"prompt": "A person:", "max_tokens": 120, "temperature": 1.0, "seed": seed,
                   "response_format": schema}),
        )
        .await;
        assert_eq!(st, 200, "{r}");
        let text = r["choices"][0]["text"].as_str().unwrap();
        assert_person(&serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}")));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cut_off_json_is_length_and_bad_schemas_are_400() {
    let s = Server::start(&[]);
    let schema =
        json!({"type": "json_schema", "json_schema": {"name": "p", "schema": person_schema()}});
    let (st, r) = post(
        &s,
        "/v1/chat/completions",
        ask(json!({"response_format": schema, "max_tokens": 5})),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "length");

    for (format, param) in [
        (
            json!({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "nonsense"}}}),
            "response_format",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "p", "schema": 3}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"type": "json_schema"}),
            "response_format.json_schema",
        ),
        (json!({"type": "grammar"}), "response_format.type"),
    ] {
        let (st, r) = post(
            &s,
            "/v1/chat/completions",
            ask(json!({"response_format": format})),
        )
        .await;
        assert_eq!(st, 400, "{format}: {r}");
        assert_eq!(r["error"]["param"], param, "{r}");
    }
    let object = json!({"type": "json_object"});
    let (st, r) = post(
        &s,
        "/v1/chat/completions",
        ask(json!({"response_format": object, "ignore_eos": true})),
    )
    .await;
    assert_eq!(
        (st, r["error"]["param"].clone()),
        (400, json!("ignore_eos")),
        "{r}"
    );
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20},
                               "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
            "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                           "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
            "required": ["a", "b"], "additionalProperties": false}}},
    ])
}

fn assert_call_valid(name: &str, args: &Value) {
    let o = args.as_object().unwrap_or_else(|| panic!("{args}"));
    match name {
        "get_weather" => {
            assert!(
                o.len() == 2 && o["city"].as_str().is_some_and(|c| c.chars().count() <= 20),
                "{args}"
            );
            assert!(
                ["c", "f"].contains(&o["unit"].as_str().unwrap_or("")),
                "{args}"
            );
        }
        "add" => {
            let small = |v: &Value| v.as_i64().is_some_and(|n| (-1000..=1000).contains(&n));
            assert!(o.len() == 2 && small(&o["a"]) && small(&o["b"]), "{args}");
        }
        other => panic!("unknown function {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn forced_tool_calls_name_a_tool_with_valid_arguments() {
    let s = Server::start(&[]);
    let named = json!({"type": "function", "function": {"name": "add"}});
    for seed in 0..4 {
        for choice in [json!("required"), named.clone()] {
            let body = ask(
                json!({"seed": seed, "tools": tools(), "tool_choice": choice,
                                  "parallel_tool_calls": false}),
            );
            let (st, r) = post(&s, "/v1/chat/completions", body.clone()).await;
            assert_eq!(st, 200, "{r}");
            let c = &r["choices"][0];
            // A named call ends as stop, as OpenAI's does.
            let finish = if choice == named {
                "stop"
            } else {
                "tool_calls"
            };
            assert_eq!(c["finish_reason"], finish, "{r}");
            assert!(c["message"]["content"].is_null(), "{r}");
            let calls = c["message"]["tool_calls"].as_array().unwrap();
            assert_eq!(calls.len(), 1, "{r}");
            let name = calls[0]["function"]["name"].as_str().unwrap();
            if choice == named {
                assert_eq!(name, "add");
            }
            assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
            let args: Value =
                serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
            assert_call_valid(name, &args);

            // Streamed: the id and name come first, the argument pieces
            // join to a valid arguments object.
            let mut streamed = body;
            streamed["stream"] = json!(true);
            let cs = chunks(&sse(&s, "/v1/chat/completions", streamed).await);
            let deltas: Vec<&Value> = cs
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
                .flatten()
                .collect();
            assert!(deltas[0]["id"].is_string() && deltas[0]["function"]["name"].is_string());
            assert!(deltas[1..]
                .iter()
                .all(|d| d["id"].is_null() && d["index"] == 0));
            let args: String = deltas
                .iter()
                .filter_map(|d| d["function"]["arguments"].as_str())
                .collect();
            let name = deltas[0]["function"]["name"].as_str().unwrap();
            assert_call_valid(
                name,
                &serde_json::from_str(&args).unwrap_or_else(|e| panic!("{e}: {args}")),
            );
            let finish = cs
                .iter()
                .find_map(|c| c["choices"][0]["finish_reason"].as_str());
            let want = if choice == named {
                "stop"
            } else {
                "tool_calls"
            };
            assert_eq!(finish, Some(want));
        }
    }
}

/// `tool_choice` auto on the default model, whose template has no tool
/// format: the tools are described in the prompt and the reply is read as
/// a call list or text. Here the model answers in text, whole and
/// streamed alike, and a replayed call and its result reach the prompt.
#[tokio::test(flavor = "multi_thread")]
async fn auto_tools_without_a_template_format_answer_in_text() {
    let s = Server::start(&[]);
    let hello = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Say hello to me."}],
                              "max_tokens": 40, "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let (st, plain) = post(&s, "/v1/chat/completions", hello(json!({}))).await;
    assert_eq!(st, 200, "{plain}");
    for choice in [json!(null), json!("auto")] {
        let mut extra = json!({"tools": tools()});
        if !choice.is_null() {
            extra["tool_choice"] = choice;
        }
        let (st, r) = post(&s, "/v1/chat/completions", hello(extra.clone())).await;
        assert_eq!(st, 200, "{r}");
        let c = &r["choices"][0];
        let text = c["message"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"));
        assert!(
            !text.is_empty() && c["message"]["tool_calls"].is_null(),
            "{r}"
        );
        assert_eq!(c["finish_reason"], "stop", "{r}");
        // Both tools' names and schemas are in the prompt.
        let (with, without) = (
            r["usage"]["prompt_tokens"].as_u64().unwrap(),
            plain["usage"]["prompt_tokens"].as_u64().unwrap(),
        );
        assert!(
            with > without + 100,
            "{with} prompt tokens with tools, {without} without"
        );

        let mut streamed = hello(extra);
        streamed["stream"] = json!(true);
        let (got, finish) = streamed_content(&sse(&s, "/v1/chat/completions", streamed).await);
        assert_eq!((got.as_str(), finish.as_str()), (text, "stop"));
    }

    // A client replays a call and its result: the template takes them as
    // the generic format's turns.
    let history = json!([
        {"role": "user", "content": "What is 2 plus 3?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]);
    let first = json!({"messages": [history[0].clone()], "tools": tools(), "max_tokens": 20,
                       "temperature": 0});
    let (_, before) = post(&s, "/v1/chat/completions", first).await;
    let again = json!({"messages": history, "tools": tools(), "max_tokens": 20, "temperature": 0});
    let (st, r) = post(&s, "/v1/chat/completions", again).await;
    assert_eq!(st, 200, "{r}");
    let grew = r["usage"]["prompt_tokens"].as_u64().unwrap()
        - before["usage"]["prompt_tokens"].as_u64().unwrap();
    // The call list and "Result of call_1: 5" in their turns.
    assert!(grew >= 25, "the replayed turns added {grew} tokens");
}

/// Tools offered (`auto`) with a `response_format`, as agent frameworks
/// send them (openai-agents' `output_type`, pydantic-ai's `NativeOutput`):
/// the reply is a call of a tool or the answer in the format's schema,
/// sampled hot, whole and streamed. A forced call with a format is
/// refused: each would decide the reply.
#[tokio::test(flavor = "multi_thread")]
async fn auto_tools_with_a_response_format_call_or_answer_in_its_schema() {
    let s = Server::start(&[]);
    let format = json!({"type": "json_schema",
                        "json_schema": {"name": "person", "schema": person_schema()}});
    for seed in 0..4 {
        let body = ask(
            json!({"seed": seed, "tools": tools(), "response_format": format,
                              "parallel_tool_calls": false}),
        );
        let (st, r) = post(&s, "/v1/chat/completions", body.clone()).await;
        assert_eq!(st, 200, "{r}");
        let c = &r["choices"][0];
        match c["message"]["tool_calls"].as_array() {
            Some(calls) => {
                assert_eq!(c["finish_reason"], "tool_calls", "{r}");
                for call in calls {
                    let args = call["function"]["arguments"].as_str().unwrap();
                    let args = serde_json::from_str(args).unwrap_or_else(|e| panic!("{e}: {r}"));
                    assert_call_valid(call["function"]["name"].as_str().unwrap(), &args);
                }
            }
            None => {
                assert_eq!(c["finish_reason"], "stop", "{r}");
                let text = c["message"]["content"].as_str().unwrap();
                assert_person(&serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {r}")));
            }
        }
        let mut streamed = body;
        streamed["stream"] = json!(true);
        let events = sse(&s, "/v1/chat/completions", streamed).await;
        let (text, finish) = streamed_content(&events);
        if finish == "stop" {
            assert_person(&serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")));
        } else {
            assert_eq!((text.as_str(), finish.as_str()), ("", "tool_calls"));
        }
    }
    // The Responses API's `text.format` beside function tools.
    let add = &tools()[1]["function"];
    let responses = json!({"input": "Describe a person.", "max_output_tokens": 120,
        "temperature": 1.0, "parallel_tool_calls": false,
        "tools": [{"type": "function", "name": "add", "parameters": add["parameters"]}],
        "text": {"format": {"type": "json_schema", "name": "person", "schema": person_schema()}}});
    let (st, r) = post(&s, "/v1/responses", responses).await;
    assert_eq!(st, 200, "{r}");
    let item = r["output"].as_array().unwrap().last().unwrap().clone();
    match item["type"].as_str() {
        Some("function_call") => assert_call_valid(
            "add",
            &serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap(),
        ),
        _ => assert_person(
            &serde_json::from_str(item["content"][0]["text"].as_str().unwrap())
                .unwrap_or_else(|e| panic!("{e}: {r}")),
        ),
    }
    let forced =
        ask(json!({"tools": tools(), "tool_choice": "required", "response_format": format}));
    let (st, r) = post(&s, "/v1/chat/completions", forced).await;
    assert_eq!(
        (st, r["error"]["param"].clone()),
        (400, json!("response_format")),
        "{r}"
    );
}

/// A greedy row without a grammar gives the same tokens alone as beside
/// rows under one.
#[tokio::test(flavor = "multi_thread")]
async fn unconstrained_rows_are_untouched_by_constrained_neighbours() {
    let s = Server::start(&[]);
    let plain = json!({"prompt": "The history of the bicycle", "max_tokens": 40, "temperature": 0,
                       "ignore_eos": true});
    let (_, alone) = post(&s, "/v1/completions", plain.clone()).await;
    let schema =
        json!({"type": "json_schema", "json_schema": {"name": "p", "schema": person_schema()}});
    let constrained = (0..4).map(|seed| {
        let s = &s;
        let schema = schema.clone();
        async move {
            post(
                s,
                "/v1/chat/completions",
                ask(json!({"seed": seed, "response_format": schema})),
            )
            .await
        }
    });
    let (beside, others) = tokio::join!(
        post(&s, "/v1/completions", plain),
        futures::future::join_all(constrained)
    );
    assert!(others.iter().all(|(st, _)| *st == 200));
    assert_eq!(alone["choices"][0]["text"], beside.1["choices"][0]["text"]);
}

/// `$defs` chained `n` deep through `kw` (`items`, ...), ending in a string.
fn ref_chain(n: usize, kw: &str) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(
            format!("d{i}"),
            json!({"type": "array", kw: {"$ref": format!("#/$defs/d{}", i + 1)}}),
        );
    }
    defs.insert(format!("d{n}"), json!({"type": "string"}));
    json!({"$ref": "#/$defs/d0", "$defs": defs})
}

fn schema_format(schema: Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
}

/// Grammars built to overflow the compiler's stack, or to fail inside it,
/// get a 400 that names what is wrong and carries no parser internals; the
/// server lives on.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_grammars_are_refused_and_the_server_lives() {
    let s = Server::start(&[]);
    let mut all_of = json!({"type": "string"});
    for _ in 0..40 {
        all_of = json!({"allOf": [all_of]});
    }
    let forced_tool = |schema: Value| {
        json!({
            "tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": {"a": schema}}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        })
    };
    let cases = [
        // A chain that overflowed a worker's stack at 300.
        (
            json!({"response_format": schema_format(ref_chain(1000, "items"))}),
            "256",
        ),
        (
            json!({"response_format": schema_format(ref_chain(300, "items"))}),
            "$ref",
        ),
        (forced_tool(ref_chain(1000, "items")), "$ref"),
        (
            json!({"response_format": schema_format(all_of)}),
            "64 levels",
        ),
        (
            json!({"response_format": schema_format(
                json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}))}),
            "no output can satisfy the grammar",
        ),
        (
            json!({"response_format": schema_format(
                json!({"type": "string", "pattern": "^a$", "minLength": 5}))}),
            "no string can satisfy the schema",
        ),
        (
            json!({"response_format": schema_format(
                json!({"type": "object", "x-guidance": {"whitespace_pattern": "("}}))}),
            "regex",
        ),
        // Fails on its first mask, at generation.
        (
            json!({"response_format": schema_format(
                json!({"type": "string", "pattern": "^(.{1,100}){1,100}$"}))}),
            "the pattern is too complex",
        ),
    ];
    for (extra, says) in cases {
        for stream in [false, true] {
            let mut body = ask(extra.clone());
            body["max_tokens"] = json!(8);
            body["stream"] = json!(stream);
            let resp = reqwest::Client::new()
                .post(s.url("/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            let st = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            // A stream already under way ends in one error event instead.
            let r: Value = match st {
                200 if stream => text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                    .find(|v| v.get("error").is_some())
                    .unwrap_or(Value::Null),
                _ => serde_json::from_str(&text).unwrap_or(Value::Null),
            };
            let message = r["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let shown = format!("{extra:.200}: {st} {text:.400}");
            if st == 200 {
                assert!(stream && !message.is_empty(), "{shown}");
                assert_eq!(r["error"]["type"], "invalid_request_error", "{shown}");
            } else {
                common::assert_error(st, &r, 400, None);
            }
            assert!(message.contains(says), "{shown}");
            // No parser state, markup or expression dump.
            assert!(
                !message.contains('<') && !message.contains("(And") && message.len() < 300,
                "{shown}"
            );
        }
    }
    // The longest chain within the limits compiles and runs.
    let (st, r) = post(
        &s,
        "/v1/chat/completions",
        ask(json!({"response_format": schema_format(ref_chain(255, "items")), "max_tokens": 8})),
    )
    .await;
    assert_eq!(st, 200, "{r:.400}");
    let health = reqwest::get(s.url("/health")).await.unwrap();
    assert_eq!(health.status(), 200);
}

/// A schema as pydantic writes it (instructor, langchain): properties
/// listed, `additionalProperties` left out, no bounds.
fn pydantic_city() -> Value {
    json!({
        "title": "City",
        "type": "object",
        "properties": {
            "name": {"title": "Name", "type": "string"},
            "country": {"title": "Country", "type": "string"},
            "population": {"title": "Population", "type": "integer"},
        },
        "required": ["name", "country", "population"],
    })
}

/// Only the listed keys, every one, a population within the 16-digit cap.
fn assert_city(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let mut keys: Vec<&str> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {text}"))
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, ["country", "name", "population"], "{text}");
    assert!(v["name"].is_string() && v["country"].is_string(), "{text}");
    let max = (1i64 << 53) - 1;
    assert!(
        v["population"].as_i64().is_some_and(|p| p.abs() <= max),
        "{text}"
    );
}

/// wick's rule for what a schema leaves open (docs/api.md): a
/// pydantic-style schema ends in JSON with no invented keys within
/// `max_tokens` 256, as `response_format` and as a forced call's arguments.
#[tokio::test(flavor = "multi_thread")]
async fn open_schemas_end_with_only_their_keys() {
    let s = Server::start(&[]);
    let city = |seed: u64, extra: Value| {
        let mut body = json!({
            "messages": [{"role": "user", "content":
                "Tell me about the biggest city in Norway, with all its statistics."}],
            "max_tokens": 256,
            "seed": seed,
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let tool = json!([{"type": "function", "function": {
        "name": "City", "description": "Correctly extracted `City` with all the required \
         parameters with correct types", "parameters": pydantic_city()}}]);
    let named = json!({"type": "function", "function": {"name": "City"}});
    for seed in 0..4 {
        let body = city(
            seed,
            json!({"response_format": schema_format(pydantic_city())}),
        );
        let (st, r) = post(&s, "/v1/chat/completions", body).await;
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        assert_city(r["choices"][0]["message"]["content"].as_str().unwrap());

        let body = city(seed, json!({"tools": tool, "tool_choice": named}));
        let (st, r) = post(&s, "/v1/chat/completions", body).await;
        assert_eq!(st, 200, "{r}");
        // Ended, not cut off (a named call ends in "stop" as on OpenAI).
        let finish = &r["choices"][0]["finish_reason"];
        assert!(finish == "stop" || finish == "tool_calls", "{r}");
        let call = &r["choices"][0]["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "City", "{r}");
        assert_city(call["arguments"].as_str().unwrap());
    }
}

/// OpenAI's deprecated `functions` / `function_call`: served as tools, the
/// call returned in the old shape, whole and streamed, and a history in the
/// old shape taken back.
#[tokio::test(flavor = "multi_thread")]
async fn legacy_functions_call_in_the_old_shape() {
    let s = Server::start(&[]);
    let functions: Vec<Value> = tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"].clone())
        .collect();
    for (call, finish) in [
        (json!({"name": "add"}), "stop"),
        (json!("auto"), "function_call"),
    ] {
        let body = ask(json!({"functions": functions, "function_call": call, "temperature": 0}));
        let (st, r) = post(&s, "/v1/chat/completions", body.clone()).await;
        assert_eq!(st, 200, "{r}");
        let m = &r["choices"][0]["message"];
        assert!(m["tool_calls"].is_null(), "{r}");
        let Some(name) = m["function_call"]["name"].as_str() else {
            // `auto` on the default model may answer in text.
            assert!(call == json!("auto") && m["content"].is_string(), "{r}");
            assert_ne!(r["choices"][0]["finish_reason"], "function_call", "{r}");
            continue;
        };
        assert!(m["content"].is_null(), "{r}");
        assert_eq!(r["choices"][0]["finish_reason"], finish, "{r}");
        let args = m["function_call"]["arguments"].as_str().unwrap();
        assert_call_valid(name, &serde_json::from_str(args).unwrap());

        let mut streamed = body;
        streamed["stream"] = json!(true);
        let cs = chunks(&sse(&s, "/v1/chat/completions", streamed).await);
        let pieces: Vec<&Value> = cs
            .iter()
            .filter_map(|c| c["choices"][0]["delta"].get("function_call"))
            .collect();
        assert!(cs
            .iter()
            .all(|c| c["choices"][0]["delta"].get("tool_calls").is_none()));
        assert_eq!(pieces[0]["name"], name);
        let joined: String = pieces
            .iter()
            .filter_map(|p| p["arguments"].as_str())
            .collect();
        assert_eq!(joined, args);
    }
    // The old history: an assistant `function_call` and the `function`
    // turn answering it.
    let history = json!({"messages": [
        {"role": "user", "content": "What is 2 plus 3?"},
        {"role": "assistant", "content": null,
         "function_call": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}},
        {"role": "function", "name": "add", "content": "5"}],
        "functions": functions, "max_tokens": 20, "temperature": 0});
    let (st, r) = post(&s, "/v1/chat/completions", history).await;
    assert_eq!(st, 200, "{r}");
    // Both forms at once is a 400 naming the old one.
    let both = ask(json!({"functions": functions, "tools": tools()}));
    let (st, r) = post(&s, "/v1/chat/completions", both).await;
    assert_eq!(
        (st, r["error"]["param"].clone()),
        (400, json!("functions")),
        "{r}"
    );
}
