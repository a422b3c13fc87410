//! OpenAI's deprecated function calling, served as the `tools` forms it
//! became: `functions` are tools, `function_call` is `tool_choice` (one
//! call at most, as the old API returned), an assistant turn's
//! `function_call` is a one-call `tool_calls`, and a `function` turn is the
//! `tool` turn answering it. The reply goes back in the old shape
//! (`message.function_call`, `finish_reason: "function_call"`; see
//! `chat.rs`).

use std::borrow::Cow;

use crate::server::error::ApiError;
use crate::server::protocol::{
    ChatCompletionRequest, LegacyFunctionCall, NamedToolChoice, RequestToolCall, ToolChoice,
    ToolDefinition, UnknownFields,
};

/// Whether `req` uses the deprecated forms anywhere.
pub fn is_legacy(req: &ChatCompletionRequest) -> bool {
    req.functions.is_some()
        || req.function_call.is_some()
        || req
            .messages
            .iter()
            .any(|m| m.function_call.is_some() || m.role == "function")
}

/// `req` in the `tools` forms; borrowed when it uses none of the old ones.
pub fn normalize(req: &ChatCompletionRequest) -> Result<Cow<'_, ChatCompletionRequest>, ApiError> {
    if !is_legacy(req) {
        return Ok(Cow::Borrowed(req));
    }
    let both = |old: &str, new: &str| {
        ApiError::bad_request(
            format!("{old} is the deprecated form of {new}: send one of them"),
            Some(old),
        )
    };
    if req.functions.is_some() && req.tools.is_some() {
        return Err(both("functions", "tools"));
    }
    if req.function_call.is_some() && req.tool_choice.is_some() {
        return Err(both("function_call", "tool_choice"));
    }
    if req.function_call.is_some() && req.functions.is_none() {
        return Err(ApiError::bad_request(
            "function_call is only allowed when functions are given",
            Some("function_call"),
        ));
    }
    let mut out = req.clone();
    if let Some(functions) = out.functions.take() {
        out.tools = Some(
            functions
                .into_iter()
                .map(|function| ToolDefinition {
                    kind: "function".into(),
                    function,
                    unknown: UnknownFields::default(),
                })
                .collect(),
        );
        out.parallel_tool_calls = Some(false);
    }
    out.tool_choice = out.function_call.take().map(|c| match c {
        LegacyFunctionCall::Mode(m) => ToolChoice::Mode(m),
        LegacyFunctionCall::Named(function) => ToolChoice::Named(NamedToolChoice {
            kind: "function".into(),
            function,
            unknown: UnknownFields::default(),
        }),
    });
    // Each old call gets an id; the `function` turn after it answers the
    // latest one (nine letters and digits, which every template takes).
    let mut last_id = None;
    for (i, m) in out.messages.iter_mut().enumerate() {
        let at = |f: &str| format!("messages[{i}].{f}");
        if let Some(call) = m.function_call.take() {
            if m.tool_calls.is_some() {
                return Err(ApiError::bad_request(
                    "a message carries tool_calls or its deprecated form function_call, not both",
                    Some(&at("function_call")),
                ));
            }
            let id = format!("call{i:05}");
            m.tool_calls = Some(vec![RequestToolCall {
                id: id.clone(),
                kind: "function".into(),
                function: call,
                unknown: UnknownFields::default(),
            }]);
            last_id = Some(id);
        }
        if m.role == "function" {
            if m.name.is_none() {
                return Err(ApiError::bad_request(
                    "a function message needs the name of the function that answered",
                    Some(&at("name")),
                ));
            }
            let Some(id) = last_id.take() else {
                return Err(ApiError::bad_request(
                    "a function message must follow the assistant turn whose function_call it answers",
                    Some(&at("role")),
                ));
            };
            m.role = "tool".into();
            m.tool_call_id = Some(id);
        }
    }
    Ok(Cow::Owned(out))
}

