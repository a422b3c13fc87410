//! The same reply through every API's renderer: chat, Messages and
//! Responses must show the same thinking, text and calls, streamed and
//! whole, and completions the raw text.

use axum::body::to_bytes;
use serde::Serialize;
use serde_json::{json, Value};

use crate::engine::sequence::FinishReason;
use crate::server::anthropic::messages_stream::Blocks;
use crate::server::openai::chat::ChatBuilder;
use crate::server::openai::chunks::{Chunks, Envelope};
use crate::server::openai::completions::CompletionBuilder;
use crate::server::openai::responses::stream::ResponseBuilder;
use crate::server::protocol::{PromptTokensDetails, Usage};
use crate::server::reply::testing::{deltas, hermes, parser, plan};
use crate::server::respond::Render;
use crate::server::tools::{CallIds, ToolMode};
use crate::server::validation::GenerationPlan;
use crate::text::tokenizer::test_tokenizer;

/// Thinking, text and two calls, cut inside tags, names and keys.
const PIECES: [&str; 11] = [
    "<thi",
    "nk>Let me",
    " check.</th",
    "ink>\n\nSure",
    ", checking.<tool",
    "_call>\n{\"name\": \"get_wea",
    "ther\", \"arguments\": {\"ci",
    "ty\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arg",
    "uments\": {}}</tool_",
    "call>",
    "",
];

/// gpt-oss's harmony: thinking, a preamble and a call, cut inside markers.
const HARMONY: [&str; 8] = [
    "<|chan",
    "nel|>analysis<|message|>Let me",
    " check.<|e",
    "nd|><|start|>assistant<|channel|>commentary<|message|>Sure",
    ", checking.<|end|><|start|>assistant to=functions.get_wea",
    "ther<|channel|>commentary <|constrain|>json<|message|>{\"ci",
    "ty\": \"Paris\"}",
    "",
];

fn usage() -> Usage {
    Usage {
        prompt_tokens: 3,
        completion_tokens: PIECES.len(),
        total_tokens: 3 + PIECES.len(),
        prompt_tokens_details: PromptTokensDetails { cached_tokens: 0 },
        completion_tokens_details: None,
    }
}

/// What a client reads out of a reply.
#[derive(Debug, Clone, Default, PartialEq)]
struct Seen {
    reasoning: String,
    text: String,
    /// Each call's name and arguments.
    calls: Vec<(String, Value)>,
}

impl Seen {
    fn call(&mut self, name: &str, arguments: &str) {
        let args = serde_json::from_str(arguments).unwrap_or_else(|_| panic!("{arguments}"));
        self.calls.push((name.to_string(), args));
    }
}

/// `pieces` through `plan`'s parser and `r`, as `respond` runs them: the
/// events a stream sends, and the whole response made of them.
async fn render<R: Render>(mut r: R, plan: &GenerationPlan, pieces: &[&str]) -> (Vec<Value>, Value)
where
    R::Event: Serialize,
{
    let mut p = parser(plan, "");
    let mut events = r.open();
    for d in deltas(pieces, FinishReason::Stop) {
        events.extend(r.step(0, p.push(d), &usage));
    }
    events.extend(r.finish(usage()));
    let streamed = events
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    let mut whole = r.whole(1);
    for ev in events {
        r.fold(&mut whole, ev);
    }
    let body = to_bytes(r.answer(whole).into_body(), usize::MAX).await;
    (streamed, serde_json::from_slice(&body.unwrap()).unwrap())
}

fn chat(chunks: &[Value], whole: &Value) -> (Seen, Seen) {
    let mut streamed = Seen::default();
    let mut calls: Vec<(String, String)> = Vec::new();
    for delta in chunks.iter().filter_map(|c| c["choices"].get(0)) {
        let delta = &delta["delta"];
        streamed.text += delta["content"].as_str().unwrap_or_default();
        streamed.reasoning += delta["reasoning_content"].as_str().unwrap_or_default();
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let f = &call["function"];
            match f["name"].as_str() {
                Some(name) => calls.push((name.into(), String::new())),
                None => calls.last_mut().unwrap().1 += f["arguments"].as_str().unwrap(),
            }
        }
    }
    for (name, args) in calls {
        streamed.call(&name, &args);
    }
    let message = &whole["choices"][0]["message"];
    let mut seen = Seen {
        reasoning: message["reasoning_content"].as_str().unwrap().into(),
        text: message["content"].as_str().unwrap().into(),
        calls: Vec::new(),
    };
    for call in message["tool_calls"].as_array().unwrap() {
        let f = &call["function"];
        seen.call(
            f["name"].as_str().unwrap(),
            f["arguments"].as_str().unwrap(),
        );
    }
    assert_eq!(whole["choices"][0]["finish_reason"], "tool_calls");
    (streamed, seen)
}

