//! Models that think: a chat template that writes `<think>` blocks gets its
//! output split into `reasoning_content` and `content`, whole and streamed,
//! and `chat_template_kwargs` (here `enable_thinking`) reach the template,
//! as does `reasoning_effort` where the template reads it.

mod common;

use serde_json::{json, Value};

use common::{chat, chunks, post, sse, Server};

/// ChatML whose generation prompt opens a thinking block, or (with
/// `enable_thinking: false`) writes an empty one, as Qwen3's does.
const THINKING_TEMPLATE: &str = "{%- for m in messages %}<|im_start|>{{ m.role }}\n\
    {{ m.content }}<|im_end|>\n{% endfor -%}\
    {%- if add_generation_prompt %}<|im_start|>assistant\n\
    {%- if enable_thinking is defined and enable_thinking is false %}\n<think>\n\n</think>\n\n\
    {%- else %}\n<think>\n{% endif %}{% endif -%}";

/// As [`THINKING_TEMPLATE`], steered by `reasoning_effort` as gpt-oss's
/// is: the effort is written into the prompt, and `"none"` closes the block.
const EFFORT_TEMPLATE: &str = "{%- if reasoning_effort is defined %}<|im_start|>system\n\
    Reasoning: {{ reasoning_effort }}<|im_end|>\n{% endif -%}\
    {%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}\
    {%- if add_generation_prompt %}<|im_start|>assistant\n\
    {%- if reasoning_effort is defined and reasoning_effort == 'none' %}\n<think>\n\n</think>\n\n\
    {%- else %}\n<think>\n{% endif %}{% endif -%}";

fn serve_template(source: &str) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("template.jinja");
    std::fs::write(&template, source).unwrap();
    let s = Server::start(&["--chat-template", template.to_str().unwrap()]);
    (dir, s)
}

/// `reasoning_effort` refused as this model's: OpenAI's error shape,
/// naming the field and saying why.
fn assert_no_reasoning_effort(st: u16, body: &Value) {
    common::assert_error(st, body, 400, Some("reasoning_effort"));
    assert_eq!(body["error"]["code"], "unsupported_parameter", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("chat template has no reasoning effort"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn thinking_is_apart_from_the_answer() {
    let (_dir, s) = serve_template(THINKING_TEMPLATE);

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

    // A template that thinks but reads no effort: refused, not ignored.
    let effort = chat(json!({"reasoning_effort": "low"}));
    let (st, body) = post(&s, "/v1/chat/completions", effort).await;
    assert_no_reasoning_effort(st, &body);
}

#[tokio::test(flavor = "multi_thread")]
async fn reasoning_effort_reaches_a_template_that_reads_it() {
    let (_dir, s) = serve_template(EFFORT_TEMPLATE);
    let send = |extra: Value| post(&s, "/v1/chat/completions", chat(extra));

    // Not sent: the template leaves the effort out and the model thinks.
    let (st, plain) = send(json!({})).await;
    assert_eq!(st, 200, "{plain}");
    assert!(
        plain["choices"][0]["message"]["reasoning_content"].is_string(),
        "{plain}"
    );

    // Sent, the template writes it into the prompt.
    let (st, high) = send(json!({"reasoning_effort": "high"})).await;
    assert_eq!(st, 200, "{high}");
    assert!(
        high["choices"][0]["message"]["reasoning_content"].is_string(),
        "{high}"
    );
    let prompt_tokens = |r: &Value| r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        prompt_tokens(&high) > prompt_tokens(&plain),
        "{plain} {high}"
    );

    // "none" closes the block in the prompt: all answer.
    let (st, none) = send(json!({"reasoning_effort": "none", "ignore_eos": true})).await;
    assert_eq!(st, 200, "{none}");
    let message = &none["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{none}");
    assert!(!message["content"].as_str().unwrap().is_empty(), "{none}");

    // Only OpenAI's values.
    let (st, body) = send(json!({"reasoning_effort": "extreme"})).await;
    common::assert_error(st, &body, 400, Some("reasoning_effort"));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"extreme\""),
        "{body}"
    );

    // Also set in chat_template_kwargs: the same value is fine, another is
    // a conflict the client must settle.
    let same = json!({"reasoning_effort": "none", "ignore_eos": true,
                      "chat_template_kwargs": {"reasoning_effort": "none"}});
    let (st, body) = send(same).await;
    assert_eq!(st, 200, "{body}");
    assert!(
        body["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{body}"
    );
    let conflict = json!({"reasoning_effort": "high",
                          "chat_template_kwargs": {"reasoning_effort": "none"}});
    let (st, body) = send(conflict).await;
    common::assert_error(st, &body, 400, Some("reasoning_effort"));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("conflicts"),
        "{body}"
    );
}

/// A template that never thinks leaves the output alone, and takes no
/// reasoning effort (a null one is not sent).
#[tokio::test(flavor = "multi_thread")]
async fn a_model_that_does_not_think_has_no_reasoning_content() {
    let s = Server::start(&[]);
    let (st, whole) = post(&s, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(st, 200, "{whole}");
    let message = &whole["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{whole}");
    assert!(!message["content"].as_str().unwrap().is_empty(), "{whole}");

    let effort = chat(json!({"reasoning_effort": "medium"}));
    let (st, body) = post(&s, "/v1/chat/completions", effort).await;
    assert_no_reasoning_effort(st, &body);
    let null = chat(json!({"reasoning_effort": null}));
    let (st, body) = post(&s, "/v1/chat/completions", null).await;
    assert_eq!(st, 200, "{body}");
}
