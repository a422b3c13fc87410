//! Chat prompts from a model's Jinja chat template.
//!
//! Templates are written for Hugging Face transformers, which renders them
//! with Python Jinja2 (`trim_blocks`, `lstrip_blocks`, loop controls, a
//! `raise_exception` global, Python string/dict methods, and a `tojson` that
//! is Python's `json.dumps`). The environment here mirrors that so templates
//! render byte for byte as they do there.

mod message;

use anyhow::Context;
use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::Serialize;

pub use message::{ChatMessage, FunctionCall, Message, ToolCall};

const TEMPLATE_NAME: &str = "chat";

#[derive(Clone, Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
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
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, template)
            .context("invalid chat template")?;
        Ok(ChatTemplate {
            env,
            bos_token,
            eos_token,
        })
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
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(RenderError::Failed)?;
        // transformers passes `tools` and `documents` as None when absent:
        // defined, so `tools is defined` holds and `tools is not none` decides.
        let ctx = minijinja::context! {
            messages => messages,
            tools => tools,
            documents => (),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
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

/// Python `json.dumps` output (what transformers' `tojson` produces): `", "`
/// and `": "` separators, or newlines with `indent`; non-ASCII kept as is.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let res = match indent {
        Some(n) => {
            let pad = " ".repeat(n);
            let fmt = serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes());
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, fmt))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PythonCompact,
        )),
    };
    res.map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    let json = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(Value::from_safe_string(json))
}

/// serde_json formatter for Python's default single-line separators.
struct PythonCompact;

impl serde_json::ser::Formatter for PythonCompact {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tokenizer.chat_template` of SmolLM2-135M-Instruct.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    fn smollm2() -> ChatTemplate {
        ChatTemplate::new(SMOLLM2.into(), "<|im_start|>".into(), "<|im_end|>".into()).unwrap()
    }

    #[test]
    fn smollm2_system_and_user() {
        let out = smollm2()
            .render(
                &[msg("system", "You are terse."), msg("user", "Hi there")],
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are terse.<|im_end|>\n\
             <|im_start|>user\nHi there<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    #[test]
    fn smollm2_user_only_gets_default_system_prompt() {
        let t = smollm2();
        let convo = [msg("user", "What is 2+2?")];
        let expected = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nWhat is 2+2?<|im_end|>\n";
        assert_eq!(t.render(&convo, false).unwrap(), expected);
        assert_eq!(
            t.render(&convo, true).unwrap(),
            format!("{expected}<|im_start|>assistant\n")
        );
    }

    #[test]
    fn smollm2_template_from_gguf_matches_fixture() {
        let path = crate::model_fetch::default_model_path().expect("default model");
        let mut f = std::fs::File::open(path).unwrap();
        let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
        let template = content.metadata["tokenizer.chat_template"]
            .to_string()
            .unwrap();
        assert_eq!(template, SMOLLM2);
    }

    #[test]
    fn hf_style_templates() {
        // Python string methods, loop.last, trim/lstrip blocks, bos/eos.
        let src = "{{ bos_token }}\n{% for m in messages %}\n  {% if loop.last %}[{{ m.role.upper() }}] {{ m['content'].strip() }}{{ eos_token }}{% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(src.into(), "<s>".into(), "</s>".into()).unwrap();
        let out = t
            .render(&[msg("user", "a"), msg("assistant", "  b \n")], false)
            .unwrap();
        assert_eq!(out, "<s>\n[ASSISTANT] b</s>");
    }

    #[test]
    fn raise_exception_fails_render() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
        let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
        assert_eq!(t.render(&[msg("user", "x")], false).unwrap(), "ok");
        let err = t.render(&[msg("system", "x")], false).unwrap_err();
        assert!(
            err.to_string()
                .contains("Conversation must start with user"),
            "{err}"
        );
    }

    #[test]
    fn tojson_matches_python() {
        let t = ChatTemplate::new(
            "{{ messages[0] | tojson }}|{{ messages | tojson(indent=2) }}".into(),
            String::new(),
            String::new(),
        )
        .unwrap();
        let out = t.render(&[msg("user", "héllo <b>")], false).unwrap();
        assert_eq!(
            out,
            "{\"role\": \"user\", \"content\": \"héllo <b>\"}|[\n  {\n    \"role\": \"user\",\n    \"content\": \"héllo <b>\"\n  }\n]"
        );
    }

    #[test]
    fn bad_template_is_an_error() {
        assert!(ChatTemplate::new("{% for %}".into(), String::new(), String::new()).is_err());
    }
}
