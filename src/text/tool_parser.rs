//! Tool calls in a model's own output format, parsed as the text streams in.
//!
//! Models trained for tools write calls in the format their chat template
//! teaches, which [`ToolFormat::detect`] reads off the template:
//! - Hermes (Qwen2.5, Hermes, SmolLM3): `<tool_call>{"name": …, "arguments": {…}}</tool_call>`,
//!   anywhere in the reply, any number of times;
//! - Llama 3.x: the whole reply is `{"name": …, "parameters": {…}}`, optionally
//!   after `<|python_tag|>`, several separated by `;`;
//! - Mistral (Nemo, 7B v0.3): `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`;
//! - Mistral with `[ARGS]` (Small 3.2, Devstral):
//!   `[TOOL_CALLS]name[CALL_ID]id[ARGS]{…}`, the call id optional;
//! - and wick's own for `tool_choice: "required"`, which decoding is
//!   constrained to (vLLM's choice): the reply is a JSON list of
//!   `{"name": …, "parameters": {…}}`. A named `tool_choice` constrains the
//!   reply to that function's arguments alone ([`ToolCallParser::named`]).
//!
//! [`ToolCallParser`] turns the text into events: plain content, a call's
//! start (its name), and its arguments in pieces (raw JSON text, so the
//! pieces concatenate to the arguments string). Text that only might begin
//! a call is held back until it is clear; a call that turns out malformed
//! before its name is known is given back as content.

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3Json,
    MistralJson,
    MistralArgs,
    JsonList,
}

impl ToolFormat {
    /// The format a chat template teaches, if it renders tool calls at all.
    pub fn detect(template: &str) -> Option<Self> {
        if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if template.contains("[TOOL_CALLS]") && template.contains("[ARGS]") {
            Some(ToolFormat::MistralArgs)
        } else if template.contains("[TOOL_CALLS]") {
            Some(ToolFormat::MistralJson)
        } else if template.contains("\"parameters\"") && template.contains("ipython") {
            Some(ToolFormat::Llama3Json)
        } else {
            None
        }
    }

    /// Text that opens a call, for formats with one.
    fn opener(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::MistralJson | ToolFormat::MistralArgs => "[TOOL_CALLS]",
            ToolFormat::Llama3Json => "<|python_tag|>",
            ToolFormat::JsonList => "[",
        }
    }

    /// Formats whose calls can only open the reply: text after them (or
    /// instead of them) is all content.
    fn calls_open_the_reply(self) -> bool {
        matches!(self, ToolFormat::Llama3Json | ToolFormat::JsonList)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    Content(String),
    /// Call `index` (0, 1, … in the reply) begins.
    Start {
        index: usize,
        name: String,
    },
    /// The next piece of call `index`'s arguments (JSON text).
    Arguments {
        index: usize,
        text: String,
    },
}

/// A whole reply, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedReply {
    pub content: String,
    /// `(name, arguments as JSON text)`.
    pub calls: Vec<(String, String)>,
}

impl ParsedReply {
    pub fn from_events(events: impl IntoIterator<Item = ToolEvent>) -> Self {
        let mut reply = ParsedReply::default();
        for ev in events {
            match ev {
                ToolEvent::Content(t) => reply.content.push_str(&t),
                ToolEvent::Start { name, .. } => reply.calls.push((name, String::new())),
                ToolEvent::Arguments { index, text } => reply.calls[index].1.push_str(&text),
            }
        }
        for call in &mut reply.calls {
            if call.1.trim().is_empty() {
                call.1 = "{}".to_string();
            }
        }
        reply
    }
}

/// Parses `text`, a whole reply, in one go.
pub fn parse_reply(format: ToolFormat, text: &str) -> ParsedReply {
    let mut p = ToolCallParser::new(format);
    let mut events = p.push(text);
    events.extend(p.finish());
    ParsedReply::from_events(events)
}

#[derive(Debug)]
enum State {
    /// Before anything but whitespace (Llama 3 calls must open the reply).
    Start,
    Text,
    /// After `[TOOL_CALLS]` in the JSON-list format, before its `[`.
    ListOpen,
    /// Inside a JSON call object; `list` when it sits in a Mistral list.
    Object {
        list: bool,
    },
    /// After a call object: what may follow it.
    AfterObject {
        list: bool,
    },
    /// `[TOOL_CALLS]` seen in the `[ARGS]` format: the name follows.
    ArgsName,
    /// The arguments value of an `[ARGS]` call.
    ArgsValue,
}

