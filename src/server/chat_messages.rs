//! A chat request's messages to the conversation its template renders, as
//! vLLM hands OpenAI-shaped messages to transformers' `apply_chat_template`:
//! `developer` turns become `system` (templates know no other), text parts
//! are joined by newlines, an assistant's tool calls keep their ids and get
//! their `arguments` as an object (templates such as Llama 3.1's write
//! `arguments | tojson`, which would quote OpenAI's JSON string), and tool
//! results keep `tool_call_id`. What OpenAI's API refuses (a turn with
//! neither content nor tool calls, a tool result answering no call) is
//! refused here too, naming the field.

use crate::server::error::ApiError;
use crate::server::images::ImageRef;
use crate::server::protocol::{
    ChatRequestMessage, ContentPart, FunctionArguments, MessageContent, RequestToolCall,
};
use crate::server::unsupported;
use crate::text::chat_template::{FunctionCall, Message, Part, ToolCall};

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// `name` is what the client calls the messages. Returns the turns, and
/// the images of their image parts in order.
pub fn conversation(
    messages: &[ChatRequestMessage],
    name: &str,
) -> Result<(Vec<Message>, Vec<ImageRef>), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "messages must not be empty",
            Some(name),
        ));
    }
    let mut images = Vec::new();
    let turns = messages
        .iter()
        .enumerate()
        .map(|(i, m)| match &m.origin {
            Some(origin) => message(m, origin, &mut images),
            None => message(m, &format!("messages[{i}]"), &mut images),
        })
        .collect::<Result<_, _>>()?;
    Ok((turns, images))
}

