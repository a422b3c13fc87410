//! Models that think: a chat template that writes `<think>` blocks gets its
//! output split into `reasoning_content` and `content`, whole and streamed,
//! and `chat_template_kwargs` (here `enable_thinking`) reach the template.

mod common;

use serde_json::{json, Value};

use common::{chunks, post, sse, Server};

/// ChatML whose generation prompt opens a thinking block, or (with
/// `enable_thinking: false`) writes an empty one, as Qwen3's does.
const THINKING_TEMPLATE: &str = "{%- for m in messages %}<|im_start|>{{ m.role }}\n\
    {{ m.content }}<|im_end|>\n{% endfor -%}\
    {%- if add_generation_prompt %}<|im_start|>assistant\n\
    {%- if enable_thinking is defined and enable_thinking is false %}\n<think>\n\n</think>\n\n\
    {%- else %}\n<think>\n{% endif %}{% endif -%}";

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "What is 2 + 2?"}],
                          "max_tokens": 8, "temperature": 0});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test(flavor = "multi_thread")]
async fn thinking_is_apart_from_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("thinking.jinja");
    std::fs::write(&template, THINKING_TEMPLATE).unwrap();
    let s = Server::start(&["--chat-template", template.to_str().unwrap()]);

    // The prompt opens the block: all 8 tokens are thinking.
    let (st, whole) = post(&s, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(st, 200, "{whole}");
    let message = &whole["choices"][0]["message"];
    let thought = message["reasoning_content"].as_str().unwrap();
    assert!(!thought.trim().is_empty(), "{whole}");
    assert_eq!(message["content"], "", "{whole}");

    // Streamed, the same thinking arrives as reasoning_content deltas.
    let events = sse(&s, "/v1/chat/completions", chat(json!({"stream": true}))).await;
    let deltas: Vec<Value> = chunks(&events)
        .into_iter()
        .map(|c| c["choices"][0]["delta"].clone())
        .collect();
    let streamed: String = deltas
        .iter()
        .filter_map(|d| d["reasoning_content"].as_str())
        .collect();
    assert_eq!(streamed, thought);
    assert!(deltas
        .iter()
        .all(|d| d["content"].as_str().is_none_or(str::is_empty)));

    // enable_thinking: false closes the block in the prompt: all answer.
    let off = chat(json!({"chat_template_kwargs": {"enable_thinking": false}, "ignore_eos": true}));
    let (st, whole) = post(&s, "/v1/chat/completions", off).await;
    assert_eq!(st, 200, "{whole}");
    let message = &whole["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{whole}");
    assert!(!message["content"].as_str().unwrap().is_empty(), "{whole}");

    // The template's own variables are not the client's to set.
    let bad = chat(json!({"chat_template_kwargs": {"messages": []}}));
    let (st, body) = post(&s, "/v1/chat/completions", bad).await;
    common::assert_error(st, &body, 400, Some("chat_template_kwargs"));
}

/// A template that never thinks leaves the output alone.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_that_does_not_think_has_no_reasoning_content() {
    let s = Server::start(&[]);
    let (st, whole) = post(&s, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(st, 200, "{whole}");
    let message = &whole["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{whole}");
    assert!(!message["content"].as_str().unwrap().is_empty(), "{whole}");
}