pub struct ToolCallParser {
    format: ToolFormat,
    state: State,
    /// Text not yet turned into events.
    buf: String,
    /// Calls started so far.
    calls: usize,
    /// Bytes of the current call's arguments already sent.
    args_sent: usize,
    /// Whether the current call's start has been sent.
    started: bool,
    /// The current call's text from its opener on, given back as content
    /// if it turns out malformed before its start was sent.
    raw: String,
    /// Just after a call: whitespace before the next one is not content.
    after_call: bool,
    /// A named call's start, sent before anything else.
    named: Option<String>,
}

impl ToolCallParser {
    pub fn new(format: ToolFormat) -> Self {
        ToolCallParser {
            format,
            state: State::Start,
            buf: String::new(),
            calls: 0,
            args_sent: 0,
            started: false,
            raw: String::new(),
            after_call: false,
            named: None,
        }
    }

    /// For a reply that is the arguments of the function `name` and
    /// nothing else.
    pub fn named(name: &str) -> Self {
        let mut p = ToolCallParser::new(ToolFormat::JsonList);
        p.named = Some(name.to_string());
        p.started = true;
        p.state = State::ArgsValue;
        p
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        let mut out = self.named_start();
        while self.step(&mut out, false) {}
        out
    }

    /// The reply ended: whatever is held back is settled.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = self.named_start();
        while self.step(&mut out, true) {}
        out
    }

    /// Advances by one state change; false when more text is needed.
    fn step(&mut self, out: &mut Vec<ToolEvent>, end: bool) -> bool {
        match self.state {
            State::Start => {
                if self.format == ToolFormat::JsonList {
                    self.begin_call(0);
                    self.state = State::ListOpen;
                    return true;
                }
                if self.format != ToolFormat::Llama3Json {
                    self.state = State::Text;
                    return true;
                }
                let trimmed = self.buf.trim_start();
                let skip = self.buf.len() - trimmed.len();
                let tag = self.format.opener();
                if trimmed.starts_with(tag) || trimmed.starts_with('{') {
                    let tag_len = if trimmed.starts_with(tag) {
                        tag.len()
                    } else {
                        0
                    };
                    self.begin_call(skip + tag_len);
                    self.state = State::Object { list: false };
                    return true;
                }
                // Whitespace, or the start of the tag: wait and see.
                if !end && tag.starts_with(trimmed) {
                    return false;
                }
                self.state = State::Text;
                true
            }
            State::Text => {
                if self.after_call {
                    let trimmed = self.buf.trim_start();
                    if trimmed.is_empty() && !end {
                        return false;
                    }
                    self.buf.drain(..self.buf.len() - trimmed.len());
                    self.after_call = false;
                }
                if self.format.calls_open_the_reply() {
                    emit_content(out, std::mem::take(&mut self.buf));
                    return false;
                }
                let opener = self.format.opener();
                if let Some(at) = self.buf.find(opener) {
                    emit_content(out, self.buf[..at].to_string());
                    self.buf.drain(..at);
                    self.begin_call(opener.len());
                    self.state = match self.format {
                        ToolFormat::MistralJson => State::ListOpen,
                        ToolFormat::MistralArgs => State::ArgsName,
                        _ => State::Object { list: false },
                    };
                    return true;
                }
                let keep = if end {
                    0
                } else {
                    partial_suffix(&self.buf, opener)
                };
                let send = self.buf.len() - keep;
                emit_content(out, self.buf[..send].to_string());
                self.buf.drain(..send);
                false
            }
            State::ListOpen => {
                let trimmed = self.buf.trim_start();
                if trimmed.is_empty() {
                    return end && self.drop_unfinished();
                }
                if !trimmed.starts_with('[') {
                    return self.give_up(out);
                }
                self.consume(self.buf.len() - trimmed.len() + 1);
                self.state = State::Object { list: true };
                true
            }
            State::Object { list } => {
                let trimmed = self.buf.trim_start();
                if trimmed.is_empty() {
                    return end && self.drop_unfinished();
                }
                if !trimmed.starts_with('{') {
                    return self.give_up(out);
                }
                let scan = scan_call(trimmed);
                if scan.malformed {
                    return self.give_up(out);
                }
                let base = self.buf.len() - trimmed.len();
                if !self.started {
                    if let Some(name) = &scan.name {
                        out.push(ToolEvent::Start {
                            index: self.calls,
                            name: name.clone(),
                        });
                        self.started = true;
                    }
                }
                if self.started {
                    if let Some((from, to)) = scan.args {
                        let to = to.unwrap_or(trimmed.trim_end().len());
                        if to > from + self.args_sent {
                            out.push(ToolEvent::Arguments {
                                index: self.calls,
                                text: trimmed[from + self.args_sent..to].to_string(),
                            });
                            self.args_sent = to - from;
                        }
                    }
                }
                match scan.end {
                    Some(len) if self.started => {
                        self.consume(base + len);
                        self.end_call();
                        self.state = State::AfterObject { list };
                        true
                    }
                    // A whole object without a name is no call.
                    Some(_) => self.give_up(out),
                    None if end => {
                        // Cut off (max_tokens): a started call keeps what it
                        // has (it went out); one without its name yet is
                        // dropped, unless (a bare Llama 3 object) it may be
                        // text that is no call at all.
                        if self.started {
                            self.buf.clear();
                            self.end_call();
                            self.state = State::Text;
                            true
                        } else if self.surely_a_call(trimmed) {
                            self.drop_unfinished()
                        } else {
                            self.give_up(out)
                        }
                    }
                    None => false,
                }
            }
            State::AfterObject { list } => {
                let trimmed = self.buf.trim_start();
                let skip = self.buf.len() - trimmed.len();
                let next = match (self.format, list) {
                    (ToolFormat::Hermes, _) => Some(("</tool_call>", State::Text)),
                    (ToolFormat::Llama3Json, _) => Some((";", State::Object { list: false })),
                    (_, true) => {
                        if trimmed.starts_with(',') {
                            Some((",", State::Object { list: true }))
                        } else {
                            Some(("]", State::Text))
                        }
                    }
                    _ => None,
                };
                let Some((token, then)) = next else {
                    self.state = State::Text;
                    return true;
                };
                if trimmed.starts_with(token) {
                    self.buf.drain(..skip + token.len());
                    if matches!(then, State::Object { .. }) {
                        self.begin_call(0);
                    }
                    self.state = then;
                    return true;
                }
                if token.starts_with(trimmed) {
                    if end {
                        // The call's closing, cut off.
                        self.buf.clear();
                        self.state = State::Text;
                        return true;
                    }
                    return false;
                }
                // Anything else after a call is plain text.
                self.state = State::Text;
                true
            }
            State::ArgsName => {
                let Some(at) = self.buf.find("[ARGS]") else {
                    // Cut off before its arguments: no call, and no content.
                    return end && self.drop_unfinished();
                };
                // `name[CALL_ID]id`: the id is the model's own; wick issues its own.
                let head = &self.buf[..at];
                let name = head
                    .split("[CALL_ID]")
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string();
                if name.is_empty() || name.contains(char::is_whitespace) {
                    return self.give_up(out);
                }
                out.push(ToolEvent::Start {
                    index: self.calls,
                    name,
                });
                self.started = true;
                self.consume(at + "[ARGS]".len());
                self.state = State::ArgsValue;
                true
            }
            State::ArgsValue => {
                let trimmed = self.buf.trim_start();
                let skip = self.buf.len() - trimmed.len();
                let done = if trimmed.is_empty() {
                    None
                } else {
                    json_value_end(trimmed)
                };
                let to = done.unwrap_or(if end {
                    trimmed.len()
                } else {
                    trimmed.trim_end().len()
                });
                if to > self.args_sent {
                    out.push(ToolEvent::Arguments {
                        index: self.calls,
                        text: trimmed[self.args_sent..to].to_string(),
                    });
                    self.args_sent = to;
                }
                if done.is_none() && !end {
                    return false;
                }
                self.consume(skip + to);
                self.end_call();
                self.state = State::Text;
                true
            }
        }
    }

    fn named_start(&mut self) -> Vec<ToolEvent> {
        let name = self.named.take();
        name.map(|name| ToolEvent::Start { index: 0, name })
            .into_iter()
            .collect()
    }

    /// A call opens; its first `skip` bytes (the opener) are consumed.
    fn begin_call(&mut self, skip: usize) {
        self.raw.clear();
        self.started = false;
        self.args_sent = 0;
        self.consume(skip);
    }

    fn consume(&mut self, n: usize) {
        self.raw.push_str(&self.buf[..n]);
        self.buf.drain(..n);
    }

    fn end_call(&mut self) {
        self.after_call = true;
        self.calls += 1;
        self.started = false;
        self.args_sent = 0;
        self.raw.clear();
    }

    /// The reply ended inside a call whose start was not sent (cut off by
    /// `max_tokens`): a piece of a call is not content, so it goes.
    fn drop_unfinished(&mut self) -> bool {
        self.buf.clear();
        self.raw.clear();
        self.started = false;
        self.args_sent = 0;
        self.state = State::Text;
        true
    }

    /// Whether the unclosed object `text` that the reply ends in is a call
    /// cut off, rather than text: always, but for a bare `{` opening a
    /// Llama 3 reply, which must begin with its `name` to be one.
    fn surely_a_call(&self, text: &str) -> bool {
        let bare = self.format == ToolFormat::Llama3Json
            && self.calls == 0
            && !self.raw.contains(self.format.opener());
        if !bare {
            return true;
        }
        let key = text.strip_prefix('{').unwrap_or(text).trim_start();
        "\"name\"".starts_with(key) || key.starts_with("\"name\"")
    }

    /// Not a call after all: its opener is content, and what follows is
    /// read as text again. A call whose start was already sent just ends.
    fn give_up(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        if self.started {
            self.end_call();
        } else {
            emit_content(out, std::mem::take(&mut self.raw));
        }
        self.state = State::Text;
        true
    }
}

