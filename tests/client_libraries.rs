//! Runs the client libraries that build a forced tool call from a pydantic
//! model, instructor and langchain (tests/client_libraries/), against a
//! started `wick serve` on the default model: their schemas leave
//! `additionalProperties` out, and the call still ends in valid JSON with
//! only the model's keys.
//!
//! The libraries pin an `openai` of their own, so they go into a virtual
//! environment in the target directory, installed from PyPI once (again
//! when requirements.txt changes), leaving the system Python's packages to
//! tests/openai_sdk.rs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Server;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/client_libraries");

fn python() -> String {
    std::env::var("WICK_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The virtual environment's Python, with requirements.txt installed.
fn venv_python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/client-libraries-venv");
    let bin = venv.join("bin/python");
    let requirements = std::fs::read_to_string(format!("{DIR}/requirements.txt")).unwrap();
    let stamp = venv.join("requirements.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(requirements.as_str()) {
        return bin;
    }
    if !bin.exists() {
        let ok = Command::new(python())
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 with venv is needed for the client library tests")
            .success();
        assert!(ok, "python3 -m venv failed");
    }
    let ok = Command::new(&bin)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(format!("{DIR}/requirements.txt"))
        .status()
        .expect("running pip")
        .success();
    assert!(
        ok,
        "pip install -r tests/client_libraries/requirements.txt failed"
    );
    std::fs::write(&stamp, requirements).unwrap();
    bin
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
