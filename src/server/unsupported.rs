//! No request field is silently ignored. A field wick honours is declared
//! in `protocol` and acted on; harmless metadata (`user`, `store`,
//! `metadata`, `service_tier`) is declared and left unused; anything else
//! lands in its object's `unknown` fields and is refused here with a 400
//! naming it, so a client is never answered a question it did not ask (a
//! `suffix` left out, vLLM's `guided_json` dropped, an image unseen). A
//! null counts as not sent, as it does for declared fields. Fields wick
//! implements for some values only are checked here too.

use crate::server::error::{clip, ApiError, MAX_ECHO_CHARS};
use crate::server::protocol::UnknownFields;

/// Refuses the first field of `unknown` that is set, by its path under
/// `at` (`""` for the body, or `messages[0]`, `stream_options`...).
pub fn refuse(unknown: &UnknownFields, at: &str) -> Result<(), ApiError> {
    let set = unknown.0.iter().find(|(_, value)| !value.is_null());
    match set {
        Some((name, _)) if at.is_empty() => Err(ApiError::unsupported_parameter(name)),
        Some((name, _)) => Err(ApiError::unsupported_parameter(&format!("{at}.{name}"))),
        None => Ok(()),
    }
}

/// `best_of` candidates per returned choice: only `n` (no choice picked
/// over another) is served.
pub fn best_of(best_of: Option<u32>, n: usize) -> Result<(), ApiError> {
    match best_of {
        Some(b) if b as usize != n => Err(ApiError::unsupported_value(
            "best_of",
            format!("best_of must equal n ({n}): wick does not rank candidates, got {b}"),
        )),
        _ => Ok(()),
    }
}

/// Chat `modalities`: text is the only output wick makes.
pub fn modalities(modalities: Option<&[String]>) -> Result<(), ApiError> {
    match modalities.into_iter().flatten().find(|m| *m != "text") {
        Some(other) => Err(ApiError::unsupported_value(
            "modalities",
            format!("modality {other:?} is not supported: wick only outputs \"text\""),
        )),
        None => Ok(()),
    }
}

/// `verbosity`, OpenAI's length hint for GPT-5 replies: no chat template
/// has a variable for it, and wick will not rewrite the prompt to ask
/// for brevity, so it is refused (any value) rather than ignored.
pub fn verbosity(verbosity: Option<&str>) -> Result<(), ApiError> {
    match verbosity {
        None => Ok(()),
        Some(_) => Err(ApiError {
            code: Some("unsupported_parameter".into()),
            ..ApiError::bad_request(
                "Unsupported parameter: 'verbosity' is not supported with this model: no chat \
                 template reads it, so it could not change the reply; leave it out, or ask for \
                 the length you want in the messages.",
                Some("verbosity"),
            )
        }),
    }
}

/// The values OpenAI takes for `reasoning_effort`.
pub const REASONING_EFFORTS: [&str; 7] =
    ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// `reasoning_effort`, one of OpenAI's values, for a chat template that
/// reads it (`template_reads`); for any other it would change nothing, so
/// it is refused as OpenAI refuses it for models that do not reason.
/// `name`: what the client calls `reasoning_effort`.
pub fn reasoning_effort(effort: &str, template_reads: bool, name: &str) -> Result<(), ApiError> {
    if !REASONING_EFFORTS.contains(&effort) {
        return Err(ApiError::bad_request(
            format!(
                "reasoning_effort must be one of {}, got {:?}",
                REASONING_EFFORTS.join(", "),
                clip(effort, MAX_ECHO_CHARS)
            ),
            Some(name),
        ));
    }
    if !template_reads {
        return Err(ApiError {
            code: Some("unsupported_parameter".into()),
            ..ApiError::bad_request(
                "Unsupported parameter: 'reasoning_effort' is not supported with this model: \
                 its chat template has no reasoning effort (it does not read `reasoning_effort`).",
                Some(name),
            )
        });
    }
    Ok(())
}

/// The efforts gpt-oss was trained with: its template writes any value
/// into the prompt, but others would be text the model never saw there.
pub const HARMONY_REASONING_EFFORTS: [&str; 3] = ["low", "medium", "high"];

/// `reasoning_effort`, already one of OpenAI's values, for a harmony
/// template (gpt-oss).
pub fn harmony_reasoning_effort(effort: &str, name: &str) -> Result<(), ApiError> {
    if HARMONY_REASONING_EFFORTS.contains(&effort) {
        return Ok(());
    }
    Err(ApiError::unsupported_value(
        name,
        format!(
            "reasoning_effort must be one of {} for this model (gpt-oss's harmony format), \
             got {effort:?}",
            HARMONY_REASONING_EFFORTS.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn unknown(v: serde_json::Value) -> UnknownFields {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_first_set_field_is_named() {
        let u = unknown(json!({"a": null, "b": 1, "c": 2}));
        let e = refuse(&u, "").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("b"));
        assert_eq!(e.code.as_deref(), Some("unsupported_parameter"));
        assert!(e.message.contains("'b' is not supported"), "{}", e.message);
        let e = refuse(&u, "messages[2]").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[2].b"));
        refuse(&unknown(json!({"a": null})), "").unwrap();
        refuse(&UnknownFields::default(), "").unwrap();
    }

    #[test]
    fn limited_values() {
        best_of(None, 3).unwrap();
        best_of(Some(1), 1).unwrap();
        best_of(Some(2), 2).unwrap();
        let e = best_of(Some(3), 1).unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.code.as_deref()),
            (Some("best_of"), Some("unsupported_value"))
        );
        modalities(None).unwrap();
        modalities(Some(&["text".into()])).unwrap();
        let e = modalities(Some(&["text".into(), "audio".into()])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("modalities"));
        assert!(e.message.contains("audio"), "{}", e.message);
    }

    #[test]
    fn harmony_takes_the_efforts_gpt_oss_knows() {
        for effort in HARMONY_REASONING_EFFORTS {
            harmony_reasoning_effort(effort, "reasoning_effort").unwrap();
        }
        let e = harmony_reasoning_effort("none", "reasoning.effort").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning.effort"));
        assert!(e.message.contains("\"none\""), "{}", e.message);
    }

    #[test]
    fn reasoning_effort_values_and_templates() {
        for effort in REASONING_EFFORTS {
            reasoning_effort(effort, true, "reasoning_effort").unwrap();
        }
        let e = reasoning_effort("extreme", true, "reasoning_effort").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning_effort"));
        assert!(e.message.contains("\"extreme\""), "{}", e.message);
        let e = reasoning_effort("high", false, "reasoning_effort").unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.code.as_deref()),
            (Some("reasoning_effort"), Some("unsupported_parameter"))
        );
        assert!(
            e.message.contains("chat template has no reasoning effort"),
            "{}",
            e.message
        );
    }
}
