//! Runs the official `openai` Python SDK (tests/openai_sdk/) against a
//! started `wick serve` behind an API key: a real client, sync and async.

mod common;

use std::process::Command;

fn python() -> String {
    std::env::var("WICK_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Installs the SDK and pytest from PyPI when they are missing.
fn ensure_packages() {
    let have = Command::new(python())
        .args(["-c", "import openai, pytest"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        let ok = Command::new(python())
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "openai",
                "pytest",
            ])
            .status()
            .expect("python3 with pip is needed for the openai SDK test")
            .success();
        assert!(ok, "pip install openai pytest failed");
    }
}

#[test]
fn openai_python_sdk_against_wick() {
    ensure_packages();
    // Every SDK call goes through the API-key check, as on a real deployment.
    let key = "sk-wick-sdk-test";
    let server = common::Server::start(&["--api-key", key]);
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_sdk");
    let status = Command::new(python())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", dir])
        .env("WICK_BASE_URL", &server.base)
        .env("WICK_API_KEY", key)
        .status()
        .expect("running pytest");
    assert!(status.success(), "the openai SDK tests failed");
}
