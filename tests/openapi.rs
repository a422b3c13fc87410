//! `GET /openapi.json` against standard validators, with real traffic:
//! `tests/openapi/validate.py` checks the document against OpenAPI 3.1's
//! schema (openapi-spec-validator), then sends a request to every route it
//! lists, whole and streamed, refused ones too, and validates each request
//! and reply against it (openapi-core), and each streamed event against the
//! schema the document names for it. Runs in the client tests' virtual
//! environment (`tests/client_libraries/requirements.txt`).

mod common;

use std::process::Command;

use common::venv::venv_python;
use common::Server;

#[test]
fn real_requests_and_replies_match_the_openapi_document() {
    let python = venv_python();
    let server = Server::start(&[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openapi/validate.py");
    let out = Command::new(python)
        .arg(script)
        .arg(&server.base)
        .output()
        .expect("run validate.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("ok: "), "{stdout}");
}
