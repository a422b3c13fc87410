//! Chat prompts from a model's Jinja chat template.
//!
//! Templates are written for Hugging Face transformers' `apply_chat_template`,
//! which renders them with Python Jinja2 in a sandbox with `trim_blocks`,
//! `lstrip_blocks` and loop controls, and adds `raise_exception`,
//! `strftime_now` and its own `tojson`, and passes a turn's reasoning both
//! as `reasoning_content` and as `thinking`. The environment here mirrors that,
//! with Python's string and dict methods (minijinja-contrib's pycompat) and
//! Python's way of printing values, so templates render byte for byte as
//! they do there (checked in `tests/chat_templates.rs` against Jinja2).

mod clock;
mod message;
mod pyjson;
mod pystr;

use std::collections::HashSet;
use std::sync::Arc;

use anyhow::Context;
use chrono::NaiveDateTime;
use minijinja::{Environment, Error, ErrorKind, Value};

use message::TemplateTurn;
pub use message::{ChatMessage, FunctionCall, Message, Part, ToolCall};

const TEMPLATE_NAME: &str = "chat";

#[derive(Clone, Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template's text, as clients that render prompts themselves ask
    /// for it (vLLM's `/tokenizer_info`).
    source: String,
    /// The variables it reads from outside (minijinja's static analysis),
    /// to tell which request options it understands.
    reads: HashSet<String>,
    bos_token: String,
    eos_token: String,
}

/// Why a conversation could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The template refused the conversation with `raise_exception(message)`
    /// (e.g. roles out of order): the message is the template's own.
    #[error("{0}")]
    Rejected(String),
    /// The template failed on this conversation in some other way.
    #[error("rendering chat template: {0}")]
    Failed(Error),
}

impl ChatTemplate {
    /// Compiles `template`; `bos_token`/`eos_token` are the texts exposed to
    /// it as `bos_token`/`eos_token`, as transformers does.
    pub fn new(template: String, bos_token: String, eos_token: String) -> anyhow::Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            out.write_str(&pystr::py_str(value)).map_err(Error::from)
        });
        env.add_filter("string", |value: Value| pystr::py_str(&value));
        env.add_filter("tojson", pyjson::tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", clock::strftime_now(clock::local_clock()));
        env.add_template_owned(TEMPLATE_NAME, template.clone())
            .context("invalid chat template")?;
        let reads = env.get_template(TEMPLATE_NAME)?.undeclared_variables(false);
        Ok(ChatTemplate {
            env,
            source: template,
            reads,
            bos_token,
            eos_token,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template reads the variable `name` from its context
    /// (e.g. gpt-oss's reads `reasoning_effort`): one it only sets itself,
    /// or mentions in a comment or string, it does not read.
    pub fn reads(&self, name: &str) -> bool {
        self.reads.contains(name)
    }

    /// Makes `strftime_now` read `now` instead of the local clock.
    pub fn with_clock(mut self, now: impl Fn() -> NaiveDateTime + Send + Sync + 'static) -> Self {
        self.env
            .add_function("strftime_now", clock::strftime_now(Arc::new(now)));
        self
    }

    /// Renders a plain text conversation; `add_generation_prompt` appends
    /// the header that opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, RenderError> {
        let messages: Vec<Message> = messages.iter().map(Message::from).collect();
        self.render_with_tools(&messages, None, add_generation_prompt)
    }

    /// Renders a conversation that may carry tool calls and results, with
    /// the tool definitions (a list of OpenAI function tools) the template
    /// shows the model, if any.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, RenderError> {
        self.render_request(messages, tools, add_generation_prompt, None)
    }

    /// Names the template receives from wick itself, which a request's
    /// `chat_template_kwargs` may not set.
    pub const RESERVED: [&'static str; 6] = [
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
    ];

    /// As [`Self::render_with_tools`], with a request's own variables
    /// (`chat_template_kwargs`, e.g. `enable_thinking`) beside them; none
    /// of them is one of [`Self::RESERVED`].
    pub fn render_request(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, RenderError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(RenderError::Failed)?;
        let turns: Vec<TemplateTurn> = messages.iter().map(TemplateTurn::from).collect();
        // transformers passes `tools` and `documents` as None when absent:
        // defined, so `tools is defined` holds and `tools is not none` decides.
        let ctx = minijinja::context! {
            messages => turns,
            tools => tools,
            documents => (),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            ..Value::from_serialize(kwargs)
        };
        template.render(ctx).map_err(|e| {
            match std::error::Error::source(&e).and_then(|s| s.downcast_ref::<Raised>()) {
                Some(Raised(message)) => RenderError::Rejected(message.clone()),
                None => RenderError::Failed(e),
            }
        })
    }
}

/// The message of a `raise_exception` call, carried as the render error's
/// source so it can be told from the template's other failures.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Raised(String);

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_template_is_an_error() {
        assert!(ChatTemplate::new("{% for %}".into(), String::new(), String::new()).is_err());
    }

    fn template(source: &str) -> ChatTemplate {
        ChatTemplate::new(source.into(), String::new(), String::new()).unwrap()
    }

    /// gpt-oss's way: a macro that defaults the effort when it is not sent.
    const GPT_OSS_LIKE: &str = "{%- macro system() -%}\
        {%- if reasoning_effort is not defined %}{%- set reasoning_effort = 'medium' %}{%- endif %}\
        Reasoning: {{ reasoning_effort }}\
        {%- endmacro -%}\
        {{ system() }}{% for m in messages %}|{{ m.content }}{% endfor %}";

    #[test]
    fn reads_the_variables_it_looks_up() {
        let t = template(GPT_OSS_LIKE);
        assert!(t.reads("reasoning_effort"));
        assert!(t.reads("messages"));
        assert!(!t.reads("enable_thinking"));
        // Set before use, or only named in a comment or a string: not read.
        for source in [
            "{% set reasoning_effort = 'high' %}{{ reasoning_effort }}",
            "{# reasoning_effort #}{{ 'reasoning_effort' }}",
            "{% for reasoning_effort in messages %}{{ reasoning_effort }}{% endfor %}",
        ] {
            assert!(!template(source).reads("reasoning_effort"), "{source}");
        }
    }

    #[test]
    fn reasoning_effort_reaches_a_template_that_reads_it() {
        let t = template(GPT_OSS_LIKE);
        let user = ChatMessage {
            role: "user".into(),
            content: "hi".into(),
        };
        let messages = [Message::from(&user)];
        let render = |kwargs: Option<&serde_json::Map<_, _>>| {
            t.render_request(&messages, None, true, kwargs).unwrap()
        };
        assert_eq!(render(None), "Reasoning: medium|hi");
        let high = serde_json::json!({"reasoning_effort": "high"});
        assert_eq!(render(high.as_object()), "Reasoning: high|hi");
    }
}
