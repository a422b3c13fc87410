//! The Python the client tests run: a virtual environment in the target
//! directory with tests/client_libraries/requirements.txt installed from
//! PyPI (pinned: a new release changes what a client sends), once, and
//! again when that file changes. The system Python's packages stay as
//! they are.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const REQUIREMENTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/client_libraries/requirements.txt"
);

fn python() -> String {
    std::env::var("WICK_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The environment's Python, installed once for the tests running side by
/// side.
pub fn venv_python() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(install).clone()
}

fn install() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/client-libraries-venv");
    let bin = venv.join("bin/python");
    let requirements = std::fs::read_to_string(REQUIREMENTS).unwrap();
    let stamp = venv.join("requirements.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(requirements.as_str()) {
        return bin;
    }
    if !bin.exists() {
        let ok = Command::new(python())
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 with venv is needed for the client tests")
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
        .arg(REQUIREMENTS)
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
