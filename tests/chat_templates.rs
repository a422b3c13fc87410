//! Real chat templates rendered by wick against what Jinja2 renders in
//! transformers' environment (tests/fixtures/chat_templates/expected.json,
//! written by scripts/make_template_fixtures.py): the exact text, or an
//! error where Jinja2 failed, with the template's own message where it
//! called raise_exception.

use std::path::Path;

use chrono::NaiveDateTime;
use serde::Deserialize;
use serde_json::Value;
use wick::text::chat_template::{ChatMessage, ChatTemplate, Message, RenderError};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates");

#[derive(Deserialize)]
struct Expected {
    now: String,
    templates: std::collections::BTreeMap<String, Tokens>,
    cases: std::collections::BTreeMap<String, Case>,
    renders: Vec<Render>,
    snippets: Snippets,
}

#[derive(Deserialize)]
struct Tokens {
    bos_token: String,
    eos_token: String,
}

#[derive(Deserialize)]
struct Case {
    messages: Vec<Message>,
    tools: Option<Value>,
    add_generation_prompt: bool,
}

/// Jinja2's outcome: `text`, or `error` (`raised` when by raise_exception).
#[derive(Deserialize)]
struct Outcome {
    text: Option<String>,
    error: Option<String>,
    #[serde(default)]
    raised: bool,
}

#[derive(Deserialize)]
struct Render {
    template: String,
    case: String,
    #[serde(flatten)]
    outcome: Outcome,
}

#[derive(Deserialize)]
struct Snippets {
    #[serde(flatten)]
    tokens: Tokens,
    messages: Vec<Message>,
    tools: Value,
    add_generation_prompt: bool,
    expected: Vec<Snippet>,
}

#[derive(Deserialize)]
struct Snippet {
    source: String,
    #[serde(flatten)]
    outcome: Outcome,
}

fn expected() -> Expected {
    let text = std::fs::read_to_string(Path::new(FIXTURES).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn template(source: String, tokens: &Tokens, now: NaiveDateTime) -> ChatTemplate {
    ChatTemplate::new(source, tokens.bos_token.clone(), tokens.eos_token.clone())
        .unwrap()
        .with_clock(move || now)
}

/// None when wick's result is Jinja2's, else what differs.
fn mismatch(got: &Result<String, RenderError>, want: &Outcome) -> Option<String> {
    match (got, want) {
        (Ok(text), Outcome { text: Some(w), .. }) if text == w => None,
        (
            Err(RenderError::Rejected(m)),
            Outcome {
                error: Some(w),
                raised: true,
                ..
            },
        ) if m == w => None,
        (
            Err(RenderError::Failed(_)),
            Outcome {
                error: Some(_),
                raised: false,
                ..
            },
        ) => None,
        (got, Outcome { text: Some(w), .. }) => Some(format!("want {w:?}\n     got {got:?}")),
        (got, Outcome { error, raised, .. }) => Some(format!(
            "want error {error:?} (raise_exception: {raised})\n     got {got:?}"
        )),
    }
}

fn now(expected: &Expected) -> NaiveDateTime {
    expected.now.parse().unwrap()
}

#[test]
fn real_templates_render_as_transformers_does() {
    let expected = expected();
    let now = now(&expected);
    let mut failures = Vec::new();
    for (name, tokens) in &expected.templates {
        let source = std::fs::read_to_string(Path::new(FIXTURES).join(name)).unwrap();
        let t = template(source, tokens, now);
        for r in expected.renders.iter().filter(|r| &r.template == name) {
            let case = &expected.cases[&r.case];
            let got = t.render_with_tools(
                &case.messages,
                case.tools.as_ref(),
                case.add_generation_prompt,
            );
            if let Some(m) = mismatch(&got, &r.outcome) {
                failures.push(format!("{name} / {}:\n     {m}", r.case));
            }
        }
    }
    let total = expected.renders.len();
    assert!(
        failures.is_empty(),
        "{} of {total} renders differ from Jinja2:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A case without tools whose turns are all role and text, as plain turns.
fn plain(case: &Case) -> Option<Vec<ChatMessage>> {
    if case.tools.is_some() {
        return None;
    }
    case.messages
        .iter()
        .map(|m| match m {
            Message {
                role,
                content: Some(content),
                reasoning_content: None,
                tool_calls: None,
                tool_call_id: None,
                name: None,
                parts: None,
            } => Some(ChatMessage {
                role: role.clone(),
                content: content.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// `render` over plain text turns is the same render.
#[test]
fn plain_messages_render_the_same() {
    let expected = expected();
    let now = now(&expected);
    let mut checked = 0;
    for r in &expected.renders {
        let Some(plain) = plain(&expected.cases[&r.case]) else {
            continue;
        };
        let case = &expected.cases[&r.case];
        let source = std::fs::read_to_string(Path::new(FIXTURES).join(&r.template)).unwrap();
        let t = template(source, &expected.templates[&r.template], now);
        let got = t.render(&plain, case.add_generation_prompt);
        assert_eq!(
            mismatch(&got, &r.outcome),
            None,
            "{} / {}",
            r.template,
            r.case
        );
        checked += 1;
    }
    assert!(checked > 40, "only {checked} plain renders");
}

/// The environment itself: tojson's options, strftime_now, Python's str()
/// of values, string and dict methods, loop controls, whitespace control.
#[test]
fn environment_matches_transformers() {
    let expected = expected();
    let now = now(&expected);
    let s = &expected.snippets;
    let mut failures = Vec::new();
    for snippet in &s.expected {
        let t = template(snippet.source.clone(), &s.tokens, now);
        let got = t.render_with_tools(&s.messages, Some(&s.tools), s.add_generation_prompt);
        if let Some(m) = mismatch(&got, &snippet.outcome) {
            failures.push(format!("{:?}:\n     {m}", snippet.source));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} snippets differ from Jinja2:\n{}",
        failures.len(),
        s.expected.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_template_is_the_default_models() {
    let path = wick::load::model_fetch::default_model_path().expect("default model");
    let mut f = std::fs::File::open(path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
    let template = content.metadata["tokenizer.chat_template"]
        .to_string()
        .unwrap();
    let fixture = Path::new(FIXTURES).join("HuggingFaceTB-SmolLM2-135M-Instruct.jinja");
    assert_eq!(template, &std::fs::read_to_string(fixture).unwrap());
}
