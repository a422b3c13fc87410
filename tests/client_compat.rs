//! What real clients ran into, over HTTP on the default model: an agent
//! loop on a Mistral template (whose templates take back only 9-character
//! call ids), a call list cut off by `max_tokens`, fields common clients
//! send, and small differences from OpenAI's answers.

mod common;

use serde_json::{json, Value};

use common::{chunks, post, sse, Server};

const TEMPLATES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates");

fn template(name: &str) -> String {
    format!("{TEMPLATES}/{name}.jinja")
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}])
}

fn is_mistral_id(id: &str) -> bool {
    id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric())
}

/// An agent loop on each Mistral template: the ids wick issues are the 9
/// letters and digits the template takes back, so every turn, each
/// carrying the calls and results before it, is answered. Streamed ids
/// are the same kind.
#[tokio::test(flavor = "multi_thread")]
async fn mistral_agent_loop_takes_back_its_call_ids() {
    for name in [
        "mistralai-Mistral-Nemo-Instruct-2407",
        "Mistral-Small-3.2-24B-Instruct-2506",
    ] {
        let s = Server::start(&["--chat-template", &template(name)]);
        let mut messages = vec![json!({"role": "user", "content": "Weather in Paris, then Oslo?"})];
        let forced = json!({"type": "function", "function": {"name": "get_weather"}});
        for (turn, choice) in [json!("required"), forced].into_iter().enumerate() {
            let body = json!({"messages": messages, "tools": weather_tool(),
                              "tool_choice": choice, "max_tokens": 40, "temperature": 0});
            let (st, r) = post(&s, "/v1/chat/completions", body).await;
            assert_eq!(st, 200, "{name}, turn {turn}: {r}");
            let message = r["choices"][0]["message"].clone();
            let calls = message["tool_calls"].as_array().expect("calls").clone();
            assert!(!calls.is_empty(), "{r}");
            for call in &calls {
                let id = call["id"].as_str().unwrap();
                assert!(is_mistral_id(id), "{name}: id {id:?}");
            }
            messages.push(message);
            for call in &calls {
                messages.push(json!({"role": "tool", "tool_call_id": call["id"],
                                     "content": "21 C, sunny"}));
            }
        }
        // The last turn takes back both rounds' ids, streamed.
        let body = json!({"messages": messages, "tools": weather_tool(), "tool_choice": "required",
                          "max_tokens": 40, "temperature": 0, "stream": true});
        let events = chunks(&sse(&s, "/v1/chat/completions", body).await);
        let ids: Vec<&str> = events
            .iter()
            .flat_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
            .flatten()
            .filter_map(|c| c["id"].as_str())
            .collect();
        assert!(
            !ids.is_empty() && ids.iter().all(|id| is_mistral_id(id)),
            "{ids:?}"
        );
    }
    // Other templates keep OpenAI's ids.
    let s = Server::start(&[]);
    let body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                      "tools": weather_tool(), "tool_choice": "required", "max_tokens": 40,
                      "temperature": 0});
    let (st, r) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{r}");
    let id = r["choices"][0]["message"]["tool_calls"][0]["id"]
        .as_str()
        .unwrap();
    assert!(id.starts_with("call_") && id.len() == 29, "{id}");
}

/// The request: a call list that `max_tokens` cuts off inside its
/// second call.
fn cut_off_calls(stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": "Paris is in France. Give me data about Paris."}],
           "tools": [{"type": "function", "function": {"name": "final_result", "parameters": {
               "type": "object",
               "properties": {"name": {"type": "string"}, "country": {"type": "string"}},
               "required": ["name", "country"]}}}],
           "tool_choice": "required", "max_tokens": 56, "temperature": 0, "stream": stream})
}

