//! A model's thinking, told from its answer as the text streams in.
//!
//! Models that think (Qwen3, SmolLM3, DeepSeek-R1's distills) write
//! `<think>…</think>` before their answer; clients expect the thinking in
//! `reasoning_content` and only the answer in `content`, as vLLM's and
//! llama.cpp's servers send them. Some templates open the block in the
//! prompt itself, so the output starts inside it. Text that might be the
//! start of a tag is held back until the next piece settles it.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// A piece of output, as thinking or as answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not yet known whether the output opens a block.
    Start,
    Thinking,
    /// Just past the block: leading whitespace is the separator, not answer.
    Closed,
    Answer,
}

#[derive(Debug, Clone)]
pub struct ReasoningParser {
    state: State,
    held: String,
}

/// One delta's text as pieces: all answer where the template does not think
/// (`thinking` is `None`), else split by `thinking`, whatever it held back
/// settled when `last`.
pub fn split(thinking: Option<&mut ReasoningParser>, text: String, last: bool) -> Vec<Piece> {
    let Some(thinking) = thinking else {
        return vec![Piece::Content(text)];
    };
    let mut pieces = thinking.push(&text);
    if last {
        pieces.extend(thinking.finish());
    }
    pieces
}

impl ReasoningParser {
    /// `opened`: the prompt ended inside a `<think>` block.
    pub fn new(opened: bool) -> Self {
        ReasoningParser {
            state: if opened {
                State::Thinking
            } else {
                State::Start
            },
            held: String::new(),
        }
    }

    /// Whether a rendered prompt leaves the model inside a thinking block.
    pub fn prompt_opens_block(prompt: &str) -> bool {
        prompt.trim_end().ends_with(OPEN)
    }

    /// Whether a chat template writes thinking blocks at all.
    pub fn template_thinks(source: &str) -> bool {
        source.contains(OPEN) && source.contains(CLOSE)
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let rest = self.held.trim_start();
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        self.held = after.to_string();
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(rest) {
                        return out;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking => match self.held.find(CLOSE) {
                    Some(at) => {
                        push(&mut out, Piece::Reasoning(self.held[..at].to_string()));
                        self.held.drain(..at + CLOSE.len());
                        self.state = State::Closed;
                    }
                    None => {
                        let keep = partial_tag(&self.held, CLOSE);
                        let done = self.held.len() - keep;
                        push(&mut out, Piece::Reasoning(self.held[..done].to_string()));
                        self.held.drain(..done);
                        return out;
                    }
                },
                State::Closed => {
                    let rest = self.held.trim_start();
                    if rest.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = rest.to_string();
                    self.state = State::Answer;
                }
                State::Answer => {
                    push(&mut out, Piece::Content(std::mem::take(&mut self.held)));
                    return out;
                }
            }
        }
    }

    /// What is still held back, once the output has ended: an unfinished
    /// block is thinking, anything else answer.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.state {
            State::Thinking => push(&mut out, Piece::Reasoning(held)),
            _ => push(&mut out, Piece::Content(held)),
        }
        out
    }
}

fn push(out: &mut Vec<Piece>, piece: Piece) {
    let (Piece::Reasoning(t) | Piece::Content(t)) = &piece;
    if !t.is_empty() {
        out.push(piece);
    }
}

/// Bytes at the end of `text` that could begin `tag`.
fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Piece::{Content, Reasoning};

    /// Feeds `pieces` one by one, then finishes; merges neighbours of a kind.
    fn run(opened: bool, pieces: &[&str]) -> Vec<Piece> {
        let mut p = ReasoningParser::new(opened);
        let mut all: Vec<Piece> = pieces.iter().flat_map(|t| p.push(t)).collect();
        all.extend(p.finish());
        let mut merged: Vec<Piece> = Vec::new();
        for piece in all {
            match (merged.last_mut(), piece) {
                (Some(Reasoning(a)), Reasoning(b)) | (Some(Content(a)), Content(b)) => {
                    a.push_str(&b)
                }
                (_, piece) => merged.push(piece),
            }
        }
        merged
    }

    fn r(s: &str) -> Piece {
        Reasoning(s.into())
    }

    fn c(s: &str) -> Piece {
        Content(s.into())
    }

    #[test]
    fn a_block_then_an_answer() {
        let want = vec![r("\nLet me see.\n"), c("It is 4.")];
        assert_eq!(
            run(false, &["<think>\nLet me see.\n</think>\n\nIt is 4."]),
            want
        );
        // Tags split across pieces anywhere.
        let pieces = [
            "<th",
            "ink>\nLet me",
            " see.\n</",
            "thi",
            "nk>",
            "\n\n",
            "It is 4.",
        ];
        assert_eq!(run(false, &pieces), want);
    }

    #[test]
    fn a_prompt_that_opens_the_block() {
        assert_eq!(run(true, &["Hmm.</think>Yes."]), vec![r("Hmm."), c("Yes.")]);
        assert!(ReasoningParser::prompt_opens_block(
            "<|im_start|>assistant\n<think>\n"
        ));
        assert!(!ReasoningParser::prompt_opens_block(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
    }

    #[test]
    fn no_block_is_all_answer() {
        assert_eq!(
            run(false, &["Just", " an answer."]),
            vec![c("Just an answer.")]
        );
        // A lone `<` that turns out not to open a tag.
        assert_eq!(run(false, &["<", "b>bold</b>"]), vec![c("<b>bold</b>")]);
        assert_eq!(run(false, &[" <thi"]), vec![c(" <thi")]);
    }

    #[test]
    fn an_unfinished_block_is_thinking() {
        assert_eq!(
            run(false, &["<think>still go", "ing</thi"]),
            vec![r("still going</thi")]
        );
    }

    #[test]
    fn tags_inside_the_answer_are_answer() {
        assert_eq!(
            run(false, &["<think>a</think>b <think>c</think>"]),
            vec![r("a"), c("b <think>c</think>")]
        );
    }

    #[test]
    fn templates_that_think() {
        assert!(ReasoningParser::template_thinks(
            "{% if x %}<think>\n\n</think>\n\n{% endif %}"
        ));
        assert!(!ReasoningParser::template_thinks("{{ messages }}"));
    }
}
