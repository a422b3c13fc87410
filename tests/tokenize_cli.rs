//! `wick tokenize` on llama.cpp's vocabulary-only GGUFs: it needs nothing
//! but the tokenizer, and refuses a vocabulary it cannot reproduce in one
//! line naming it.

use std::path::PathBuf;
use std::process::{Command, Output};

use candle_core::quantized::gguf_file::{self, Content, Value};

fn vocab(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llama-cpp/vocab")
        .join(format!("ggml-vocab-{name}.gguf"))
}

fn tokenize(model: &std::path::Path, text: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wick"))
        // Errors are one line unless a backtrace is asked for.
        .env_remove("RUST_BACKTRACE")
        .args(["tokenize", "--model"])
        .arg(model)
        .arg(text)
        .output()
        .expect("run wick")
}

fn ids(out: &Output) -> Vec<u32> {
    assert!(
        out.status.success(),
        "wick tokenize failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON list of ids")
}

/// Ids from llama.cpp's `.out` vectors, with BOS as each GGUF asks.
#[test]
fn tokenizes_vocab_only_files() {
    // Llama 2: BOS, then " Hello world" with its space prefix.
    assert_eq!(
        ids(&tokenize(&vocab("llama-spm"), "Hello world")),
        [1, 15043, 3186]
    );
    // Llama 3 adds BOS too (llama.cpp's default for llama-bpe).
    assert_eq!(
        ids(&tokenize(&vocab("llama-bpe"), "Hello world")),
        [128000, 9906, 1917]
    );
    assert_eq!(ids(&tokenize(&vocab("qwen2"), "Hello world")), [9707, 1879]);
}

/// A copy of a vocabulary-only file with one metadata value replaced.
fn with_metadata(name: &str, key: &str, value: Value, dir: &tempfile::TempDir) -> PathBuf {
    let mut file = std::fs::File::open(vocab(name)).unwrap();
    let mut content = Content::read(&mut file).unwrap();
    content.metadata.insert(key.to_string(), value);
    let metadata: Vec<(&str, &Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let path = dir.path().join(format!("{name}-edited.gguf"));
    let mut out = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut out, &metadata, &[]).unwrap();
    path
}

fn refusal(out: &Output) -> String {
    assert!(!out.status.success(), "wick tokenize accepted it");
    let stderr = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    stderr
}

#[test]
fn refuses_unsupported_vocabularies_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let t5 = with_metadata(
        "llama-spm",
        "tokenizer.ggml.model",
        Value::String("t5".into()),
        &dir,
    );
    let err = refusal(&tokenize(&t5, "Hello"));
    assert!(
        err.contains("unsupported GGUF tokenizer model \"t5\""),
        "{err}"
    );

    let chameleon = with_metadata(
        "llama-bpe",
        "tokenizer.ggml.pre",
        Value::String("chameleon".into()),
        &dir,
    );
    let err = refusal(&tokenize(&chameleon, "Hello"));
    assert!(
        err.contains("unsupported GGUF pre-tokenizer \"chameleon\""),
        "{err}"
    );
}