fn message(
    m: &ChatRequestMessage,
    at: &str,
    images: &mut Vec<ImageRef>,
) -> Result<Message, ApiError> {
    unsupported::refuse(&m.unknown, at)?;
    let field = |name: &str| format!("{at}.{name}");
    let role = match m.role.as_str() {
        "developer" => "system",
        r if ROLES.contains(&r) => r,
        other => {
            return Err(ApiError::bad_request(
                format!(
                    "unsupported role {other:?}: must be one of {}",
                    ROLES.join(", ")
                ),
                Some(&field("role")),
            ))
        }
    };
    if m.tool_calls.is_some() && role != "assistant" {
        return Err(ApiError::bad_request(
            "only assistant messages carry tool_calls",
            Some(&field("tool_calls")),
        ));
    }
    if m.annotations.is_some() && role != "assistant" {
        return Err(ApiError::bad_request(
            "only assistant messages carry annotations",
            Some(&field("annotations")),
        ));
    }
    if m.reasoning_content.is_some() && role != "assistant" {
        return Err(ApiError::bad_request(
            "only assistant messages carry reasoning_content",
            Some(&field("reasoning_content")),
        ));
    }
    if m.tool_calls.as_ref().is_some_and(Vec::is_empty) {
        return Err(ApiError::bad_request(
            "tool_calls must not be empty: leave it out when no tool is called",
            Some(&field("tool_calls")),
        ));
    }
    match (role, &m.tool_call_id) {
        ("tool", None) => {
            return Err(ApiError::bad_request(
                "a tool message needs the tool_call_id of the call it answers",
                Some(&field("tool_call_id")),
            ))
        }
        ("tool", Some(_)) | (_, None) => {}
        (_, Some(_)) => {
            return Err(ApiError::bad_request(
                "only tool messages carry tool_call_id",
                Some(&field("tool_call_id")),
            ))
        }
    }
    let had = images.len();
    let (content, parts) = match &m.content {
        Some(c) if role == "user" => {
            let (text, parts) = user_content(c, &field("content"), images)?;
            (Some(text), parts)
        }
        Some(c) => (Some(text(c, &field("content"))?), None),
        None => (None, None),
    };
    debug_assert!(parts.is_some() || images.len() == had);
    if content.is_none() && m.tool_calls.is_none() {
        let needs = match role {
            "assistant" => "content or tool_calls",
            _ => "content",
        };
        return Err(ApiError::bad_request(
            format!("a {} message needs {needs}", m.role),
            Some(&field("content")),
        ));
    }
    let tool_calls = m
        .tool_calls
        .as_ref()
        .map(|calls| {
            calls
                .iter()
                .enumerate()
                .map(|(j, c)| tool_call(c, &field(&format!("tool_calls[{j}]"))))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    Ok(Message {
        role: role.to_string(),
        content,
        reasoning_content: m.reasoning_content.clone(),
        tool_calls,
        tool_call_id: m.tool_call_id.clone(),
        name: m.name.clone(),
        parts,
    })
}

/// A conversation for a harmony template (gpt-oss), as it can render it.
/// An assistant turn that thought and then called tools keeps its
/// thinking and drops its content, as llama.cpp hands it over: the
/// template writes that thinking before the call (until an answer
/// follows), and refuses a turn with both. A turn with several calls
/// becomes one turn per call, each followed by its results (matched by
/// `tool_call_id`; unmatched ones after the last call): the template
/// renders only a turn's first call, and names each result after the call
/// before it.
pub fn harmony_conversation(messages: Vec<Message>) -> Vec<Message> {
    let mut out = Vec::with_capacity(messages.len());
    let mut rest = messages.into_iter().peekable();
    while let Some(mut m) = rest.next() {
        if m.reasoning_content.is_some() && m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) {
            m.content = None;
        }
        let calls = match m.tool_calls.take() {
            Some(calls) if calls.len() > 1 => calls,
            calls => {
                out.push(Message {
                    tool_calls: calls,
                    ..m
                });
                continue;
            }
        };
        let mut results = Vec::new();
        while let Some(r) = rest.next_if(|r| r.role == "tool") {
            results.push(r);
        }
        for (i, call) in calls.into_iter().enumerate() {
            let turn = match i {
                0 => m.clone(),
                _ => Message {
                    content: None,
                    reasoning_content: None,
                    ..m.clone()
                },
            };
            let id = call.id.clone();
            out.push(Message {
                tool_calls: Some(vec![call]),
                ..turn
            });
            let (answers, others): (Vec<_>, Vec<_>) = results
                .into_iter()
                .partition(|r: &Message| id.is_some() && r.tool_call_id == id);
            out.extend(answers);
            results = others;
        }
        out.extend(results);
    }
    out
}

/// The conversation with `""` as the content of turns that have none (an
/// assistant turn that only calls tools), as vLLM hands them over: for
/// templates that add every turn's content, which transformers' absent
/// content breaks. `None` when every turn has content.
pub fn with_empty_content(messages: &[Message]) -> Option<Vec<Message>> {
    messages.iter().any(|m| m.content.is_none()).then(|| {
        messages
            .iter()
            .map(|m| Message {
                content: Some(m.content.clone().unwrap_or_default()),
                ..m.clone()
            })
            .collect()
    })
}

/// A user turn's content: its text, and where it has image parts, its
/// parts in order (the images added to `images`), as a multimodal turn
/// reaches transformers' templates.
fn user_content(
    content: &MessageContent,
    at: &str,
    images: &mut Vec<ImageRef>,
) -> Result<(String, Option<Vec<Part>>), ApiError> {
    let MessageContent::Parts(list) = content else {
        return Ok((text(content, at)?, None));
    };
    if list.iter().all(|p| p.kind != "image_url") {
        return Ok((text(content, at)?, None));
    }
    let mut parts = Vec::with_capacity(list.len());
    for (j, part) in list.iter().enumerate() {
        let at = format!("{at}[{j}]");
        match (part.kind.as_str(), &part.image_url) {
            ("image_url", Some(image)) => {
                unsupported::refuse(&part.unknown, &at)?;
                unsupported::refuse(&image.unknown, &format!("{at}.image_url"))?;
                if let Some(detail) = image
                    .detail
                    .as_deref()
                    .filter(|&d| d != "auto" && d != "high")
                {
                    return Err(ApiError::bad_request(
                        format!(
                            "detail {detail:?} is not supported: the model sees each image at \
                             its own resolution (\"auto\" or \"high\")"
                        ),
                        Some(&format!("{at}.image_url.detail")),
                    ));
                }
                images.push(ImageRef {
                    url: image.url.clone(),
                    part: at.clone(),
                });
                parts.push(Part::Image);
            }
            ("image_url", None) => {
                return Err(ApiError::bad_request(
                    "an image_url content part needs `image_url`",
                    Some(&format!("{at}.image_url")),
                ))
            }
            _ => parts.push(Part::Text {
                text: text_part(part, &at)?.to_string(),
            }),
        }
    }
    let text = parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } => Some(text.as_str()),
            Part::Image => None,
        })
        .collect::<Vec<_>>()
        .join("\n");
    Ok((text, Some(parts)))
}

