//! Tool calling for a chat request: what the template is shown, how the
//! reply is read, and what a forced call constrains decoding to.
//!
//! - `none`: the tools still reach the template (as vLLM does), the reply
//!   is read as plain text.
//! - `auto` (the default with tools): the reply is read in the format the
//!   model's chat template teaches ([`ToolFormat::detect`]), or as harmony
//!   (gpt-oss). A template
//!   with no known format gets wick's generic one, as llama.cpp does: the
//!   tools are described in a system message ([`generic_conversation`]),
//!   and decoding is constrained to either a JSON list of calls (as for
//!   `required`) or plain text.
//! - `required`: decoding is constrained to a JSON list of calls, each a
//!   tool's name and arguments valid against its schema (one call when
//!   `parallel_tool_calls` is false).
//! - a named function: decoding is constrained to its arguments.

use std::collections::HashSet;

use serde_json::{json, Value};

use crate::sampling::constraint::{Grammar, HarmonyReply};
use crate::server::error::ApiError;
use crate::server::protocol::{ChatCompletionRequest, ToolChoice};
use crate::server::unsupported;
use crate::text::chat_template::Message;
use crate::text::harmony;
use crate::text::tool_parser::{ToolCallParser, ToolFormat};

/// Most tools one request may give, as at OpenAI.
pub const MAX_TOOLS: usize = 128;

#[derive(Debug, Clone, PartialEq)]
pub enum ToolMode {
    /// No tools, or `tool_choice: "none"`: the reply is text.
    Off,
    Auto(ToolFormat),
    /// `auto` on a template with no tool format: a call list or text.
    Generic,
    /// `auto` on a harmony template (gpt-oss): calls are messages to
    /// `functions.NAME`, read with the rest of the reply by the harmony
    /// parser.
    Harmony,
    Required,
    Named(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    /// The tool definitions as the template receives them.
    pub tools: Option<Value>,
    pub mode: ToolMode,
    /// Whether a reply may hold more than one call.
    pub parallel: bool,
    /// What decoding is constrained to: forced calls, or the generic
    /// format's calls-or-text.
    pub grammar: Option<Grammar>,
    /// The call ids the template takes back in the history.
    pub ids: CallIds,
    /// The request used the deprecated `functions`: the reply is a
    /// `function_call`.
    pub legacy: bool,
    /// The template speaks harmony (gpt-oss).
    pub harmony: bool,
    /// The tools' names and parameter schemas.
    pub functions: Vec<(String, Value)>,
}

/// How call ids look. Mistral's templates refuse any id that is not 9
/// letters and digits (vLLM issues those for Mistral); others take
/// OpenAI's `call_` and 24 characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallIds {
    OpenAi,
    Mistral,
}

impl CallIds {
    /// The ids `template` takes, by the tool-call format it teaches.
    pub fn for_template(template: &str) -> Self {
        match ToolFormat::detect(template) {
            Some(ToolFormat::MistralJson | ToolFormat::MistralArgs) => CallIds::Mistral,
            _ => CallIds::OpenAi,
        }
    }

    /// A fresh id.
    pub fn issue(self) -> String {
        use rand::distr::{Alphanumeric, SampleString};
        match self {
            CallIds::OpenAi => {
                format!("call_{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
            }
            CallIds::Mistral => Alphanumeric.sample_string(&mut rand::rng(), 9),
        }
    }
}

impl ToolPlan {
    pub fn none() -> Self {
        ToolPlan {
            tools: None,
            mode: ToolMode::Off,
            parallel: true,
            grammar: None,
            ids: CallIds::OpenAi,
            legacy: false,
            harmony: false,
            functions: Vec::new(),
        }
    }

