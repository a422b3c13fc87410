//! llama.cpp's own tokenizer test vectors: for each vocabulary-only GGUF of
//! its source distribution, the texts of `<vocab>.gguf.inp` must encode to the
//! ids of `<vocab>.gguf.out` (what `tests/test-tokenizer-0.cpp` checks), and
//! those ids must decode back to the text. Gemma 3's GGUF and vectors are
//! made here with llama.cpp (`scripts/make_gemma3_vocab.py`), so they live
//! in their own directory, as do the `tekken` pre-tokenizer's vectors
//! (`scripts/make_tekken_vocab.py`).

use std::path::PathBuf;

use candle_core::quantized::gguf_file::Content;
use wick::text::tokenizer::Tokenizer;

/// llama.cpp's own vocabularies, under `tests/fixtures`.
const LLAMA_CPP: &str = "llama-cpp/vocab";

fn fixture(dir: &str, file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir)
        .join(file)
}

/// The cases as test-tokenizer-0 reads them: texts separated by
/// `\n__ggml_vocab_test__\n` (most files end with one, gemma-4's with its
/// last text), one line of space-separated ids per text.
fn cases(dir: &str, vocab: &str) -> Vec<(String, Vec<u32>)> {
    let read = |ext: &str| {
        let path = fixture(dir, &format!("ggml-vocab-{vocab}.gguf.{ext}"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let inp = read("inp");
    let inp = inp.strip_suffix("\n__ggml_vocab_test__\n").unwrap_or(&inp);
    let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let out = read("out");
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len(), "{vocab}: inp and out disagree");
    texts.into_iter().map(String::from).zip(ids).collect()
}

fn read(dir: &str, vocab: &str) -> Content {
    let path = fixture(dir, &format!("ggml-vocab-{vocab}.gguf"));
    let mut file = std::fs::File::open(&path).unwrap();
    Content::read(&mut file).expect("read gguf")
}

fn check(dir: &str, vocab: &str) {
    check_with(dir, vocab, &read(dir, vocab));
}

/// `vocab`'s vectors (in `dir`) on the vocabulary `content`.
fn check_with(dir: &str, vocab: &str, content: &Content) {
    let tok = Tokenizer::from_gguf(content).expect("build tokenizer");
    let cases = cases(dir, vocab);
    let mut failures = Vec::new();
    for (text, want) in &cases {
        // test-tokenizer-0 tokenizes with add_special = false: no BOS or EOS.
        let mut ids = tok.encode(text).unwrap();
        if tok.add_bos() {
            assert_eq!(ids.first().copied(), tok.bos_id(), "{vocab}: BOS first");
            ids.remove(0);
        }
        if tok.add_eos() {
            ids.pop();
        }
        if &ids != want {
            failures.push(format!(
                "encode {text:?}\n  llama.cpp: {want:?}\n  wick:      {ids:?}"
            ));
        }
        // llama-server's /detokenize of these ids; llama.cpp's
        // llama_detokenize would also apply transformers' "clean up
        // tokenization spaces" for gpt-2 and llama-bpe, which no server
        // output does.
        let back = tok.decode(want).unwrap();
        if &back != text {
            failures.push(format!("decode {want:?}\n  want {text:?}\n  got  {back:?}"));
        }
    }
    assert!(cases.len() >= 40, "{vocab}: only {} cases", cases.len());
    assert!(
        failures.is_empty(),
        "{vocab}: {} of {} checks differ:\n{}",
        failures.len(),
        2 * cases.len(),
        failures.join("\n")
    );
    eprintln!(
        "{vocab}: {} texts encode and decode as llama.cpp's",
        cases.len()
    );
}

#[test]
fn llama_spm() {
    check(LLAMA_CPP, "llama-spm");
}

#[test]
fn phi_3() {
    check(LLAMA_CPP, "phi-3");
}

#[test]
fn llama_bpe() {
    check(LLAMA_CPP, "llama-bpe");
}

#[test]
fn qwen2() {
    check(LLAMA_CPP, "qwen2");
}

#[test]
fn gpt_2() {
    check(LLAMA_CPP, "gpt-2");
}

#[test]
fn qwen35() {
    check(LLAMA_CPP, "qwen35");
}

/// Mistral's `tekken` pre-tokenizer on llama.cpp's llama-bpe vocabulary
/// with only `tokenizer.ggml.pre` changed, as
/// `scripts/make_tekken_vocab.py` gave it to `llama-tokenize`.
#[test]
fn tekken() {
    use candle_core::quantized::gguf_file::Value;
    let mut content = read(LLAMA_CPP, "llama-bpe");
    content
        .metadata
        .insert("tokenizer.ggml.pre".into(), Value::String("tekken".into()));
    check_with("tekken-vocab", "tekken", &content);
}

#[test]
fn gemma_4() {
    check(LLAMA_CPP, "gemma-4");
}

#[test]
fn gemma_3() {
    check("gemma3-vocab", "gemma-3");
}
