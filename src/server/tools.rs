//! Tool calling for a chat request: what the template is shown, how the
//! reply is read, and what a forced call constrains decoding to.
//!
//! - `none`: the tools still reach the template (as vLLM does), the reply
//!   is read as plain text.
//! - `auto` (the default with tools): the reply is read in the format the
//!   model's chat template teaches ([`ToolFormat::detect`]); a template
//!   with no known format is refused, since its model could not be read.
//! - `required`: decoding is constrained to a JSON list of calls, each a
//!   tool's name and arguments valid against its schema (one call when
//!   `parallel_tool_calls` is false).
//! - a named function: decoding is constrained to its arguments.

use serde_json::{json, Value};

use super::error::ApiError;
use super::protocol::{ChatCompletionRequest, ToolChoice};
use super::unsupported;
use crate::text::tool_parser::{ToolCallParser, ToolFormat};

#[derive(Debug, Clone, PartialEq)]
pub enum ToolMode {
    /// No tools, or `tool_choice: "none"`: the reply is text.
    Off,
    Auto(ToolFormat),
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
    /// For forced calls: the JSON schema the reply is constrained to.
    pub schema: Option<Value>,
    /// The call ids the template takes back in the history.
    pub ids: CallIds,
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
            schema: None,
            ids: CallIds::OpenAi,
        }
    }

    /// A reader of one choice's reply, when it may hold calls.
    pub fn parser(&self) -> Option<ToolCallParser> {
        match &self.mode {
            ToolMode::Off => None,
            ToolMode::Auto(format) => Some(ToolCallParser::new(*format)),
            ToolMode::Required => Some(ToolCallParser::new(ToolFormat::JsonList)),
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
    let mut names: Vec<&str> = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        unsupported::refuse(&t.unknown, &format!("tools[{i}]"))?;
        unsupported::refuse(&t.function.unknown, &format!("tools[{i}].function"))?;
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
                Some(&format!("tools[{i}].function.name")),
            ));
        }
        if names.contains(&name) {
            return Err(ApiError::bad_request(
                format!("two tools are named {name:?}"),
                Some(&format!("tools[{i}].function.name")),
            ));
        }
        if let Some(p) = &t.function.parameters {
            if !p.is_object() {
                return Err(ApiError::bad_request(
                    "function parameters must be a JSON schema object",
                    Some(&format!("tools[{i}].function.parameters")),
                ));
            }
        }
        names.push(name);
    }
    let mode = match choice {
        None if tools.is_empty() => ToolMode::Off,
        None => auto(template)?,
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => ToolMode::Off,
            "auto" | "required" if tools.is_empty() => return Err(needs_tools()),
            "auto" => auto(template)?,
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
            if !names.contains(&named.function.name.as_str()) {
                return Err(ApiError::bad_request(
                    format!(
                        "tool_choice names the function {:?}, which is not among the tools",
                        named.function.name
                    ),
                    Some("tool_choice.function.name"),
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
    let schema = match &mode {
        ToolMode::Required => {
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
            Some(list)
        }
        ToolMode::Named(name) => names.iter().position(|n| n == name).map(params),
        _ => None,
    };
    let tools_json = (!tools.is_empty())
        .then(|| serde_json::to_value(tools))
        .transpose()
        .map_err(|e| ApiError::internal(format!("tools: {e}")))?;
    Ok(ToolPlan {
        tools: tools_json,
        mode,
        parallel,
        schema,
        ids: CallIds::for_template(template),
    })
}

fn needs_tools() -> ApiError {
    ApiError::bad_request(
        "tool_choice is only allowed when tools are given",
        Some("tool_choice"),
    )
}

fn auto(template: &str) -> Result<ToolMode, ApiError> {
    ToolFormat::detect(template)
        .map(ToolMode::Auto)
        .ok_or_else(|| {
            ApiError::bad_request(
                "this model's chat template has no tool-call format wick can read, so its \
             calls could not be told from text; set tool_choice to \"required\" or to a \
             named function to have decoding produce a call",
                Some("tool_choice"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let s = p.schema.unwrap();
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
        assert_eq!(p.schema.unwrap()["required"], json!(["city"]));

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
            (json!({"tools": weather()}), "tool_choice"),
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
                json!({"tools": [{"type": "function", "function": {"name": "f"}, "cache": 1}]}),
                "tools[0].cache",
            ),
        ] {
            let e = plan(&request(extra.clone()), "no tool format here").unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
        }
    }
}
