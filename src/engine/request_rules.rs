//! The rules a request's prompt must meet, each written once. The server's
//! validation applies them before it accepts a request (to answer with the
//! right field named), and the engine applies them to every request it is
//! handed, whoever the caller; sampling parameters have theirs in
//! [`SamplingParams::validate`](crate::sampling::params::SamplingParams::validate).

use crate::engine::prompt::Prompt;
use crate::error::WickError;
use crate::models::vision::ImageSpec;

/// Every id names a vocabulary entry.
pub fn check_token_ids(ids: &[u32], vocab_size: usize, param: &str) -> Result<(), WickError> {
    match ids.iter().find(|&&id| id as usize >= vocab_size) {
        Some(id) => Err(WickError::invalid(
            format!("{param} token id {id} is out of vocabulary (size {vocab_size})"),
            param.to_string(),
        )),
        None => Ok(()),
    }
}

/// A prompt is not empty and is made of vocabulary ids.
pub fn check_prompt(ids: &[u32], vocab_size: usize) -> Result<(), WickError> {
    if ids.is_empty() {
        return Err(WickError::invalid(
            "prompt must not be empty",
            "prompt".to_string(),
        ));
    }
    check_token_ids(ids, vocab_size, "prompt")
}

/// A prompt's images are what the model takes: each span, in order and
/// apart, covers the model's run of placeholder tokens, and its pixels are
/// the size its processor makes.
pub fn check_media(prompt: &Prompt, spec: Option<&ImageSpec>) -> Result<(), WickError> {
    let invalid = |m: String| Err(WickError::invalid(m, "prompt".to_string()));
    let Some(spec) = spec.filter(|_| !prompt.media.is_empty()) else {
        return match prompt.media.is_empty() {
            true => Ok(()),
            false => invalid("this model takes no images".into()),
        };
    };
    let mut end = 0;
    for m in &prompt.media {
        let tokens = prompt.tokens.get(m.start..m.start + m.len);
        if m.start < end || tokens.is_none_or(|t| t.iter().any(|&t| t != spec.token)) {
            return invalid(format!(
                "an image's span {}..{} is not a run of its placeholder token {}",
                m.start,
                m.start + m.len,
                spec.token
            ));
        }
        if m.len != spec.tokens {
            return invalid(format!(
                "an image takes {} tokens, not {}",
                spec.tokens, m.len
            ));
        }
        let (w, h) = (
            spec.processor.width as usize,
            spec.processor.height as usize,
        );
        let p = &m.pixels;
        if (p.width, p.height) != (w, h) || p.values.len() != 3 * w * h {
            return invalid(format!(
                "an image's pixels must be 3 x {h} x {w}, not {p:?}"
            ));
        }
        end = m.start + m.len;
    }
    Ok(())
}

/// The prompt and the most tokens it may generate fit the model's context.
pub fn check_context(
    prompt_tokens: usize,
    max_tokens: usize,
    max_context: usize,
) -> Result<(), WickError> {
    if prompt_tokens.saturating_add(max_tokens) <= max_context {
        return Ok(());
    }
    Err(WickError::ContextLengthExceeded {
        max_context,
        prompt_tokens,
        max_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts() {
        assert!(check_prompt(&[0, 9], 10).is_ok());
        for (ids, words) in [(&[][..], "empty"), (&[1, 10][..], "token id 10")] {
            match check_prompt(ids, 10) {
                Err(WickError::InvalidRequest { message, param }) => {
                    assert!(message.contains(words), "{message}");
                    assert_eq!(param.as_deref(), Some("prompt"));
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(check_token_ids(&[], 10, "tokens").is_ok());
    }

    #[test]
    fn context() {
        assert!(check_context(6, 4, 10).is_ok());
        assert!(matches!(
            check_context(6, 5, 10),
            Err(WickError::ContextLengthExceeded {
                max_context: 10,
                prompt_tokens: 6,
                max_tokens: 5
            })
        ));
        assert!(check_context(1, usize::MAX, 10).is_err());
    }
}