fn messages(events: &[Value], whole: &Value) -> (Seen, Seen) {
    let mut streamed = Seen::default();
    let mut calls: Vec<(String, String)> = Vec::new();
    for ev in events {
        match ev["type"].as_str().unwrap() {
            "content_block_start" if ev["content_block"]["type"] == "tool_use" => {
                let name = ev["content_block"]["name"].as_str().unwrap();
                calls.push((name.into(), String::new()));
            }
            "content_block_delta" => {
                let d = &ev["delta"];
                streamed.text += d["text"].as_str().unwrap_or_default();
                streamed.reasoning += d["thinking"].as_str().unwrap_or_default();
                if let Some(json) = d["partial_json"].as_str() {
                    calls.last_mut().unwrap().1 += json;
                }
            }
            _ => {}
        }
    }
    for (name, args) in calls {
        streamed.call(&name, &args);
    }
    let mut seen = Seen::default();
    for block in whole["content"].as_array().unwrap() {
        match block["type"].as_str().unwrap() {
            "text" => seen.text += block["text"].as_str().unwrap(),
            "thinking" => seen.reasoning += block["thinking"].as_str().unwrap(),
            _ => {
                let name = block["name"].as_str().unwrap().to_string();
                seen.calls.push((name, block["input"].clone()));
            }
        }
    }
    assert_eq!(whole["stop_reason"], "tool_use");
    (streamed, seen)
}

fn responses(events: &[Value], whole: &Value) -> (Seen, Seen) {
    let mut streamed = Seen::default();
    let mut calls: Vec<(String, String)> = Vec::new();
    for ev in events {
        match ev["type"].as_str().unwrap() {
            "response.output_item.added" if ev["item"]["type"] == "function_call" => {
                calls.push((ev["item"]["name"].as_str().unwrap().into(), String::new()));
            }
            "response.output_text.delta" => streamed.text += ev["delta"].as_str().unwrap(),
            "response.reasoning_text.delta" => streamed.reasoning += ev["delta"].as_str().unwrap(),
            "response.function_call_arguments.delta" => {
                calls.last_mut().unwrap().1 += ev["delta"].as_str().unwrap()
            }
            _ => {}
        }
    }
    for (name, args) in calls {
        streamed.call(&name, &args);
    }
    let mut seen = Seen::default();
    for item in whole["output"].as_array().unwrap() {
        match item["type"].as_str().unwrap() {
            "message" => seen.text += item["content"][0]["text"].as_str().unwrap(),
            "reasoning" => seen.reasoning += item["content"][0]["text"].as_str().unwrap(),
            _ => seen.call(
                item["name"].as_str().unwrap(),
                item["arguments"].as_str().unwrap(),
            ),
        }
    }
    assert_eq!(whole["status"], "completed");
    (streamed, seen)
}

#[tokio::test]
async fn every_api_shows_the_same_reply() {
    let expected = Seen {
        reasoning: "Let me check.".into(),
        text: "Sure, checking.".into(),
        calls: vec![
            ("get_weather".into(), json!({"city": "Paris"})),
            ("now".into(), json!({})),
        ],
    };
    every_api_shows(&plan(Some(false), hermes(), true), &PIECES, &expected).await;

    // Harmony's reply ends at its call.
    let harmony = GenerationPlan {
        harmony: true,
        ..plan(None, ToolMode::Harmony, true)
    };
    let one_call = Seen {
        calls: expected.calls[..1].to_vec(),
        ..expected
    };
    every_api_shows(&harmony, &HARMONY, &one_call).await;

    // Completions read neither thinking nor calls: the text as written.
    let plan = plan(None, ToolMode::Off, true);
    let builder = CompletionBuilder::new(&plan, &test_tokenizer(), 1);
    let chunks = Chunks::new(builder, Envelope::new("cmpl-1".into(), "m"), &plan);
    let (events, whole) = render(chunks, &plan, &PIECES).await;
    let streamed: String = events
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, PIECES.concat());
    assert_eq!(whole["choices"][0]["text"], PIECES.concat());
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
}

/// `pieces` read by `reply`'s plan show `expected` through chat, Messages
/// and Responses, streamed and whole.
async fn every_api_shows(reply: &GenerationPlan, pieces: &[&str], expected: &Seen) {
    let chunks = Chunks::new(
        ChatBuilder::new(reply, 1),
        Envelope::new("chatcmpl-1".into(), "m"),
        reply,
    );
    let (events, whole) = render(chunks, reply, pieces).await;
    assert_eq!(
        chat(&events, &whole),
        (expected.clone(), expected.clone()),
        "chat"
    );

    let blocks = Blocks::new(reply, "msg_1".into(), "m".into());
    let (events, whole) = render(blocks, reply, pieces).await;
    assert_eq!(
        messages(&events, &whole),
        (expected.clone(), expected.clone()),
        "messages"
    );

    let builder = ResponseBuilder::new(
        "resp_1".into(),
        0,
        Default::default(),
        CallIds::OpenAi,
        None,
    );
    let (events, whole) = render(builder, reply, pieces).await;
    assert_eq!(
        responses(&events, &whole),
        (expected.clone(), expected.clone()),
        "responses"
    );
}
