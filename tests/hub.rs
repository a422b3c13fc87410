//! `--model ORG/NAME` through a Hugging Face hub cache that the test lays
//! out as `huggingface_hub` does (refs, snapshots linking into blobs), with
//! the llama-tiny fixture as the checkpoint. No network is used.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::Device;
use wick::hub::{resolve_in, Hub};
use wick::loader::{load, LoadOptions};

const REPO: &str = "org/tiny-llama";
const REVISION: &str = "0123456789abcdef0123456789abcdef01234567";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama-tiny")
}

/// A cache holding the fixture as `REPO`'s main revision; returns the
/// snapshot directory.
fn populate(cache: &Path) -> PathBuf {
    let repo = cache.join("models--org--tiny-llama");
    let snapshot = repo.join("snapshots").join(REVISION);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), REVISION).unwrap();
    for (i, entry) in std::fs::read_dir(fixture()).unwrap().enumerate() {
        let entry = entry.unwrap();
        let blob = repo.join("blobs").join(format!("blob{i}"));
        std::fs::copy(entry.path(), &blob).unwrap();
        std::os::unix::fs::symlink(&blob, snapshot.join(entry.file_name())).unwrap();
    }
    snapshot
}

#[test]
fn a_populated_cache_resolves_offline_and_loads() {
    let cache = tempfile::tempdir().unwrap();
    let snapshot = populate(cache.path());
    let dir = resolve_in(cache.path(), REPO, &Hub::Offline).unwrap();
    assert_eq!(dir, snapshot);
    let loaded = load(&dir, &LoadOptions::default(), &Device::Cpu).unwrap();
    assert_eq!(loaded.name, REPO);
    assert_eq!(loaded.model.info().num_layers, 2);
}

#[test]
fn a_missing_shard_is_named_with_the_directory() {
    let cache = tempfile::tempdir().unwrap();
    let snapshot = populate(cache.path());
    let shard = "model-00003-of-00004.safetensors";
    std::fs::remove_file(snapshot.join(shard)).unwrap();
    let e = format!(
        "{:#}",
        resolve_in(cache.path(), REPO, &Hub::Offline).unwrap_err()
    );
    assert!(e.contains(shard), "{e}");
    assert!(
        e.contains(
            &cache
                .path()
                .join("models--org--tiny-llama")
                .display()
                .to_string()
        ),
        "{e}"
    );
    assert!(e.contains("HF_HUB_OFFLINE"), "{e}");
}

#[test]
fn an_unknown_repo_names_the_files_it_needs() {
    let cache = tempfile::tempdir().unwrap();
    let e = format!(
        "{:#}",
        resolve_in(cache.path(), "org/absent", &Hub::Offline).unwrap_err()
    );
    for needed in ["config.json", "tokenizer.json", "model.safetensors"] {
        assert!(e.contains(needed), "{e}");
    }
    assert!(e.contains("models--org--absent"), "{e}");
}

#[test]
fn an_unreachable_hub_is_reported() {
    let cache = tempfile::tempdir().unwrap();
    // Nothing listens on port 1 of the loopback: the request fails at once.
    let hub = Hub::Online("http://127.0.0.1:1".into());
    let e = format!(
        "{:#}",
        resolve_in(cache.path(), "org/absent", &hub).unwrap_err()
    );
    assert!(
        e.contains("could not be reached") && e.contains("config.json"),
        "{e}"
    );
}

#[test]
fn the_cli_finds_a_repo_id_through_hf_hub_cache() {
    let cache = tempfile::tempdir().unwrap();
    populate(cache.path());
    let out = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args(["tokenize", "--model", REPO, "<|im_start|>hi"])
        .env("HF_HUB_CACHE", cache.path())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
    let want = wick::loader::load_tokenizer(&fixture())
        .unwrap()
        .encode("<|im_start|>hi")
        .unwrap();
    assert_eq!(ids, want);

    let out = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args(["tokenize", "--model", "org/absent", "hi"])
        .env("HF_HUB_CACHE", cache.path())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("models--org--absent") && err.contains("config.json"),
        "{err}"
    );
}