fn emit_content(out: &mut Vec<ToolEvent>, text: String) {
    if !text.is_empty() {
        out.push(ToolEvent::Content(text));
    }
}

/// Bytes at the end of `text` that begin `marker` (so might be its start).
pub(crate) fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// What is known of a call object from its text so far.
#[derive(Debug, Default)]
struct CallScan {
    name: Option<String>,
    /// Byte span of the arguments value; the end once it is complete.
    args: Option<(usize, Option<usize>)>,
    /// Bytes of the whole object once it is closed.
    end: Option<usize>,
    malformed: bool,
}

/// Scans a call object (`text` starts with `{`): its `name` once that
/// string is complete, and where its `arguments` (or `parameters`) value
/// lies.
fn scan_call(text: &str) -> CallScan {
    let bytes = text.as_bytes();
    let mut scan = CallScan::default();
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    // At depth 1: the key just read, and where its value began.
    let mut key_start = None;
    let mut key: Option<String> = None;
    let mut value_start: Option<usize> = None;
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                if depth == 1 && value_start.is_none() {
                    if let Some(s) = key_start.take() {
                        key = serde_json::from_str::<String>(&text[s..=i]).ok();
                    }
                }
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                if depth == 1 && value_start.is_none() && key.is_none() {
                    key_start = Some(i);
                }
            }
            b'{' | b'[' => {
                depth += 1;
            }
            b'}' | b']' => {
                if depth == 0 {
                    scan.malformed = true;
                    return scan;
                }
                depth -= 1;
                if depth == 0 {
                    finish_value(text, i, &mut key, &mut value_start, &mut scan);
                    scan.end = Some(i + 1);
                    return scan;
                }
            }
            b':' if depth == 1 && value_start.is_none() => {
                if key.is_none() {
                    scan.malformed = true;
                    return scan;
                }
                // The value starts at the next non-space byte.
                value_start = Some(i + 1 + text[i + 1..].len() - text[i + 1..].trim_start().len());
                if matches!(key.as_deref(), Some("arguments" | "parameters")) {
                    scan.args = Some((value_start.unwrap_or(i + 1), None));
                }
            }
            b',' if depth == 1 => {
                finish_value(text, i, &mut key, &mut value_start, &mut scan);
            }
            _ => {}
        }
    }
    scan
}