/// A call list cut off by `max_tokens`: the complete call is kept, the
/// piece of the next is dropped rather than leaked into `content`, and the
/// reply still ends as `length`; streamed and whole alike.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_list_cut_off_leaks_nothing_into_content() {
    let s = Server::start(&[]);
    let (st, r) = post(&s, "/v1/chat/completions", cut_off_calls(false)).await;
    assert_eq!(st, 200, "{r}");
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 56, "{r}");
    assert!(choice["message"]["content"].is_null(), "{r}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{r}");
    assert_eq!(calls[0]["function"]["name"], "final_result");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap())
        .expect("the complete call's arguments");
    assert!(
        args["name"].is_string() && args["country"].is_string(),
        "{args}"
    );

    let events = chunks(&sse(&s, "/v1/chat/completions", cut_off_calls(true)).await);
    let deltas: Vec<&Value> = events.iter().map(|c| &c["choices"][0]).collect();
    let content: String = deltas
        .iter()
        .filter_map(|c| c["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "", "{events:?}");
    let streamed: String = deltas
        .iter()
        .flat_map(|c| c["delta"]["tool_calls"].as_array())
        .flatten()
        .filter_map(|c| c["function"]["arguments"].as_str())
        .collect();
    assert_eq!(
        streamed,
        calls[0]["function"]["arguments"].as_str().unwrap()
    );
    assert_eq!(deltas.last().unwrap()["finish_reason"], "length");
}

/// OpenAI takes `top_p: 0` as greedy: sampled at temperature 1 with any
/// seed, the reply is the greedy one.
#[tokio::test(flavor = "multi_thread")]
async fn top_p_zero_is_greedy() {
    let s = Server::start(&[]);
    let body = |extra: Value| {
        let mut b = json!({"prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": true});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let (st, greedy) = post(&s, "/v1/completions", body(json!({"temperature": 0}))).await;
    assert_eq!(st, 200, "{greedy}");
    for seed in 0..4 {
        let (st, r) = post(
            &s,
            "/v1/completions",
            body(json!({"temperature": 1.0, "top_p": 0, "seed": seed})),
        )
        .await;
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["choices"][0]["text"], greedy["choices"][0]["text"]);
    }
}

/// A forced named call ends as `stop` (OpenAI's), `required` as
/// `tool_calls`; a stream of calls alone opens with the role on the first
/// call's delta and `content: null`, while a text reply's first delta is
/// `{"role": "assistant", "content": ""}`.
#[tokio::test(flavor = "multi_thread")]
async fn tool_call_finish_reasons_and_first_deltas_as_openai() {
    let s = Server::start(&[]);
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for (choice, reason) in [(named, "stop"), (json!("required"), "tool_calls")] {
        let body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                          "tools": weather_tool(), "tool_choice": choice, "max_tokens": 40,
                          "temperature": 0, "parallel_tool_calls": false});
        let (st, r) = post(&s, "/v1/chat/completions", body.clone()).await;
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["choices"][0]["finish_reason"], reason, "{r}");
        assert!(r["choices"][0]["message"]["tool_calls"][0]["id"].is_string());

        let mut body = body;
        body["stream"] = json!(true);
        let events = chunks(&sse(&s, "/v1/chat/completions", body).await);
        let first = &events[0]["choices"][0]["delta"];
        assert_eq!(first["role"], "assistant", "{first}");
        assert!(first.get("content").is_some_and(Value::is_null), "{first}");
        assert_eq!(first["tool_calls"][0]["function"]["name"], "get_weather");
        assert!(events[1..]
            .iter()
            .all(|c| c["choices"][0]["delta"].get("role").is_none()));
        let last = events.last().unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], reason);
    }
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                      "stream": true});
    let events = chunks(&sse(&s, "/v1/chat/completions", body).await);
    assert_eq!(
        events[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
}

/// `/health` answers 503 while the model loads: expected, so logged at
/// debug level, never as an error.
#[test]
fn health_503_while_loading_is_no_error() {
    use std::io::Read;
    let env = [("RUST_LOG", "wick::server::app=debug,warn")];
    let mut s = Server::start_with(&[], &env, std::process::Stdio::piped());
    let mut stderr = s.child.stderr.take().unwrap();
    s.terminate();
    s.wait_exit(std::time::Duration::from_secs(30));
    let mut log = String::new();
    stderr.read_to_string(&mut log).unwrap();
    assert!(
        log.contains("503 Service Unavailable"),
        "no 503 seen:\n{log}"
    );
    assert!(!log.contains("ERROR"), "{log}");
}

fn chat_body(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                          "temperature": 0});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// Fields common clients send: those with no effect on the output are
/// accepted (a replayed assistant turn's `annotations`, `prompt_cache_key`,
/// `safety_identifier`, `user`); `verbosity`, which nothing here could
/// honour, is refused by name.
#[tokio::test(flavor = "multi_thread")]
async fn fields_common_clients_send() {
    let s = Server::start(&[]);
    let replay = json!([
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "annotations": [], "refusal": null},
        {"role": "user", "content": "Again"}
    ]);
    for extra in [
        json!({"messages": replay}),
        json!({"prompt_cache_key": "agent-7", "safety_identifier": "u-hash", "user": "u1"}),
    ] {
        let (st, r) = post(&s, "/v1/chat/completions", chat_body(extra)).await;
        assert_eq!(st, 200, "{r}");
    }
    let (st, e) = post(
        &s,
        "/v1/chat/completions",
        chat_body(json!({"messages": [{"role": "user", "content": "x", "annotations": []}]})),
    )
    .await;
    common::assert_error(st, &e, 400, Some("messages[0].annotations"));
    let (st, e) = post(
        &s,
        "/v1/chat/completions",
        chat_body(json!({"verbosity": "low"})),
    )
    .await;
    common::assert_error(st, &e, 400, Some("verbosity"));
    assert_eq!(e["error"]["code"], "unsupported_parameter");
}

/// vLLM's `stream_options.continuous_usage_stats`: every chunk carries the
/// usage so far, growing to the whole response's.
#[tokio::test(flavor = "multi_thread")]
async fn continuous_usage_stats_put_usage_on_every_chunk() {
    let s = Server::start(&[]);
    for (path, body) in [
        (
            "/v1/chat/completions",
            chat_body(json!({"max_tokens": 6, "ignore_eos": true})),
        ),
        (
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 6, "ignore_eos": true}),
        ),
    ] {
        let (st, whole) = post(&s, path, body.clone()).await;
        assert_eq!(st, 200, "{whole}");
        let mut streamed = body;
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"continuous_usage_stats": true});
        let events = chunks(&sse(&s, path, streamed).await);
        let counts: Vec<u64> = events
            .iter()
            .map(|c| {
                assert_eq!(
                    c["usage"]["prompt_tokens"], whole["usage"]["prompt_tokens"],
                    "{c}"
                );
                c["usage"]["completion_tokens"].as_u64().expect("usage")
            })
            .collect();
        assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
        assert_eq!(counts.last(), Some(&6), "{counts:?}");
    }
}
