//! OpenAI's harmony format (gpt-oss), read as the text streams in.
//!
//! A harmony reply is a run of messages, each
//! `<|start|>{role}[ to={recipient}]<|channel|>{channel}[ to={recipient}][ [<|constrain|>]{type}]<|message|>{body}`
//! ended by `<|end|>`, `<|call|>` or `<|return|>`; the prompt ends with
//! `<|start|>assistant`, so the first message opens at its `<|channel|>`
//! (or ` to=`). Clients get them as llama.cpp's and vLLM's servers send
//! them: `analysis` is reasoning (blocks concatenated, as llama.cpp does),
//! `final` and a `commentary` preamble are content, and a message to
//! `functions.NAME` is a call of NAME whose body is its JSON arguments.
//! Messages to other recipients (gpt-oss's builtin `python`, `browser.*`)
//! are dropped, as are calls when the request takes none. The markers are
//! never content; text that could still be the start of one is held back.

use crate::text::tool_parser::{partial_suffix, ToolEvent};

const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const START: &str = "<|start|>";
const CONSTRAIN: &str = "<|constrain|>";
/// What ends a message: `<|end|>` goes on to another, the others end the
/// reply (and so are end-of-generation tokens, never seen as text).
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];
/// How a header may open: after `<|end|>`, or at the reply's start, where
/// the prompt has already opened the message.
const OPENERS: [&str; 3] = [START, CHANNEL, "to="];
const FUNCTIONS: &str = "functions.";

/// Whether a chat template speaks harmony.
pub fn template_speaks_harmony(source: &str) -> bool {
    source.contains(CHANNEL) && source.contains(MESSAGE)
}

/// A piece of a harmony reply: thinking, or answer text and tool calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Reasoning(String),
    Answer(ToolEvent),
}

/// What a message's body is to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// The arguments of call `index`.
    Call(usize),
    Dropped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between messages: the header is held until its `<|message|>`.
    Header,
    Body(Body),
}

#[derive(Debug)]
pub struct HarmonyParser {
    state: State,
    held: String,
    /// Whether calls to `functions.*` are the client's (it gave tools).
    calls: bool,
    /// Calls begun so far.
    started: usize,
}

