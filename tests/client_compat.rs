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