/// The text of a message: its text parts joined by newlines (as vLLM joins
/// them); other kinds of part are not served.
pub(crate) fn text(content: &MessageContent, at: &str) -> Result<String, ApiError> {
    let parts = match content {
        MessageContent::Text(t) => return Ok(t.clone()),
        MessageContent::Parts(parts) => parts,
    };
    parts
        .iter()
        .enumerate()
        .map(|(j, part)| text_part(part, &format!("{at}[{j}]")))
        .collect::<Result<Vec<_>, _>>()
        .map(|texts| texts.join("\n"))
}

/// A text part's text; an image part where none is taken, or another
/// kind, is refused.
fn text_part<'a>(part: &'a ContentPart, at: &str) -> Result<&'a str, ApiError> {
    match (part.kind.as_str(), &part.text) {
        ("text", Some(t)) => {
            unsupported::refuse(&part.unknown, at)?;
            if part.image_url.is_some() {
                return Err(ApiError::bad_request(
                    "a text content part has no `image_url`",
                    Some(&format!("{at}.image_url")),
                ));
            }
            Ok(t.as_str())
        }
        ("text", None) => Err(ApiError::bad_request(
            "a text content part needs `text`",
            Some(&format!("{at}.text")),
        )),
        ("image_url", _) => Err(ApiError::bad_request(
            "content part type \"image_url\" is only taken in user messages",
            Some(&format!("{at}.type")),
        )),
        (kind, _) => Err(ApiError::bad_request(
            format!("content part type {kind:?} is not supported: only \"text\" and \"image_url\""),
            Some(&format!("{at}.type")),
        )),
    }
}

fn tool_call(c: &RequestToolCall, at: &str) -> Result<ToolCall, ApiError> {
    unsupported::refuse(&c.unknown, at)?;
    unsupported::refuse(&c.function.unknown, &format!("{at}.function"))?;
    if c.kind != "function" {
        return Err(ApiError::bad_request(
            format!(
                "tool call type {:?} is not supported: only \"function\"",
                c.kind
            ),
            Some(&format!("{at}.type")),
        ));
    }
    Ok(ToolCall {
        id: Some(c.id.clone()),
        kind: c.kind.clone(),
        function: FunctionCall {
            name: c.function.name.clone(),
            arguments: arguments(&c.function.arguments),
        },
    })
}

