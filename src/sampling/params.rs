//! Per-request sampling parameters and their validation.
//!
//! Ranges follow the OpenAI API where it defines the parameter and vLLM
//! otherwise, so clients written for either are accepted unchanged.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::WickError;
use crate::sampling::constraint::Constraint;
use crate::text::stop::{StopStrings, MAX_STOPS};

/// Largest number of alternatives `logprobs` may ask for (OpenAI's limit).
pub const MAX_LOGPROBS: usize = 20;

/// How one request picks its tokens. Missing fields deserialize to the
/// defaults of [`SamplingParams::default`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Upper bound on generated tokens.
    pub max_tokens: usize,
    /// EOS and stop token ids are masked until this many tokens exist.
    pub min_tokens: usize,
    /// Softmax temperature; 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Nucleus sampling mass; 1 disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 disables.
    pub min_p: f32,
    /// HF/vLLM multiplicative penalty over prompt and output tokens; 1 disables.
    pub repetition_penalty: f32,
    /// OpenAI additive penalty for any token already generated.
    pub presence_penalty: f32,
    /// OpenAI additive penalty scaled by how often a token was generated.
    pub frequency_penalty: f32,
    /// Added to the logit of each listed token id before sampling. The
    /// lists below are shared by a request's choices, not copied.
    pub logit_bias: Arc<[(u32, f32)]>,
    /// Makes sampling reproducible; `None` seeds from OS entropy.
    pub seed: Option<u64>,
    /// Generation ends when the text contains any of these.
    pub stop: StopStrings,
    /// Generation ends when any of these token ids is sampled; sorted,
    /// without repeats.
    pub stop_token_ids: Arc<[u32]>,
    /// Keep generating past EOS (until `max_tokens` or a stop condition).
    pub ignore_eos: bool,
    /// Report this many top alternatives per token (0..=20); `None` reports none.
    pub logprobs: Option<usize>,
    /// Score the prompt tokens too, with this many top alternatives each
    /// (0..=20; vLLM's `prompt_logprobs`, what completions' echo needs).
    pub prompt_logprobs: Option<usize>,
    /// A grammar the output must follow (compiled by the caller, off the
    /// scheduler thread); the sequence stops at EOS once it is complete.
    #[serde(skip)]
    pub constraint: Option<Constraint>,
    /// What the output is expected to be, mostly (OpenAI's predicted
    /// outputs): decode rows draft from it; the output does not change.
    #[serde(skip)]
    pub prediction: Vec<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_tokens: 16,
            min_tokens: 0,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Arc::new([]),
            seed: None,
            stop: StopStrings::default(),
            stop_token_ids: Arc::new([]),
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            constraint: None,
            prediction: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Checks every field against its allowed range; the error's `param`
    /// names the offending field.
    ///
    /// Ranges: `max_tokens >= 1`, `min_tokens <= max_tokens`,
    /// `temperature` in [0, 2], `top_p` in (0, 1], `min_p` in [0, 1],
    /// `presence_penalty` and `frequency_penalty` in [-2, 2],
    /// `repetition_penalty` > 0 and finite, `logprobs <= 20`,
    /// `logit_bias` ids `< vocab_size` with biases in [-100, 100],
    /// `stop_token_ids < vocab_size`, and no empty `stop` string.
    ///
    /// `repetition_penalty` has no upper bound, as in vLLM: a large value is
    /// merely a strong penalty, and a cap would reject requests vLLM accepts.
    /// An empty stop string is rejected because it would match at once.
    /// NaN fails every range check.
    pub fn validate(&self, vocab_size: usize) -> Result<(), WickError> {
        if self.max_tokens < 1 {
            return Err(invalid("max_tokens", "must be at least 1", self.max_tokens));
        }
        if self.min_tokens > self.max_tokens {
            return Err(WickError::invalid(
                format!(
                    "min_tokens must be at most max_tokens ({}), got {}",
                    self.max_tokens, self.min_tokens
                ),
                "min_tokens".to_string(),
            ));
        }
        if !(0.0..=2.0).contains(&self.temperature) {
            return Err(invalid(
                "temperature",
                "must be in [0, 2]",
                self.temperature,
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(invalid("top_p", "must be in (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(invalid("min_p", "must be in [0, 1]", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(invalid(
                "repetition_penalty",
                "must be greater than 0 and finite",
                self.repetition_penalty,
            ));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(invalid(
                "presence_penalty",
                "must be in [-2, 2]",
                self.presence_penalty,
            ));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(invalid(
                "frequency_penalty",
                "must be in [-2, 2]",
                self.frequency_penalty,
            ));
        }
        for (name, n) in [
            ("logprobs", self.logprobs),
            ("prompt_logprobs", self.prompt_logprobs),
        ] {
            if let Some(n) = n.filter(|&n| n > MAX_LOGPROBS) {
                return Err(invalid(name, "must be in [0, 20]", n));
            }
        }
        for &(id, bias) in self.logit_bias.iter() {
            if id as usize >= vocab_size {
                return Err(WickError::invalid(
                    format!("logit_bias token id {id} is out of vocabulary (size {vocab_size})"),
                    "logit_bias".to_string(),
                ));
            }
            if !(-100.0..=100.0).contains(&bias) {
                return Err(WickError::invalid(
                    format!("logit_bias for token {id} must be in [-100, 100], got {bias}"),
                    "logit_bias".to_string(),
                ));
            }
        }
        if let Some(&id) = self
            .stop_token_ids
            .iter()
            .find(|&&id| id as usize >= vocab_size)
        {
            return Err(WickError::invalid(
                format!("stop_token_ids contains {id}, out of vocabulary (size {vocab_size})"),
                "stop_token_ids".to_string(),
            ));
        }
        if self.stop.len() > MAX_STOPS {
            return Err(WickError::invalid(
                format!(
                    "stop may hold at most {MAX_STOPS} strings, got {}",
                    self.stop.len()
                ),
                "stop".to_string(),
            ));
        }
        if self.stop.iter().any(str::is_empty) {
            return Err(WickError::invalid(
                "stop must not contain an empty string",
                "stop".to_string(),
            ));
        }
        Ok(())
    }
}

fn invalid(param: &str, rule: &str, got: impl std::fmt::Display) -> WickError {
    WickError::invalid(format!("{param} {rule}, got {got}"), param.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: usize = 100;

    /// The `param` of the validation error, panicking if validation passed.
    fn rejected(p: &SamplingParams) -> String {
        match p.validate(VOCAB) {
            Err(WickError::InvalidRequest {
                param: Some(param), ..
            }) => param,
            other => panic!("expected an invalid-request error, got {other:?}"),
        }
    }

    fn with(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    }

    #[test]
    fn defaults_are_valid_and_as_documented() {
        let p = SamplingParams::default();
        assert!(p.validate(VOCAB).is_ok());
        assert_eq!(p.max_tokens, 16);
        assert_eq!(p.temperature, 1.0);
        assert_eq!(p.top_p, 1.0);
        assert_eq!(p.repetition_penalty, 1.0);
        assert_eq!(p.logprobs, None);
    }

    #[test]
    fn serde_fills_missing_fields_with_defaults() {
        let p: SamplingParams = serde_json::from_str(r#"{"temperature": 0.5}"#).unwrap();
        assert_eq!(p, with(|p| p.temperature = 0.5));
        let back: SamplingParams =
            serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn max_tokens_at_least_one() {
        assert_eq!(rejected(&with(|p| p.max_tokens = 0)), "max_tokens");
        assert!(with(|p| p.max_tokens = 1).validate(VOCAB).is_ok());
    }

    #[test]
    fn min_tokens_at_most_max_tokens() {
        assert_eq!(rejected(&with(|p| p.min_tokens = 17)), "min_tokens");
        assert!(with(|p| p.min_tokens = 16).validate(VOCAB).is_ok());
    }

    #[test]
    fn temperature_range() {
        for bad in [-0.1, 2.01, f32::NAN, f32::INFINITY] {
            assert_eq!(rejected(&with(|p| p.temperature = bad)), "temperature");
        }
        for ok in [0.0, 0.7, 2.0] {
            assert!(with(|p| p.temperature = ok).validate(VOCAB).is_ok());
        }
    }

    #[test]
    fn top_p_range() {
        for bad in [0.0, -0.5, 1.01, f32::NAN] {
            assert_eq!(rejected(&with(|p| p.top_p = bad)), "top_p");
        }
        for ok in [0.01, 1.0] {
            assert!(with(|p| p.top_p = ok).validate(VOCAB).is_ok());
        }
    }

    #[test]
    fn min_p_range() {
        for bad in [-0.01, 1.01, f32::NAN] {
            assert_eq!(rejected(&with(|p| p.min_p = bad)), "min_p");
        }
        for ok in [0.0, 1.0] {
            assert!(with(|p| p.min_p = ok).validate(VOCAB).is_ok());
        }
    }

    #[test]
    fn repetition_penalty_positive_and_finite() {
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert_eq!(
                rejected(&with(|p| p.repetition_penalty = bad)),
                "repetition_penalty"
            );
        }
        for ok in [0.01, 1.0, 2.0, 5.0] {
            assert!(with(|p| p.repetition_penalty = ok).validate(VOCAB).is_ok());
        }
    }

    #[test]
    fn presence_and_frequency_penalty_ranges() {
        for bad in [-2.01, 2.01, f32::NAN] {
            assert_eq!(
                rejected(&with(|p| p.presence_penalty = bad)),
                "presence_penalty"
            );
            assert_eq!(
                rejected(&with(|p| p.frequency_penalty = bad)),
                "frequency_penalty"
            );
        }
        for ok in [-2.0, 0.0, 2.0] {
            assert!(with(|p| p.presence_penalty = ok).validate(VOCAB).is_ok());
            assert!(with(|p| p.frequency_penalty = ok).validate(VOCAB).is_ok());
        }
    }

    #[test]
    fn logprobs_at_most_twenty() {
        assert_eq!(rejected(&with(|p| p.logprobs = Some(21))), "logprobs");
        for ok in [Some(0), Some(20), None] {
            assert!(with(|p| p.logprobs = ok).validate(VOCAB).is_ok());
        }
    }

    #[test]
    fn logit_bias_ids_and_values() {
        assert_eq!(
            rejected(&with(|p| p.logit_bias = vec![(VOCAB as u32, 1.0)].into())),
            "logit_bias"
        );
        for bad in [-100.5, 100.5, f32::NAN] {
            assert_eq!(
                rejected(&with(|p| p.logit_bias = vec![(3, bad)].into())),
                "logit_bias"
            );
        }
        let ok = with(|p| p.logit_bias = vec![(0, -100.0), (VOCAB as u32 - 1, 100.0)].into());
        assert!(ok.validate(VOCAB).is_ok());
    }

    #[test]
    fn stop_token_ids_in_vocabulary() {
        assert_eq!(
            rejected(&with(|p| p.stop_token_ids = vec![1, VOCAB as u32].into())),
            "stop_token_ids"
        );
        assert!(
            with(|p| p.stop_token_ids = vec![0, VOCAB as u32 - 1].into())
                .validate(VOCAB)
                .is_ok()
        );
    }

    #[test]
    fn stop_strings_non_empty() {
        assert_eq!(
            rejected(&with(|p| p.stop = vec!["ok".into(), String::new()].into())),
            "stop"
        );
        assert!(with(|p| p.stop = vec!["\n\n".into()].into())
            .validate(VOCAB)
            .is_ok());
    }

    #[test]
    fn stop_strings_are_bounded_in_number() {
        let stops = |n: usize| (0..n).map(|i| format!("s{i}")).collect::<Vec<_>>().into();
        assert_eq!(rejected(&with(|p| p.stop = stops(MAX_STOPS + 1))), "stop");
        assert!(with(|p| p.stop = stops(MAX_STOPS)).validate(VOCAB).is_ok());
    }

    #[test]
    fn error_message_names_value() {
        let err = with(|p| p.temperature = 3.0).validate(VOCAB).unwrap_err();
        assert_eq!(err.to_string(), "temperature must be in [0, 2], got 3");
    }
}