    /// What the reply is constrained to when the request also sets
    /// `response_format` (`format`, its field `format_name`): the JSON it
    /// asks for, or, where tools are offered with `auto`, a call or that
    /// JSON (the generic format's call list or answer, harmony's call or
    /// final message). A forced call (`required`, named) already decides
    /// the reply, so the two are refused together. The grammar comes with
    /// the field to blame for it.
    pub fn grammar_with<'a>(
        &self,
        format: Option<Grammar>,
        format_name: &'a str,
    ) -> Result<Option<(Grammar, &'a str)>, ApiError> {
        let Some(format) = format else {
            return Ok(self.grammar.clone().map(|g| (g, "tool_choice")));
        };
        let answer = format.answer_schema();
        let combined = match (&self.grammar, answer) {
            (Some(Grammar::JsonOrText(calls)), Some(answer)) => {
                Grammar::CallsOrJson(calls.clone(), answer)
            }
            (Some(_), _) => {
                return Err(ApiError::bad_request(
                    format!(
                    "{format_name} cannot be combined with tool_choice: both constrain the output"
                ),
                    Some(format_name),
                ))
            }
            (None, Some(answer)) if self.harmony => Grammar::Harmony(HarmonyReply {
                answer: Some(answer),
                calls: match self.mode {
                    ToolMode::Harmony => self.functions.clone(),
                    _ => Vec::new(),
                },
            }),
            (None, _) => format,
        };
        Ok(Some((combined, format_name)))
    }

    /// A reader of one choice's reply, when it may hold calls.
    pub fn parser(&self) -> Option<ToolCallParser> {
        match &self.mode {
            ToolMode::Off | ToolMode::Harmony => None,
            ToolMode::Auto(format) => Some(ToolCallParser::new(*format)),
            ToolMode::Generic | ToolMode::Required => {
                Some(ToolCallParser::new(ToolFormat::JsonList))
            }
            ToolMode::Named(name) => Some(ToolCallParser::named(name)),
        }
    }
}

