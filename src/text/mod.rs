//! Between text and token ids: tokenizing, chat templates, incremental
//! detokenizing, stop strings and tool calls parsed from the output stream.

pub mod chat_template;
pub mod detokenizer;
pub mod harmony;
pub mod reasoning;
pub mod stop;
pub mod stream;
pub mod tokenizer;
pub mod tool_parser;
