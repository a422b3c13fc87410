//! wick's GGUF tokenizer must produce exactly llama.cpp's ids.

use std::path::PathBuf;

use candle_core::quantized::gguf_file::Content;
use wick::text::tokenizer::Tokenizer;

fn model_path() -> PathBuf {
    wick::load::model_fetch::default_model_path().expect("fetching the default model")
}

const REFERENCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/llama-cpp/tokenize.jsonl"
);

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

#[test]
fn matches_llama_cpp_ids() {
    let path = model_path();
    let mut file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let content = Content::read(&mut file).expect("read gguf");
    let tok = Tokenizer::from_gguf(&content).expect("build tokenizer");

    let reference = std::fs::read_to_string(REFERENCE).expect("read reference");
    let mut failures = Vec::new();
    let mut n = 0;
    for line in reference.lines().filter(|l| !l.trim().is_empty()) {
        let case: Case = serde_json::from_str(line).expect("parse reference line");
        n += 1;
        let ids = tok.encode(&case.text).expect("encode");
        if ids != case.ids {
            failures.push(format!(
                "{:?}\n  llama.cpp: {:?}\n  wick:      {:?}",
                case.text, case.ids, ids
            ));
        }
    }
    assert!(n > 0, "no reference cases in {REFERENCE}");
    assert!(
        failures.is_empty(),
        "{} of {n} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