impl HarmonyParser {
    /// A reader of one reply; `calls`: the request takes tool calls.
    pub fn new(calls: bool) -> Self {
        HarmonyParser {
            state: State::Header,
            held: String::new(),
            calls,
            started: 0,
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Event> {
        self.held.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// The reply ended: a body cut off keeps what it has; a header cut off
    /// is markup, and dropped.
    pub fn finish(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        self.held.clear();
        out
    }

    /// Advances by one state change; false when more text is needed.
    fn step(&mut self, out: &mut Vec<Event>, end: bool) -> bool {
        match self.state {
            State::Header => {
                let text = self.held.trim_start();
                if text.is_empty() {
                    return false;
                }
                if !OPENERS.iter().any(|o| text.starts_with(o)) {
                    if !end && OPENERS.iter().any(|o| o.starts_with(text)) {
                        return false;
                    }
                    // Not harmony at all (a model off its format):
                    // answer text as it stands.
                    self.state = State::Body(Body::Content);
                    return true;
                }
                let Some(at) = self.held.find(MESSAGE) else {
                    return false;
                };
                let header = Header::parse(&self.held[..at]);
                let body = match header.recipient.map(|r| r.strip_prefix(FUNCTIONS)) {
                    Some(Some(name)) if self.calls && !name.is_empty() => {
                        let index = self.started;
                        self.started += 1;
                        out.push(Event::Answer(ToolEvent::Start {
                            index,
                            name: name.to_string(),
                        }));
                        Body::Call(index)
                    }
                    Some(_) => Body::Dropped,
                    None if header.channel == "analysis" => Body::Reasoning,
                    None => Body::Content,
                };
                self.held.drain(..at + MESSAGE.len());
                self.state = State::Body(body);
                true
            }
            State::Body(body) => {
                let found = ENDS
                    .iter()
                    .filter_map(|m| self.held.find(m).map(|at| (at, m.len())))
                    .min();
                let (send, next) = match found {
                    Some((at, len)) => (at, Some(at + len)),
                    None if end => (self.held.len(), None),
                    None => {
                        let keep = ENDS
                            .iter()
                            .map(|m| partial_suffix(&self.held, m))
                            .max()
                            .unwrap_or(0);
                        (self.held.len() - keep, None)
                    }
                };
                emit(out, body, &self.held[..send]);
                match next {
                    Some(past) => {
                        self.held.drain(..past);
                        self.state = State::Header;
                        true
                    }
                    None => {
                        self.held.drain(..send);
                        false
                    }
                }
            }
        }
    }
}

/// What a message's header names.
struct Header<'a> {
    channel: &'a str,
    recipient: Option<&'a str>,
}

impl<'a> Header<'a> {
    /// `header`: a message's text up to its `<|message|>`. The recipient
    /// is named after the role or after the channel; a stray
    /// `<|channel|>commentary to=assistant` before the real channel (which
    /// gpt-oss-20b writes now and then) counts for nothing.
    fn parse(header: &'a str) -> Self {
        let (role, rest) = match header.rfind(CHANNEL) {
            Some(at) => (&header[..at], &header[at + CHANNEL.len()..]),
            None => (header, ""),
        };
        let role = role.split(CHANNEL).next().unwrap_or_default();
        let mut words = rest
            .split_whitespace()
            .flat_map(|w| w.split(CONSTRAIN))
            .filter(|w| !w.is_empty());
        let channel = words.next().unwrap_or_default();
        let to = |w: &'a str| w.strip_prefix("to=");
        let recipient = words
            .find_map(to)
            .or_else(|| role.split_whitespace().find_map(to));
        Header { channel, recipient }
    }
}

fn emit(out: &mut Vec<Event>, body: Body, text: &str) {
    if text.is_empty() {
        return;
    }
    let text = text.to_string();
    out.push(match body {
        Body::Reasoning => Event::Reasoning(text),
        Body::Content => Event::Answer(ToolEvent::Content(text)),
        Body::Call(index) => Event::Answer(ToolEvent::Arguments { index, text }),
        Body::Dropped => return,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tool_parser::ParsedReply;

    /// A reply as the client gets it: reasoning, content and calls.
    #[derive(Debug, PartialEq, Eq)]
    struct Reply {
        reasoning: String,
        answer: ParsedReply,
    }

    fn collect(events: Vec<Event>) -> Reply {
        let mut reasoning = String::new();
        let mut answer = Vec::new();
        for e in events {
            match e {
                Event::Reasoning(t) => reasoning.push_str(&t),
                Event::Answer(a) => answer.push(a),
            }
        }
        Reply {
            reasoning,
            answer: ParsedReply::from_events(answer),
        }
    }

    fn whole(calls: bool, text: &str) -> Reply {
        let mut p = HarmonyParser::new(calls);
        let mut events = p.push(text);
        events.extend(p.finish());
        collect(events)
    }

    /// `text` read whole, cut in two at every byte, and a character at a
    /// time: the same reply each way.
    fn read(calls: bool, text: &str) -> Reply {
        let want = whole(calls, text);
        for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
            let mut p = HarmonyParser::new(calls);
            let mut events = p.push(&text[..cut]);
            events.extend(p.push(&text[cut..]));
            events.extend(p.finish());
            assert_eq!(collect(events), want, "cut at {cut} of {text:?}");
        }
        let mut p = HarmonyParser::new(calls);
        let mut events: Vec<Event> = text.chars().flat_map(|c| p.push(&c.to_string())).collect();
        events.extend(p.finish());
        assert_eq!(collect(events), want, "by characters: {text:?}");
        want
    }

    fn reply(reasoning: &str, content: &str, calls: &[(&str, &str)]) -> Reply {
        Reply {
            reasoning: reasoning.into(),
            answer: ParsedReply {
                content: content.into(),
                calls: calls
                    .iter()
                    .map(|(n, a)| (n.to_string(), a.to_string()))
                    .collect(),
            },
        }
    }

    const THOUGHT: &str = "<|channel|>analysis<|message|>I'm\nthinking<|end|>";

    #[test]
    fn analysis_then_final() {
        let text = format!(
            "{THOUGHT}<|start|>assistant<|channel|>final<|message|>Hello, world!\nWhat's up?"
        );
        assert_eq!(
            read(false, &text),
            reply("I'm\nthinking", "Hello, world!\nWhat's up?", &[])
        );
        // As it ends when `<|return|>` is no end of generation.
        assert_eq!(
            read(false, &format!("{text}<|return|>")),
            read(false, &text)
        );
        assert_eq!(
            read(false, "<|channel|>final<|message|>Hi"),
            reply("", "Hi", &[])
        );
    }

    #[test]
    fn several_analysis_blocks_and_a_preamble() {
        let text = format!(
            "{THOUGHT}<|start|>assistant<|channel|>analysis<|message|> More.<|end|>\
             <|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>\
             <|start|>assistant<|channel|>final<|message|> Done."
        );
        assert_eq!(
            read(false, &text),
            reply("I'm\nthinking More.", "Checking. Done.", &[])
        );
        assert_eq!(
            read(false, "<|channel|>commentary<|message|>Hello"),
            reply("", "Hello", &[])
        );
    }

    #[test]
    fn calls_with_the_recipient_in_either_header() {
        let args = "{\"arg1\": 1}";
        let want = reply("", "", &[("special_function", args)]);
        for text in [
            format!(" to=functions.special_function<|channel|>analysis<|message|>{args}"),
            format!("<|channel|>analysis to=functions.special_function<|message|>{args}"),
            format!(" to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{args}"),
            format!("<|channel|>commentary to=functions.special_function <|constrain|>json<|message|>{args}<|call|>"),
        ] {
            assert_eq!(read(true, &text), want, "{text}");
        }
        let text = format!(
            "{THOUGHT}<|start|>assistant to=functions.special_function<|channel|>commentary json<|message|>{args}"
        );
        assert_eq!(
            read(true, &text),
            reply("I'm\nthinking", "", &[("special_function", args)])
        );
        // Without tools the call is not the client's: dropped.
        assert_eq!(read(false, &text), reply("I'm\nthinking", "", &[]));
    }

    #[test]
    fn arguments_stream_once_the_name_is_known() {
        let mut p = HarmonyParser::new(true);
        let mut events = p.push("<|channel|>commentary to=functions.f <|constrain|>json<|mess");
        assert_eq!(events, []);
        events.extend(p.push("age|>{\"a\""));
        events.extend(p.push(": 1}<|ca"));
        events.extend(p.finish());
        let call = |text: &str| {
            Event::Answer(ToolEvent::Arguments {
                index: 0,
                text: text.into(),
            })
        };
        assert_eq!(
            events,
            [
                Event::Answer(ToolEvent::Start {
                    index: 0,
                    name: "f".into()
                }),
                call("{\"a\""),
                call(": 1}"),
                call("<|ca"),
            ]
        );
    }

    #[test]
    fn builtin_recipients_are_dropped() {
        for text in [
            "<|channel|>analysis<|message|>I will execute python to say hello<|end|>\
             <|start|>assistant to=container.exec<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'",
            "<|channel|>analysis<|message|>I will execute python to say hello<|end|>\
             <|start|>assistant<|channel|>commentary to=python <|constrain|>code<|message|>print(\"hello\")",
        ] {
            assert_eq!(
                read(true, text),
                reply("I will execute python to say hello", "", &[])
            );
        }
        let text = "<|channel|>analysis to=browser.search<|message|>{\"query\": \"x\"}<|end|>\
                    <|start|>assistant<|channel|>final<|message|>Found.";
        assert_eq!(read(true, text), reply("", "Found.", &[]));
    }

    #[test]
    fn a_stray_commentary_header_is_skipped() {
        let want = reply("I'm\nthinking", "Hello", &[]);
        for text in [
            "<|channel|>commentary to=assistant<|channel|>analysis<|message|>I'm\nthinking<|end|>\
             <|start|>assistant<|channel|>final<|message|>Hello",
            "<|channel|>analysis<|message|>I'm\nthinking<|end|>\
             <|start|>assistant<|channel|>commentary to=assistant<|channel|>final<|message|>Hello",
        ] {
            assert_eq!(read(false, text), want, "{text}");
        }
    }

    #[test]
    fn a_constrained_final_answer() {
        let json = "{\"amount\": 123.45, \"date\": \"2025-12-03\"}";
        let text = format!(
            "<|channel|>analysis<|message|>I need to output JSON<|end|>\
             <|start|>assistant<|channel|>final <|constrain|>json<|message|>{json}"
        );
        assert_eq!(
            read(false, &text),
            reply("I need to output JSON", json, &[])
        );
    }

    #[test]
    fn cut_off_replies() {
        // Inside the thinking: all of it is reasoning.
        assert_eq!(
            read(false, "<|channel|>analysis<|message|>I'm\nthink"),
            reply("I'm\nthink", "", &[])
        );
        // Inside a header: markup, dropped.
        assert_eq!(
            read(true, &format!("{THOUGHT}<|start|>assistant<|channel|>fin")),
            reply("I'm\nthinking", "", &[])
        );
        assert_eq!(read(true, " to=functions.get_wea"), reply("", "", &[]));
        // Inside a call's arguments: the call keeps what it has.
        assert_eq!(
            read(
                true,
                "<|channel|>commentary to=functions.f<|message|>{\"a\": "
            ),
            reply("", "", &[("f", "{\"a\": ")])
        );
    }

    #[test]
    fn text_without_headers_is_content() {
        for text in ["{\"a\": 1}", " today is <b>fine</b>", "to", "<|im_end|>"] {
            assert_eq!(read(true, text), reply("", text, &[]), "{text}");
        }
    }

    #[test]
    fn templates_that_speak_harmony() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/chat_templates/openai-gpt-oss-120b.jinja"
        );
        assert!(template_speaks_harmony(
            &std::fs::read_to_string(path).unwrap()
        ));
        assert!(!template_speaks_harmony("{{ messages }}<|im_start|>"));
    }
}