/// A depth-1 value of a call object ended just before byte `at`.
fn finish_value(
    text: &str,
    at: usize,
    key: &mut Option<String>,
    value_start: &mut Option<usize>,
    scan: &mut CallScan,
) {
    let (Some(k), Some(start)) = (key.take(), value_start.take()) else {
        return;
    };
    let end = start + text[start..at].trim_end().len();
    match k.as_str() {
        "name" => scan.name = serde_json::from_str::<String>(&text[start..end]).ok(),
        "arguments" | "parameters" => scan.args = Some((start, Some(end))),
        _ => {}
    }
}

/// Bytes of the one JSON value `text` starts with, once it is complete
/// (objects and arrays; a bare scalar runs to the end of the text).
fn json_value_end(text: &str) -> Option<usize> {
    let mut de = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
    match de.next() {
        Some(Ok(_)) if text.starts_with(['{', '[', '"']) => Some(de.byte_offset()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates");

    fn template(name: &str) -> String {
        std::fs::read_to_string(format!("{TEMPLATES}/{name}.jinja")).unwrap()
    }

    #[test]
    fn formats_are_read_off_real_templates() {
        for (name, format) in [
            ("Qwen-Qwen2.5-7B-Instruct", Some(ToolFormat::Hermes)),
            (
                "meta-llama-Llama-3.1-8B-Instruct",
                Some(ToolFormat::Llama3Json),
            ),
            (
                "meta-llama-Llama-3.2-3B-Instruct",
                Some(ToolFormat::Llama3Json),
            ),
            (
                "meta-llama-Llama-3.3-70B-Instruct",
                Some(ToolFormat::Llama3Json),
            ),
            (
                "mistralai-Mistral-Nemo-Instruct-2407",
                Some(ToolFormat::MistralJson),
            ),
            (
                "Mistral-Small-3.2-24B-Instruct-2506",
                Some(ToolFormat::MistralArgs),
            ),
            (
                "unsloth-mistral-Devstral-Small-2507",
                Some(ToolFormat::MistralArgs),
            ),
            ("HuggingFaceTB-SmolLM2-135M-Instruct", None),
            ("microsoft-Phi-3.5-mini-instruct", None),
        ] {
            assert_eq!(ToolFormat::detect(&template(name)), format, "{name}");
        }
    }

    fn calls(reply: &ParsedReply) -> Vec<(String, serde_json::Value)> {
        reply
            .calls
            .iter()
            .map(|(n, a)| (n.clone(), serde_json::from_str(a).unwrap()))
            .collect()
    }

    /// Every split of `text` into two pushes gives the same events, joined,
    /// as one push: streaming changes only where the pieces fall.
    fn check_streaming(format: ToolFormat, text: &str) -> ParsedReply {
        let whole = parse_reply(format, text);
        for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
            let mut p = ToolCallParser::new(format);
            let mut events = p.push(&text[..cut]);
            events.extend(p.push(&text[cut..]));
            events.extend(p.finish());
            assert_eq!(
                ParsedReply::from_events(events),
                whole,
                "cut at {cut} of {text:?}"
            );
        }
        // Token-sized pieces: a call's start comes before its arguments.
        let mut p = ToolCallParser::new(format);
        let mut events = Vec::new();
        for ch in text.chars() {
            events.extend(p.push(&ch.to_string()));
        }
        events.extend(p.finish());
        assert_eq!(ParsedReply::from_events(events), whole);
        whole
    }

    #[test]
    fn hermes_calls_between_text() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"q\": \"a \\\"b\\\" }\"}, \"name\": \"search\"}\n</tool_call>";
        let r = check_streaming(ToolFormat::Hermes, text);
        assert_eq!(r.content, "Let me check.\n");
        assert_eq!(
            calls(&r),
            [
                (
                    "get_weather".into(),
                    serde_json::json!({"city": "Paris", "unit": "c"})
                ),
                ("search".into(), serde_json::json!({"q": "a \"b\" }"})),
            ]
        );
    }

    #[test]
    fn text_that_only_looks_like_a_call_is_content() {
        for text in [
            "I use <tool_call> tags",
            "a < b and <tool",
            "<tool_call>not json</tool_call> ok",
        ] {
            let r = check_streaming(ToolFormat::Hermes, text);
            assert_eq!((r.content.as_str(), r.calls.len()), (text, 0));
        }
        let r = check_streaming(ToolFormat::Llama3Json, "The answer is {\"name\": 1}");
        assert_eq!(r.calls.len(), 0);
        let r = check_streaming(ToolFormat::Llama3Json, "{\"x\": 1}");
        assert_eq!((r.content.as_str(), r.calls.len()), ("{\"x\": 1}", 0));
    }

    #[test]
    fn llama3_json_calls() {
        let text = " <|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": [2, 3]}}; {\"name\": \"now\", \"parameters\": {}}";
        let r = check_streaming(ToolFormat::Llama3Json, text);
        assert_eq!(r.content, "");
        assert_eq!(
            calls(&r),
            [
                ("add".into(), serde_json::json!({"a": 1, "b": [2, 3]})),
                ("now".into(), serde_json::json!({})),
            ]
        );
        let r = check_streaming(
            ToolFormat::Llama3Json,
            "{\"name\": \"now\", \"parameters\": {}}",
        );
        assert_eq!(calls(&r), [("now".into(), serde_json::json!({}))]);
    }

    #[test]
    fn mistral_list_and_args_calls() {
        let text = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\": \"]\"}, \"id\": \"abc123xyz\"}, {\"name\": \"g\", \"arguments\": {}}]";
        let r = check_streaming(ToolFormat::MistralJson, text);
        assert_eq!(
            calls(&r),
            [
                ("f".into(), serde_json::json!({"x": "]"})),
                ("g".into(), serde_json::json!({}))
            ]
        );
        let text = "Sure.[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]now[ARGS]{}";
        let r = check_streaming(ToolFormat::MistralArgs, text);
        assert_eq!(r.content, "Sure.");
        assert_eq!(
            calls(&r),
            [
                ("get_weather".into(), serde_json::json!({"city": "Oslo"})),
                ("now".into(), serde_json::json!({}))
            ]
        );
    }

    #[test]
    fn constrained_replies() {
        let text = "[{\"name\": \"f\", \"parameters\": {\"a\": [1]}}, {\"name\": \"g\", \"parameters\": {}}]";
        let r = check_streaming(ToolFormat::JsonList, text);
        assert_eq!(r.content, "");
        assert_eq!(
            calls(&r),
            [
                ("f".into(), serde_json::json!({"a": [1]})),
                ("g".into(), serde_json::json!({}))
            ]
        );
        let mut p = ToolCallParser::named("f");
        let mut events = p.push("{\"a\":");
        events.extend(p.push(" 1}"));
        events.extend(p.finish());
        let r = ParsedReply::from_events(events);
        assert_eq!(calls(&r), [("f".into(), serde_json::json!({"a": 1}))]);
    }

    /// A reply cut off (`max_tokens`) inside a call: a call whose start
    /// went out keeps its arguments so far; a piece of one before its name
    /// is dropped, never given back as content; complete calls stay.
    #[test]
    fn a_call_cut_off_keeps_what_went_out_and_drops_the_rest() {
        let r = parse_reply(
            ToolFormat::Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"lo",
        );
        assert_eq!(r.calls, [("f".to_string(), "{\"a\": \"lo".to_string())]);
        let one = [("f".to_string(), serde_json::json!({"a": 1}))];
        for (format, text, content, calls_kept) in [
            (ToolFormat::Hermes, "Hi <tool_call>{\"argu", "Hi ", &[][..]),
            (ToolFormat::Hermes, "<tool_call>", "", &[]),
            (
                ToolFormat::Hermes,
                "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_",
                "",
                &one[..],
            ),
            (
                ToolFormat::JsonList,
                "[{\"name\": \"f\", \"parameters\": {\"a\": 1}}, {\"name\": \"fina",
                "",
                &one,
            ),
            (ToolFormat::JsonList, "[", "", &[]),
            (
                ToolFormat::MistralJson,
                "Ok.[TOOL_CALLS] [{\"na",
                "Ok.",
                &[],
            ),
            (
                ToolFormat::MistralArgs,
                "Sure.[TOOL_CALLS]get_wea",
                "Sure.",
                &[],
            ),
            (ToolFormat::Llama3Json, "{\"na", "", &[]),
            (
                ToolFormat::Llama3Json,
                "<|python_tag|>{\"parameters\": {",
                "",
                &[],
            ),
            // A bare object that cannot be a call is the reply's text.
            (
                ToolFormat::Llama3Json,
                "{\"answer\": [1",
                "{\"answer\": [1",
                &[],
            ),
        ] {
            let r = check_streaming(format, text);
            assert_eq!(r.content, content, "{text:?}");
            assert_eq!(calls(&r), calls_kept, "{text:?}");
        }
    }

    #[test]
    fn arguments_stream_in_pieces_after_the_name() {
        let mut p = ToolCallParser::new(ToolFormat::Hermes);
        let mut events = Vec::new();
        for piece in [
            "<tool_call>{\"name\": \"f\", ",
            "\"arguments\": {\"a\"",
            ": 12",
            "3}}</tool_call>",
        ] {
            events.extend(p.push(piece));
        }
        events.extend(p.finish());
        assert_eq!(
            events,
            [
                ToolEvent::Start {
                    index: 0,
                    name: "f".into()
                },
                ToolEvent::Arguments {
                    index: 0,
                    text: "{\"a\"".into()
                },
                ToolEvent::Arguments {
                    index: 0,
                    text: ": 12".into()
                },
                ToolEvent::Arguments {
                    index: 0,
                    text: "3}".into()
                },
            ]
        );
    }
}