/// Checks a chat request's `tools`, `tool_choice` and
/// `parallel_tool_calls`, and decides how its reply is produced and read.
pub fn plan(req: &ChatCompletionRequest, template: &str) -> Result<ToolPlan, ApiError> {
    let tools = req.tools.as_deref().unwrap_or_default();
    let parallel = req.parallel_tool_calls.unwrap_or(true);
    let choice = req.tool_choice.as_ref();
    if req.tools.is_some() && tools.is_empty() {
        return Err(ApiError::bad_request(
            "tools must list at least one function (leave it out for none)",
            Some("tools"),
        ));
    }
    check_count(tools.len())?;
    let mut names: Vec<&str> = Vec::with_capacity(tools.len());
    let mut seen = HashSet::with_capacity(tools.len());
    let (function, parameters) = (req.names.tool_function, req.names.tool_parameters);
    for (i, t) in tools.iter().enumerate() {
        unsupported::refuse(&t.unknown, &format!("tools[{i}]"))?;
        unsupported::refuse(&t.function.unknown, &format!("tools[{i}]{function}"))?;
        if t.kind != "function" {
            return Err(ApiError::bad_request(
                format!("tool type must be \"function\", got {:?}", t.kind),
                Some(&format!("tools[{i}].type")),
            ));
        }
        let name = t.function.name.as_str();
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(ApiError::bad_request(
                format!(
                    "function names must be 1 to 64 letters, digits, underscores or dashes, \
                     got {name:?}"
                ),
                Some(&format!("tools[{i}]{function}.name")),
            ));
        }
        if !seen.insert(name) {
            return Err(ApiError::bad_request(
                format!("two tools are named {name:?}"),
                Some(&format!("tools[{i}]{function}.name")),
            ));
        }
        if let Some(p) = &t.function.parameters {
            if !p.is_object() {
                return Err(ApiError::bad_request(
                    "function parameters must be a JSON schema object",
                    Some(&format!("tools[{i}]{parameters}")),
                ));
            }
        }
        names.push(name);
    }
    let mode = match choice {
        None if tools.is_empty() => ToolMode::Off,
        None => auto(template),
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => ToolMode::Off,
            "auto" | "required" if tools.is_empty() => return Err(needs_tools()),
            "auto" => auto(template),
            "required" => ToolMode::Required,
            other => {
                return Err(ApiError::bad_request(
                    format!(
                        "tool_choice must be \"none\", \"auto\", \"required\" or a named \
                         function, got {other:?}"
                    ),
                    Some("tool_choice"),
                ))
            }
        },
        Some(ToolChoice::Named(named)) => {
            unsupported::refuse(&named.unknown, "tool_choice")?;
            unsupported::refuse(&named.function.unknown, "tool_choice.function")?;
            if named.kind != "function" {
                return Err(ApiError::bad_request(
                    format!(
                        "tool_choice type must be \"function\", got {:?}",
                        named.kind
                    ),
                    Some("tool_choice.type"),
                ));
            }
            if tools.is_empty() {
                return Err(needs_tools());
            }
            if !seen.contains(named.function.name.as_str()) {
                return Err(ApiError::bad_request(
                    format!(
                        "tool_choice names the function {:?}, which is not among the tools",
                        named.function.name
                    ),
                    Some(req.names.tool_choice_name),
                ));
            }
            ToolMode::Named(named.function.name.clone())
        }
    };
    let params = |i: usize| {
        tools[i]
            .function
            .parameters
            .clone()
            .unwrap_or_else(|| json!({"type": "object"}))
    };
    let calls = || {
        let calls: Vec<Value> = (0..tools.len())
            .map(|i| {
                json!({
                    "type": "object",
                    "properties": {
                        "name": {"const": names[i]},
                        "parameters": params(i),
                    },
                    "required": ["name", "parameters"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let mut list = json!({"type": "array", "minItems": 1, "items": {"anyOf": calls}});
        if !parallel {
            list["maxItems"] = json!(1);
        }
        list
    };
    // gpt-oss writes a call as a harmony message, after its analysis if it
    // has one: the grammar keeps that form, and the harmony parser reads it.
    let harmony = harmony::template_speaks_harmony(template);
    let functions: Vec<(String, Value)> = (0..tools.len())
        .map(|i| (names[i].to_string(), params(i)))
        .collect();
    let harmony_call = |calls: Vec<(String, Value)>| {
        Some(Grammar::Harmony(HarmonyReply {
            answer: None,
            calls,
        }))
    };
    let grammar = match &mode {
        ToolMode::Required if harmony => harmony_call(functions.clone()),
        ToolMode::Named(name) if harmony => harmony_call(
            functions
                .iter()
                .filter(|(n, _)| n == name)
                .cloned()
                .collect(),
        ),
        ToolMode::Required => Some(Grammar::JsonSchema(calls())),
        ToolMode::Generic => Some(Grammar::JsonOrText(calls())),
        ToolMode::Named(name) => names
            .iter()
            .position(|n| n == name)
            .map(|i| Grammar::JsonSchema(params(i))),
        _ => None,
    };
    let mode = match mode {
        ToolMode::Required | ToolMode::Named(_) if harmony => ToolMode::Harmony,
        other => other,
    };
    let tools_json = (!tools.is_empty())
        .then(|| serde_json::to_value(tools))
        .transpose()
        .map_err(|e| ApiError::internal(format!("tools: {e}")))?;
    Ok(ToolPlan {
        tools: tools_json,
        mode,
        parallel,
        grammar,
        ids: CallIds::for_template(template),
        legacy: false,
        harmony,
        functions,
    })
}

/// Refuses more than [`MAX_TOOLS`] tools, before any of them is read.
pub fn check_count(tools: usize) -> Result<(), ApiError> {
    if tools > MAX_TOOLS {
        return Err(ApiError::bad_request(
            format!("tools may list at most {MAX_TOOLS} functions, got {tools}"),
            Some("tools"),
        ));
    }
    Ok(())
}

fn needs_tools() -> ApiError {
    ApiError::bad_request(
        "tool_choice is only allowed when tools are given",
        Some("tool_choice"),
    )
}

fn auto(template: &str) -> ToolMode {
    if harmony::template_speaks_harmony(template) {
        return ToolMode::Harmony;
    }
    ToolFormat::detect(template).map_or(ToolMode::Generic, ToolMode::Auto)
}

/// `messages` for a template with no tool format, in the generic one: the
/// tools and how to call them in a system message (the first one's text
/// goes after them), past calls as the JSON lists the model would have
/// written, and each run of tool results as one user turn, so templates
/// that know only system, user and assistant turns (and alternation) take
/// the conversation.
pub fn generic_conversation(messages: Vec<Message>, tools: &Value, parallel: bool) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    let mut rest = messages.into_iter().peekable();
    let mut system = generic_instructions(tools, parallel);
    if let Some(first) = rest.next_if(|m| m.role == "system") {
        system = format!("{system}\n\n{}", first.content.unwrap_or_default());
    }
    out.push(Message::text("system", system));
    // Whether the last turn is tool results, which the next one joins.
    let mut joining = false;
    for m in rest {
        match m.role.as_str() {
            "assistant" if m.tool_calls.is_some() => {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .flatten()
                    .map(|c| json!({"name": c.function.name, "parameters": as_object(&c.function.arguments)}))
                    .collect();
                let text = Value::Array(calls).to_string();
                let content = match m.content.as_deref().filter(|c| !c.is_empty()) {
                    Some(c) => format!("{c}\n{text}"),
                    None => text,
                };
                out.push(Message {
                    tool_calls: None,
                    ..Message::text("assistant", content)
                });
            }
            "tool" => {
                let label = m
                    .name
                    .as_deref()
                    .or(m.tool_call_id.as_deref())
                    .unwrap_or("tool");
                let result = format!("Result of {label}: {}", m.content.unwrap_or_default());
                match out.last_mut().filter(|_| joining) {
                    Some(prev) => {
                        let text = prev.content.get_or_insert_with(String::new);
                        text.push('\n');
                        text.push_str(&result);
                    }
                    None => out.push(Message::text("user", result)),
                }
                joining = true;
                continue;
            }
            _ => out.push(m),
        }
        joining = false;
    }
    out
}

/// Arguments as an object: OpenAI's wire format sends them as a JSON string.
fn as_object(args: &Value) -> Value {
    match args {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| args.clone()),
        other => other.clone(),
    }
}

/// The system text that teaches the generic format.
fn generic_instructions(tools: &Value, parallel: bool) -> String {
    let list: Vec<String> = tools
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let f = &t["function"];
            let mut line = format!("- {}", f["name"].as_str().unwrap_or_default());
            if let Some(d) = f["description"].as_str() {
                line.push_str(&format!(": {d}"));
            }
            let params = f
                .get("parameters")
                .cloned()
                .unwrap_or(json!({"type": "object"}));
            line.push_str(&format!("\n  parameters (JSON schema): {params}"));
            line
        })
        .collect();
    let many = match parallel {
        true => "one or more calls",
        false => "exactly one call",
    };
    format!(
        "You can call these tools:\n{}\n\nTo call tools, reply with only a JSON list of {many}, \
         each {{\"name\": <tool name>, \"parameters\": <arguments object>}}, for example \
         [{{\"name\": \"tool_name\", \"parameters\": {{}}}}]. Tool results come back in \
         the next message. Otherwise, reply to the user in plain text.",
        list.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::chat_template::{FunctionCall, ToolCall};
    use crate::text::tool_parser::ParsedReply;

    fn request(extra: Value) -> ChatCompletionRequest {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(body).unwrap()
    }

    fn weather() -> Value {
        json!([{"type": "function", "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}},
               {"type": "function", "function": {"name": "now"}}])
    }

    const HERMES: &str = "{{ '<tool_call>' }}";

    #[test]
    fn modes_and_schemas() {
        let p = plan(&request(json!({"tools": weather()})), HERMES).unwrap();
        assert_eq!(p.mode, ToolMode::Auto(ToolFormat::Hermes));
        assert_eq!(p.tools.unwrap()[1]["function"], json!({"name": "now"}));

        let p = plan(
            &request(json!({"tools": weather(), "tool_choice": "required",
                            "parallel_tool_calls": false})),
            "",
        )
        .unwrap();
        let Some(Grammar::JsonSchema(s)) = p.grammar else {
            panic!("{:?}", p.grammar)
        };
        assert_eq!(
            (s["minItems"].clone(), s["maxItems"].clone()),
            (json!(1), json!(1))
        );
        assert_eq!(
            s["items"]["anyOf"][1]["properties"]["name"],
            json!({"const": "now"})
        );
        assert_eq!(
            s["items"]["anyOf"][1]["properties"]["parameters"],
            json!({"type": "object"})
        );

        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let p = plan(
            &request(json!({"tools": weather(), "tool_choice": named})),
            "",
        )
        .unwrap();
        assert_eq!(p.mode, ToolMode::Named("get_weather".into()));
        let Some(Grammar::JsonSchema(s)) = p.grammar else {
            panic!("{:?}", p.grammar)
        };
        assert_eq!(s["required"], json!(["city"]));

        let p = plan(
            &request(json!({"tools": weather(), "tool_choice": "none"})),
            "",
        )
        .unwrap();
        assert_eq!((p.mode, p.tools.is_some()), (ToolMode::Off, true));
        assert_eq!(plan(&request(json!({})), "").unwrap(), ToolPlan::none());
    }

    #[test]
    fn bad_tool_requests_name_their_field() {
        let named = |n: &str| json!({"type": "function", "function": {"name": n}});
        for (extra, param) in [
            (json!({"tools": []}), "tools"),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": weather(), "tool_choice": "sometimes"}),
                "tool_choice",
            ),
            (
                json!({"tools": weather(), "tool_choice": named("nope")}),
                "tool_choice.function.name",
            ),
            (
                json!({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}),
                "tools[0].type",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f"}},
                                 {"type": "function", "function": {"name": "f"}}]}),
                "tools[1].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": (0..=MAX_TOOLS)
                    .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
                    .collect::<Vec<_>>()}),
                "tools",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f"}, "cache": 1}]}),
                "tools[0].cache",
            ),
        ] {
            let e = plan(&request(extra.clone()), "no tool format here").unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
        }
    }

    /// `auto` on a harmony template (gpt-oss): its calls are read with the
    /// rest of the reply, by the harmony parser, and nothing constrains them.
    #[test]
    fn auto_on_a_harmony_template() {
        let template = "<|start|>assistant<|channel|>final<|message|>";
        for extra in [
            json!({"tools": weather()}),
            json!({"tools": weather(), "tool_choice": "auto"}),
        ] {
            let p = plan(&request(extra), template).unwrap();
            assert_eq!(
                (p.mode.clone(), p.grammar.clone()),
                (ToolMode::Harmony, None)
            );
            assert!(p.parser().is_none());
            assert_eq!(p.ids, CallIds::OpenAi);
        }
    }

    /// `required` or a named function on a harmony template: one call, in
    /// a harmony message the grammar lays out, read by the harmony parser.
    #[test]
    fn forced_calls_on_a_harmony_template() {
        let template = "<|start|>assistant<|channel|>final<|message|>";
        let tools = json!([
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "g"}},
        ]);
        for (choice, fns) in [
            (json!("required"), vec!["f", "g"]),
            (
                json!({"type": "function", "function": {"name": "g"}}),
                vec!["g"],
            ),
        ] {
            let p = plan(
                &request(json!({"tools": tools, "tool_choice": choice})),
                template,
            )
            .unwrap();
            assert_eq!(p.mode, ToolMode::Harmony);
            assert!(p.parser().is_none());
            let Some(Grammar::Harmony(HarmonyReply {
                answer: None,
                calls: got,
            })) = p.grammar
            else {
                panic!("{choice}: {:?}", p.grammar);
            };
            let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, fns, "{choice}");
            assert!(got.iter().all(|(_, s)| s == &json!({"type": "object"})));
        }
    }

    /// `auto` on a template with no tool format: the generic format, its
    /// grammar the required list's, the reply read as a list or as text.
    #[test]
    fn auto_without_a_template_format_is_generic() {
        let required = plan(
            &request(json!({"tools": weather(), "tool_choice": "required"})),
            "",
        )
        .unwrap();
        for extra in [
            json!({"tools": weather()}),
            json!({"tools": weather(), "tool_choice": "auto"}),
        ] {
            let p = plan(&request(extra), "no tool format here").unwrap();
            assert_eq!(p.mode, ToolMode::Generic);
            assert_eq!(
                p.grammar,
                required.grammar.clone().map(|g| match g {
                    Grammar::JsonSchema(s) => Grammar::JsonOrText(s),
                    other => other,
                })
            );
            let reply = |text: &str| {
                let mut parser = p.parser().unwrap();
                let mut events = parser.push(text);
                events.extend(parser.finish());
                ParsedReply::from_events(events)
            };
            let call = reply(r#"[{"name": "now", "parameters": {}}]"#);
            assert_eq!(call.calls, vec![("now".to_string(), "{}".to_string())]);
            assert!(call.content.is_empty());
            let text = reply("It is sunny.");
            assert!(text.calls.is_empty());
            assert_eq!(text.content, "It is sunny.");
        }
    }

    /// The generic conversation: tools first in the system turn, a call
    /// turned into the list the model writes, a run of results one user
    /// turn.
    #[test]
    fn generic_conversation_speaks_system_user_assistant() {
        let call = |id: &str, args: Value| ToolCall {
            id: Some(id.into()),
            kind: "function".into(),
            function: FunctionCall {
                name: "get_weather".into(),
                arguments: args,
            },
        };
        let tool = |id: &str, content: &str| Message {
            tool_call_id: Some(id.into()),
            ..Message::text("tool", content.into())
        };
        let messages = vec![
            Message::text("system", "Be brief.".into()),
            Message::text("user", "Weather in Oslo and Rome?".into()),
            Message {
                content: None,
                tool_calls: Some(vec![
                    call("a", json!({"city": "Oslo"})),
                    call("b", json!("{\"city\": \"Rome\"}")),
                ]),
                ..Message::text("assistant", String::new())
            },
            tool("a", "rain"),
            tool("b", "sun"),
            Message::text("user", "Thanks".into()),
        ];
        let tools = plan(&request(json!({"tools": weather()})), "")
            .unwrap()
            .tools
            .unwrap();
        let out = generic_conversation(messages, &tools, true);
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user", "user"]);
        let system = out[0].content.as_deref().unwrap();
        assert!(
            system.contains("- get_weather") && system.contains("\"city\""),
            "{system}"
        );
        assert!(system.ends_with("\n\nBe brief."), "{system}");
        let calls: Value = serde_json::from_str(out[2].content.as_deref().unwrap()).unwrap();
        assert_eq!(
            calls,
            json!([{"name": "get_weather", "parameters": {"city": "Oslo"}},
                   {"name": "get_weather", "parameters": {"city": "Rome"}}])
        );
        assert!(out[2].tool_calls.is_none());
        assert_eq!(
            out[3].content.as_deref(),
            Some("Result of a: rain\nResult of b: sun")
        );
        assert!(out.iter().all(|m| m.tool_call_id.is_none()));
    }
}
