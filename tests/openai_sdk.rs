//! Runs the official `openai` Python SDK (tests/openai_sdk/) against a
//! started `wick serve` behind an API key: a real client, sync and async,
//! a model that thinks, its reasoning shown apart from its answer, and an
//! agent loop on a Mistral template. The SDK and pytest are the pinned ones
//! of tests/client_libraries/requirements.txt ([`common::venv`]).

mod common;

use std::process::Command;

use common::venv::venv_python;
use common::Server;

/// Every SDK call goes through the API-key check, as on a real deployment.
const KEY: &str = "sk-wick-sdk-test";
const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_sdk");

/// Runs the pytest file `file` of tests/openai_sdk/ against `server`.
fn pytest(file: &str, server: &Server) {
    let status = Command::new(venv_python())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(format!("{DIR}/{file}"))
        .env("WICK_BASE_URL", &server.base)
        .env("WICK_API_KEY", KEY)
        .status()
        .expect("running pytest");
    assert!(status.success(), "the openai SDK tests in {file} failed");
}

#[test]
fn openai_python_sdk_against_wick() {
    let server = Server::start(&["--api-key", KEY]);
    pytest("test_openai_sdk.py", &server);
}

/// The default model under a template that makes it think (see
/// test_reasoning.py).
#[test]
fn openai_python_sdk_shows_reasoning_apart() {
    let template = format!("{DIR}/thinking.jinja");
    let server = Server::start(&["--api-key", KEY, "--chat-template", &template]);
    pytest("test_reasoning.py", &server);
}

/// The default model under Mistral Nemo's template, which takes back only
/// 9-character call ids (see test_mistral_tools.py).
#[test]
fn openai_python_sdk_agent_loop_on_a_mistral_template() {
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_templates/mistralai-Mistral-Nemo-Instruct-2407.jinja"
    );
    let server = Server::start(&["--api-key", KEY, "--chat-template", template]);
    pytest("test_mistral_tools.py", &server);
}

/// `client.embeddings.create` (see test_embeddings.py).
#[test]
fn openai_python_sdk_embeddings() {
    let server = Server::start(&["--api-key", KEY]);
    pytest("test_embeddings.py", &server);
}

/// Images through the `openai` SDK (chat and Responses) and the
/// `anthropic` SDK, on the tiny Gemma 3 with images (see test_images.py).
#[test]
fn sdks_send_images() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gemma3vl-tiny");
    let server = Server::start(&["--api-key", KEY, "--model", model]);
    pytest("test_images.py", &server);
}