/// An error about the tools a legacy request became, named by the fields
/// it sent: `tools[i].function.x` is `functions[i].x`, `tool_choice` is
/// `function_call`.
pub fn in_old_terms(mut e: ApiError) -> ApiError {
    let Some(param) = e.param.take() else {
        return e;
    };
    let renamed = match param.strip_prefix("tools[") {
        Some(rest) => match rest.split_once("].function") {
            Some((i, field)) => format!("functions[{i}]{field}"),
            None => format!("functions[{rest}"),
        },
        None => match param.strip_prefix("tool_choice") {
            Some(rest) => format!("function_call{}", rest.replacen(".function", "", 1)),
            None => param,
        },
    };
    e.param = Some(renamed);
    e.message = e
        .message
        .replace("tool_choice", "function_call")
        .replace("tools", "functions");
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn request(body: Value) -> ChatCompletionRequest {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn functions_become_tools_and_their_history_tool_turns() {
        let req = request(json!({
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": null,
                 "function_call": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
                {"role": "function", "name": "get_weather", "content": "rain"},
            ],
            "functions": [{"name": "get_weather", "parameters": {"type": "object"}}],
            "function_call": {"name": "get_weather"},
        }));
        assert!(is_legacy(&req));
        let out = normalize(&req).unwrap().into_owned();
        assert!(out.functions.is_none() && out.function_call.is_none());
        assert_eq!(out.tools.as_ref().unwrap()[0].function.name, "get_weather");
        assert_eq!(out.parallel_tool_calls, Some(false));
        let Some(ToolChoice::Named(named)) = &out.tool_choice else {
            panic!("{:?}", out.tool_choice)
        };
        assert_eq!(named.function.name, "get_weather");
        let call = &out.messages[1].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.function.name, "get_weather");
        assert_eq!(call.id.len(), 9);
        assert_eq!(out.messages[2].role, "tool");
        assert_eq!(out.messages[2].tool_call_id.as_ref(), Some(&call.id));
        // The new forms pass through untouched.
        let plain = request(json!({"messages": [{"role": "user", "content": "hi"}]}));
        assert!(matches!(normalize(&plain).unwrap(), Cow::Borrowed(_)));
    }

    #[test]
    fn tool_errors_speak_of_the_fields_sent() {
        let e = in_old_terms(ApiError::bad_request(
            "tool_choice names the function \"g\", which is not among the tools",
            Some("tool_choice.function.name"),
        ));
        assert_eq!(e.param.as_deref(), Some("function_call.name"));
        assert_eq!(
            e.message,
            "function_call names the function \"g\", which is not among the functions"
        );
        let e = in_old_terms(ApiError::bad_request("x", Some("tools[2].function.name")));
        assert_eq!(e.param.as_deref(), Some("functions[2].name"));
    }

    #[test]
    fn mixed_or_orphaned_forms_name_their_field() {
        let f = json!([{"name": "f"}]);
        let t = json!([{"type": "function", "function": {"name": "f"}}]);
        let user = json!({"role": "user", "content": "hi"});
        for (body, param) in [
            (
                json!({"messages": [user], "functions": f, "tools": t}),
                "functions",
            ),
            (
                json!({"messages": [user], "functions": f, "function_call": "auto",
                       "tool_choice": "auto"}),
                "function_call",
            ),
            (
                json!({"messages": [user], "function_call": "auto"}),
                "function_call",
            ),
            (
                json!({"messages": [user, {"role": "function", "name": "f", "content": "x"}],
                       "functions": f}),
                "messages[1].role",
            ),
            (
                json!({"messages": [user, {"role": "assistant", "content": null,
                        "function_call": {"name": "f", "arguments": "{}"}},
                       {"role": "function", "content": "x"}], "functions": f}),
                "messages[2].name",
            ),
        ] {
            let e = normalize(&request(body.clone())).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }
}