/// The arguments as templates expect them: OpenAI's JSON string parsed
/// into its object, empty meaning no arguments (both as vLLM does). A
/// string that is not a JSON object stays a string: the template shows
/// what the model wrote.
fn arguments(args: &FunctionArguments) -> serde_json::Value {
    use serde_json::Value;
    match args {
        FunctionArguments::Object(map) => Value::Object(map.clone()),
        FunctionArguments::Json(s) if s.trim().is_empty() => Value::Object(Default::default()),
        FunctionArguments::Json(s) => match serde_json::from_str::<Value>(s) {
            Ok(object @ Value::Object(_)) => object,
            _ => Value::String(s.clone()),
        },
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;
    use serde_json::{json, Value};

    use super::*;
    use crate::text::chat_template::ChatTemplate;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates");

    fn convert(messages: Value) -> Result<Vec<Message>, ApiError> {
        let turns = serde_json::from_value::<Vec<ChatRequestMessage>>(messages).unwrap();
        conversation(&turns, "messages").map(|(turns, _)| turns)
    }

    #[track_caller]
    fn refused(messages: Value, param: &str) -> String {
        let e = convert(messages).expect_err("should be refused");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        e.message
    }

    /// Each `arguments` in a conversation, rewritten by `f`.
    fn map_arguments(mut messages: Value, f: impl Fn(&Value) -> Value) -> Value {
        for m in messages.as_array_mut().unwrap() {
            for call in m["tool_calls"].as_array_mut().into_iter().flatten() {
                let args = &mut call["function"]["arguments"];
                *args = f(args);
            }
        }
        messages
    }

    /// Every conversation of the template fixtures, sent as OpenAI sends it
    /// (arguments as JSON strings), reaches the template exactly as the
    /// fixtures hand it to transformers (arguments as objects), which
    /// `tests/chat_templates.rs` renders against Jinja2.
    #[test]
    fn openai_wire_messages_become_the_fixture_conversations() {
        let text = std::fs::read_to_string(format!("{FIXTURES}/expected.json")).unwrap();
        let expected: Value = serde_json::from_str(&text).unwrap();
        let cases = expected["cases"].as_object().unwrap();
        for (name, case) in cases {
            let fixture = case["messages"].clone();
            let wire = map_arguments(fixture.clone(), |a| match a {
                Value::String(_) => a.clone(),
                object => Value::String(object.to_string()),
            });
            let want = map_arguments(fixture, |a| match a {
                Value::String(s) => serde_json::from_str(s).unwrap(),
                object => object.clone(),
            });
            let want: Vec<Message> = serde_json::from_value(want).unwrap();
            assert_eq!(convert(wire).unwrap(), want, "case {name}");
        }
    }

    /// gpt-oss's template takes a turn's thinking or its content before a
    /// call, not both: a turn that thought, said something and called a
    /// tool is rendered with its thinking alone, as llama.cpp renders it.
    #[test]
    fn harmony_turns_that_thought_and_called_keep_the_thought() {
        let text = std::fs::read_to_string(format!("{FIXTURES}/expected.json")).unwrap();
        let expected: Value = serde_json::from_str(&text).unwrap();
        let case = &expected["cases"]["thinking_before_a_call"];
        let want = expected["renders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| {
                r["template"] == "openai-gpt-oss-120b.jinja"
                    && r["case"] == "thinking_before_a_call"
            })
            .unwrap()["text"]
            .as_str()
            .unwrap();
        let mut wire = case["messages"].clone();
        wire[2]["content"] = json!("Let me check.");
        let messages = convert(wire).unwrap();
        let source =
            std::fs::read_to_string(format!("{FIXTURES}/openai-gpt-oss-120b.jinja")).unwrap();
        let now: chrono::NaiveDateTime = expected["now"].as_str().unwrap().parse().unwrap();
        let template = ChatTemplate::new(source, "<|startoftext|>".into(), "<|return|>".into())
            .unwrap()
            .with_clock(move || now);
        let tools = Some(&case["tools"]);
        let both = template.render_with_tools(&messages, tools, true);
        assert!(both.is_err(), "{both:?}");
        let got = template.render_with_tools(&harmony_conversation(messages), tools, true);
        assert_eq!(got.unwrap(), want);
    }

    /// Two calls in one turn: gpt-oss's template would render the first
    /// alone and name both results after it; each goes in as its own turn,
    /// followed by its result.
    #[test]
    fn harmony_calls_go_in_one_by_one_with_their_results() {
        let call = |id: &str, name: &str| {
            json!({"id": id, "type": "function",
                   "function": {"name": name, "arguments": "{}"}})
        };
        let messages = convert(json!([
            {"role": "user", "content": "Weather and time?"},
            {"role": "assistant", "reasoning_content": "Both.",
             "tool_calls": [call("a", "get_weather"), call("b", "get_time")]},
            {"role": "tool", "tool_call_id": "b", "content": "09:07"},
            {"role": "tool", "tool_call_id": "a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c", "content": "stray"},
        ]))
        .unwrap();
        let out = harmony_conversation(messages);
        let shape: Vec<(&str, Option<&str>, Option<&str>)> = out
            .iter()
            .map(|m| {
                let called = m.tool_calls.as_ref().map(|c| c[0].function.name.as_str());
                (
                    m.role.as_str(),
                    called.or(m.tool_call_id.as_deref()),
                    m.reasoning_content.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            [
                ("user", None, None),
                ("assistant", Some("get_weather"), Some("Both.")),
                ("tool", Some("a"), None),
                ("assistant", Some("get_time"), None),
                ("tool", Some("b"), None),
                ("tool", Some("c"), None),
            ]
        );
        let source =
            std::fs::read_to_string(format!("{FIXTURES}/openai-gpt-oss-120b.jinja")).unwrap();
        let template = ChatTemplate::new(source, String::new(), String::new()).unwrap();
        let text = template.render_with_tools(&out, None, true).unwrap();
        assert!(
            text.contains("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"sunny\"")
                && text.contains("<|start|>functions.get_time to=assistant<|channel|>commentary<|message|>\"09:07\""),
            "{text}"
        );
    }

    #[test]
    fn parsed_arguments_render_as_an_object() {
        let source =
            std::fs::read_to_string(format!("{FIXTURES}/meta-llama-Llama-3.1-8B-Instruct.jinja"))
                .unwrap();
        let template =
            ChatTemplate::new(source, "<|begin_of_text|>".into(), "<|eot_id|>".into()).unwrap();
        let messages = convert(json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}
        ]))
        .unwrap();
        let text = template.render_with_tools(&messages, None, true).unwrap();
        assert!(
            text.contains(r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#),
            "{text}"
        );
    }

    #[test]
    fn developer_is_system_and_parts_are_joined() {
        let got = convert(json!([
            {"role": "developer", "content": "Be brief.", "name": "ops"},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}
        ]))
        .unwrap();
        let want: Vec<Message> = serde_json::from_value(json!([
            {"role": "system", "content": "Be brief.", "name": "ops"},
            {"role": "user", "content": "Hi\nthere"}
        ]))
        .unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn arguments_as_templates_expect_them() {
        let call = |args: Value| {
            let m = convert(json!([{"role": "assistant", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": args}}
            ]}]))
            .unwrap();
            m[0].tool_calls.as_ref().unwrap()[0]
                .function
                .arguments
                .clone()
        };
        assert_eq!(call(json!("{\"a\": [1]}")), json!({"a": [1]}));
        assert_eq!(call(json!({"a": 1})), json!({"a": 1}));
        assert_eq!(call(json!("")), json!({}));
        assert_eq!(call(json!("  ")), json!({}));
        // Not an object: shown as the model wrote it.
        assert_eq!(call(json!("{\"a\": ")), json!("{\"a\": "));
        assert_eq!(call(json!("[1, 2]")), json!("[1, 2]"));
    }

    #[test]
    fn a_translated_turn_is_named_by_its_origin() {
        let mut turns: Vec<ChatRequestMessage> =
            serde_json::from_value(json!([{"role": "user", "content": "a"}, {"role": "user"}]))
                .unwrap();
        turns[1].origin = Some("input[3]".into());
        let e = conversation(&turns, "messages").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[3].content"));
    }

    #[test]
    fn malformed_turns_are_refused_by_field() {
        refused(json!([]), "messages");
        let m = refused(
            json!([{"role": "critic", "content": "x"}]),
            "messages[0].role",
        );
        assert!(m.contains("developer") && m.contains("tool"), "{m}");
        refused(
            json!([{"role": "user", "content": "a"}, {"role": "assistant"}]),
            "messages[1].content",
        );
        refused(
            json!([{"role": "assistant", "content": null}]),
            "messages[0].content",
        );
        refused(
            json!([{"role": "user", "content": null}]),
            "messages[0].content",
        );
        refused(
            json!([{"role": "assistant", "content": "x", "tool_calls": []}]),
            "messages[0].tool_calls",
        );
        refused(
            json!([{"role": "user", "content": "x", "reasoning_content": "y"}]),
            "messages[0].reasoning_content",
        );
        let call =
            json!([{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]);
        refused(
            json!([{"role": "user", "content": "x", "tool_calls": call}]),
            "messages[0].tool_calls",
        );
        refused(
            json!([{"role": "tool", "content": "x"}]),
            "messages[0].tool_call_id",
        );
        refused(
            json!([{"role": "user", "content": "x", "tool_call_id": "c"}]),
            "messages[0].tool_call_id",
        );
        refused(
            json!([{"role": "assistant", "tool_calls": [
                {"id": "c", "type": "retrieval", "function": {"name": "f", "arguments": "{}"}}
            ]}]),
            "messages[0].tool_calls[0].type",
        );
        let m = refused(
            json!([{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]),
            "messages[0].content[0].type",
        );
        assert!(m.contains("only taken in user messages"), "{m}");
        refused(
            json!([{"role": "user", "content": [{"type": "image_url"}]}]),
            "messages[0].content[0].image_url",
        );
        let m = refused(
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u", "detail": "low"}}]}]),
            "messages[0].content[0].image_url.detail",
        );
        assert!(m.contains("\"low\""), "{m}");
        refused(
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u", "size": 1}}]}]),
            "messages[0].content[0].image_url.size",
        );
        refused(
            json!([{"role": "user", "content": [{"type": "input_audio"}]}]),
            "messages[0].content[0].type",
        );
        refused(
            json!([{"role": "user", "content": [{"type": "text"}]}]),
            "messages[0].content[0].text",
        );
    }
}
