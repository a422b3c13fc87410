//! Runs the client libraries that build a forced tool call from a pydantic
//! model, instructor and langchain (tests/client_libraries/), against a
//! started `wick serve` on the default model: their schemas leave
//! `additionalProperties` out, and the call still ends in valid JSON with
//! only the model's keys. And the Responses API's clients, the `openai`
//! SDK's `responses` calls and openai-agents.
//!
//! The libraries are pinned in requirements.txt and installed into a
//! virtual environment of their own ([`common::venv`]).

mod common;

use std::process::Command;

use common::venv::venv_python;
use common::Server;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/client_libraries");

/// On the default model: langchain `bind_tools`, pydantic-ai and
/// openai-agents' chat-completions model with `tool_choice` auto, though
/// its template has no tool format (test_tools_auto.py), and langchain's
/// OpenAIEmbeddings (test_embeddings.py).
#[test]
fn agent_libraries_use_tools_on_the_default_model() {
    let python = venv_python();
    let server = Server::start(&[]);
    let status = Command::new(python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(format!("{DIR}/test_tools_auto.py"))
        .arg(format!("{DIR}/test_embeddings.py"))
        .env("WICK_BASE_URL", &server.base)
        .status()
        .expect("running pytest");
    assert!(status.success(), "the agent library tests failed");
}

#[test]
fn instructor_and_langchain_get_closed_objects() {
    let python = venv_python();
    let server = Server::start(&[]);
    let status = Command::new(python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(format!("{DIR}/test_structured_output.py"))
        .env("WICK_BASE_URL", &server.base)
        .status()
        .expect("running pytest");
    assert!(status.success(), "the client library tests failed");
}

/// The `openai` SDK's Responses calls (create, stream, parse, retrieve,
/// delete) and an openai-agents Agent with one function tool, run to its
/// final answer through `/v1/responses` (test_responses.py). Under Qwen2.5's
/// template, ChatML as the default model's with Hermes tool calls: after
/// its forced call the agent sends its next turn without `tool_choice`,
/// which needs a tool format wick can read.
#[test]
fn openai_responses_and_agents() {
    let python = venv_python();
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja"
    );
    let server = Server::start(&["--chat-template", template]);
    let status = Command::new(python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(format!("{DIR}/test_responses.py"))
        .env("WICK_BASE_URL", &server.base)
        .status()
        .expect("running pytest");
    assert!(status.success(), "the Responses API client tests failed");
}

/// The `anthropic` SDK against `/v1/messages` behind an API key (sent as
/// `x-api-key`): a chat, a stream, a tool round trip, count_tokens and
/// errors (test_anthropic.py).
#[test]
fn anthropic_sdk_messages() {
    let python = venv_python();
    let key = "sk-ant-wick-test";
    let server = Server::start(&["--api-key", key]);
    let status = Command::new(python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(format!("{DIR}/test_anthropic.py"))
        .env("WICK_BASE_URL", &server.base)
        .env("WICK_API_KEY", key)
        .status()
        .expect("running pytest");
    assert!(status.success(), "the anthropic SDK tests failed");
}
