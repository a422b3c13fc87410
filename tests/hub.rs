//! `--model ORG/NAME` through a Hugging Face hub cache that the tests lay
//! out as `huggingface_hub` does (refs, snapshots linking into blobs), with
//! the sharded llama-tiny fixture as the checkpoint. Downloads go to a
//! stand-in hub on a loopback port; nothing leaves the machine.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use candle_core::Device;
use serde_json::json;
use wick::load::hub::{resolve_in, Hub};
use wick::load::loader::{load, LoadOptions, Projector};

const REPO: &str = "org/tiny-llama";
const REPO_DIR: &str = "models--org--tiny-llama";
const REVISION: &str = "0123456789abcdef0123456789abcdef01234567";
const SHARD: &str = "model-00003-of-00004.safetensors";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama-tiny")
}

fn fixture_files() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fixture())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Adds the fixture to `cache` as snapshot `revision` of `REPO` (files
/// linking into `blobs/`, as huggingface_hub stores them) and points
/// `refs/main` at it; returns the snapshot directory.
fn add_snapshot(cache: &Path, revision: &str) -> PathBuf {
    let repo = cache.join(REPO_DIR);
    let snapshot = repo.join("snapshots").join(revision);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), revision).unwrap();
    for name in fixture_files() {
        let blob = repo.join("blobs").join(format!("{revision}-{name}"));
        std::fs::copy(fixture().join(&name), &blob).unwrap();
        std::os::unix::fs::symlink(&blob, snapshot.join(&name)).unwrap();
    }
    snapshot
}

fn error(result: anyhow::Result<PathBuf>) -> String {
    format!("{:#}", result.unwrap_err())
}

#[test]
fn a_populated_cache_resolves_offline_and_loads() {
    let cache = tempfile::tempdir().unwrap();
    let snapshot = add_snapshot(cache.path(), REVISION);
    let dir = resolve_in(cache.path(), REPO, &Hub::Offline).unwrap();
    assert_eq!(dir, snapshot);
    let loaded = load(&dir, &LoadOptions::default(), &Device::Cpu).unwrap();
    assert_eq!(loaded.name, REPO);
    assert_eq!(loaded.model.info().num_layers, 2);
}

#[test]
fn refs_main_picks_the_revision() {
    let cache = tempfile::tempdir().unwrap();
    let old = add_snapshot(cache.path(), REVISION);
    let newer = add_snapshot(cache.path(), "fedcba9876543210fedcba9876543210fedcba98");
    assert_eq!(
        resolve_in(cache.path(), REPO, &Hub::Offline).unwrap(),
        newer
    );

    // The revision refs/main names is incomplete: that is an error, even
    // though an older snapshot has everything.
    std::fs::remove_file(newer.join(SHARD)).unwrap();
    let e = error(resolve_in(cache.path(), REPO, &Hub::Offline));
    assert!(e.contains(SHARD), "{e}");

    std::fs::write(cache.path().join(REPO_DIR).join("refs/main"), REVISION).unwrap();
    assert_eq!(resolve_in(cache.path(), REPO, &Hub::Offline).unwrap(), old);
}

#[test]
fn a_missing_shard_is_named_with_the_directory() {
    let cache = tempfile::tempdir().unwrap();
    let snapshot = add_snapshot(cache.path(), REVISION);
    std::fs::remove_file(snapshot.join(SHARD)).unwrap();
    let e = error(resolve_in(cache.path(), REPO, &Hub::Offline));
    assert!(e.contains(&format!("lacks {SHARD} under")), "{e}");
    let repo_dir = cache.path().join(REPO_DIR);
    assert!(e.contains(&repo_dir.display().to_string()), "{e}");
    assert!(e.contains("HF_HUB_OFFLINE"), "{e}");
    assert!(e.contains("HF_HUB_CACHE or HF_HOME"), "{e}");
}

#[test]
fn an_unknown_repo_names_the_files_it_needs() {
    let cache = tempfile::tempdir().unwrap();
    let e = error(resolve_in(cache.path(), "org/absent", &Hub::Offline));
    assert!(
        e.contains("lacks config.json, tokenizer.json, model.safetensors (or model.safetensors.index.json and its shards) under"),
        "{e}"
    );
    let repo_dir = cache.path().join("models--org--absent");
    assert!(e.contains(&repo_dir.display().to_string()), "{e}");
}

fn online(endpoint: &str) -> Hub {
    Hub::Online {
        endpoint: endpoint.to_string(),
        token: None,
    }
}

#[test]
fn an_unreachable_hub_is_reported() {
    let cache = tempfile::tempdir().unwrap();
    // Nothing listens on port 1 of the loopback: the request fails at once.
    let e = error(resolve_in(
        cache.path(),
        "org/absent",
        &online("http://127.0.0.1:1"),
    ));
    assert!(
        e.contains("the hub at http://127.0.0.1:1 could not be reached")
            && e.contains("Connection refused")
            && e.contains("config.json"),
        "{e}"
    );
}

#[test]
fn a_silent_hub_times_out_quickly() {
    let cache = tempfile::tempdir().unwrap();
    // Connections are queued by the kernel but never answered.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let start = Instant::now();
    let e = error(resolve_in(cache.path(), "org/absent", &online(&endpoint)));
    assert!(start.elapsed() < Duration::from_secs(20), "{e}");
    assert!(
        e.contains("could not be reached") && e.contains("timed out"),
        "{e}"
    );
}

/// A stand-in for the hub on a loopback port, serving files as one repo
/// at `REVISION` through the two calls hf-hub makes (the repo's file list,
/// and ranged file downloads); it records the files asked for.
struct FakeHub {
    endpoint: String,
    downloads: Arc<Mutex<Vec<String>>>,
}

/// What a [`FakeHub`] serves: a repo id, and each file's name in the repo
/// and where its bytes are.
struct Served {
    repo: String,
    files: Vec<(String, PathBuf)>,
}

impl FakeHub {
    /// The llama-tiny fixture as `REPO`.
    fn start() -> FakeHub {
        let files = fixture_files()
            .into_iter()
            .map(|f| (f.clone(), fixture().join(f)))
            .collect();
        FakeHub::serving(REPO, files)
    }

    fn serving(repo: &str, files: Vec<(String, PathBuf)>) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let downloads = Arc::new(Mutex::new(Vec::new()));
        let log = downloads.clone();
        let served = Served {
            repo: repo.to_string(),
            files,
        };
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                answer(stream, &log, &served);
            }
        });
        FakeHub {
            endpoint,
            downloads,
        }
    }

    /// Files whose full contents were downloaded, in order.
    fn downloads(&self) -> Vec<String> {
        self.downloads.lock().unwrap().clone()
    }
}

/// Answers one HTTP/1.1 request, then closes the connection.
fn answer(mut stream: TcpStream, downloads: &Mutex<Vec<String>>, served: &Served) {
    let repo = &served.repo;
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request = String::new();
    reader.read_line(&mut request).unwrap();
    let path = request.split(' ').nth(1).unwrap_or_default().to_string();
    let mut range = None;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        if header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("range") {
                range = value.trim().strip_prefix("bytes=").map(str::to_string);
            }
        }
    }
    let file = path
        .strip_prefix(&format!("/{repo}/resolve/main/"))
        .and_then(|f| served.files.iter().find(|(name, _)| name == f))
        .and_then(|(name, at)| Some((name.clone(), std::fs::read(at).ok()?)));
    let (status, headers, body) = if path == format!("/api/models/{repo}/revision/main") {
        let siblings: Vec<_> = served
            .files
            .iter()
            .map(|(f, _)| json!({ "rfilename": f }))
            .collect();
        let body = json!({ "sha": REVISION, "siblings": siblings });
        ("200 OK", String::new(), body.to_string().into_bytes())
    } else if let Some((name, data)) = file {
        // hf-hub first asks for byte 0 only (for the size, ETag and
        // commit), then for everything from its resume point.
        let (start, end) = match range.as_deref().and_then(|r| r.split_once('-')) {
            Some((s, e)) => (s.parse().unwrap(), e.parse().unwrap_or(data.len() - 1)),
            None => (0, data.len() - 1),
        };
        if start == 0 && end == data.len() - 1 {
            downloads.lock().unwrap().push(name.clone());
        }
        let headers = format!(
            "etag: \"etag-{name}\"\r\nx-repo-commit: {REVISION}\r\ncontent-range: bytes {start}-{end}/{}\r\n",
            data.len()
        );
        ("206 Partial Content", headers, data[start..=end].to_vec())
    } else {
        ("404 Not Found", String::new(), Vec::new())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n{headers}\r\n",
        body.len()
    );
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|_| stream.write_all(&body));
}

#[test]
fn a_reachable_hub_fills_an_empty_cache() {
    let hub = FakeHub::start();
    let cache = tempfile::tempdir().unwrap();
    let dir = resolve_in(cache.path(), REPO, &online(&hub.endpoint)).unwrap();
    assert_eq!(
        dir,
        cache.path().join(REPO_DIR).join("snapshots").join(REVISION)
    );
    let refs_main = cache.path().join(REPO_DIR).join("refs/main");
    assert_eq!(std::fs::read_to_string(refs_main).unwrap(), REVISION);
    // Everything a load uses, and nothing else the repo has.
    let mut fetched = hub.downloads();
    fetched.sort();
    let used = [
        "config.json",
        "tokenizer.json",
        "model.safetensors.index.json",
        "tokenizer_config.json",
        "generation_config.json",
        "chat_template.jinja",
    ];
    let wanted: Vec<String> = fixture_files()
        .into_iter()
        .filter(|f| f.ends_with(".safetensors") || used.contains(&f.as_str()))
        .collect();
    assert_eq!(fetched, wanted);
    for file in &wanted {
        assert_eq!(
            std::fs::read(dir.join(file)).unwrap(),
            std::fs::read(fixture().join(file)).unwrap(),
            "{file}"
        );
    }
    let loaded = load(&dir, &LoadOptions::default(), &Device::Cpu).unwrap();
    assert_eq!(loaded.model.info().num_layers, 2);

    // Complete now: resolving again asks the hub nothing.
    assert_eq!(
        resolve_in(cache.path(), REPO, &online("http://127.0.0.1:1")).unwrap(),
        dir
    );
}

#[test]
fn a_reachable_hub_supplies_only_the_missing_files() {
    let hub = FakeHub::start();
    let cache = tempfile::tempdir().unwrap();
    let snapshot = add_snapshot(cache.path(), REVISION);
    std::fs::remove_file(snapshot.join(SHARD)).unwrap();
    std::fs::remove_file(snapshot.join("tokenizer.json")).unwrap();
    let dir = resolve_in(cache.path(), REPO, &online(&hub.endpoint)).unwrap();
    assert_eq!(dir, snapshot);
    assert_eq!(hub.downloads(), ["tokenizer.json", SHARD]);
    assert_eq!(
        std::fs::read(dir.join(SHARD)).unwrap(),
        std::fs::read(fixture().join(SHARD)).unwrap()
    );
}

#[test]
fn a_stale_revision_is_not_mixed_with_the_hubs() {
    let hub = FakeHub::start();
    let cache = tempfile::tempdir().unwrap();
    let stale = add_snapshot(cache.path(), "fedcba9876543210fedcba9876543210fedcba98");
    std::fs::remove_file(stale.join(SHARD)).unwrap();
    let dir = resolve_in(cache.path(), REPO, &online(&hub.endpoint)).unwrap();
    assert_eq!(
        dir,
        cache.path().join(REPO_DIR).join("snapshots").join(REVISION)
    );
    assert!(dir.join("config.json").is_file() && dir.join(SHARD).is_file());
}

#[test]
fn the_cli_finds_a_repo_id_through_hf_hub_cache() {
    let cache = tempfile::tempdir().unwrap();
    add_snapshot(cache.path(), REVISION);
    let wick = |model: &str| {
        Command::new(env!("CARGO_BIN_EXE_wick"))
            .args(["tokenize", "--model", model, "<|im_start|>hi"])
            .env("HF_HUB_CACHE", cache.path())
            .env("HF_HUB_OFFLINE", "1")
            .env_remove("WICK_MODEL")
            .output()
            .unwrap()
    };
    let out = wick(REPO);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
    let want = wick::load::loader::load_tokenizer(&fixture())
        .unwrap()
        .encode("<|im_start|>hi")
        .unwrap();
    assert_eq!(ids, want);

    let out = wick("org/absent");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("models--org--absent") && err.contains("config.json"),
        "{err}"
    );
    assert!(err.contains("HF_HUB_OFFLINE is set"), "{err}");
}

const GGUF_REPO: &str = "org/tiny-GGUF";

/// A repo of GGUF files as they are published: one file per quantization,
/// a vision projector, a README, and a quantization split in three parts
/// by llama.cpp (`gguf-tiny/split/`).
fn gguf_hub() -> FakeHub {
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf-tiny");
    let files = [
        ("tiny-F32.gguf", "llama3-rope-f32.gguf"),
        ("tiny-Q8_0.gguf", "llama3-rope-q8_0.gguf"),
        ("mmproj-tiny-Q8_0.gguf", "gemma3-q8_0.gguf"),
        (
            "Q4_K_M/tiny-Q4_K_M-00001-of-00003.gguf",
            "split/llama3-rope-f32-00001-of-00003.gguf",
        ),
        (
            "Q4_K_M/tiny-Q4_K_M-00002-of-00003.gguf",
            "split/llama3-rope-f32-00002-of-00003.gguf",
        ),
        (
            "Q4_K_M/tiny-Q4_K_M-00003-of-00003.gguf",
            "split/llama3-rope-f32-00003-of-00003.gguf",
        ),
        ("README.md", "llama3-rope-f32.gguf"),
    ];
    FakeHub::serving(
        GGUF_REPO,
        files
            .iter()
            .map(|(name, src)| (name.to_string(), tiny.join(src)))
            .collect(),
    )
}

#[test]
fn a_quant_tag_fetches_that_gguf_alone_and_then_works_offline() {
    let hub = gguf_hub();
    let cache = tempfile::tempdir().unwrap();
    let arg = format!("{GGUF_REPO}:q8_0");
    let path = resolve_in(cache.path(), &arg, &online(&hub.endpoint)).unwrap();
    // The repo's vision projector comes with the model.
    assert_eq!(hub.downloads(), ["tiny-Q8_0.gguf", "mmproj-tiny-Q8_0.gguf"]);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/gguf-tiny/llama3-rope-q8_0.gguf")
        )
        .unwrap()
    );
    let loaded = load(&path, &LoadOptions::default(), &Device::Cpu).unwrap();
    assert!(loaded.model.info().num_layers > 0);
    // Cached: found again with the hub gone, by the tag or by default.
    assert_eq!(resolve_in(cache.path(), &arg, &Hub::Offline).unwrap(), path);
    assert_eq!(
        resolve_in(cache.path(), GGUF_REPO, &Hub::Offline).unwrap(),
        path
    );
    // A tag the cache lacks, offline: said so.
    let e = error(resolve_in(
        cache.path(),
        &format!("{GGUF_REPO}:F32"),
        &Hub::Offline,
    ));
    assert!(
        e.contains("tagged F32") && e.contains("HF_HUB_OFFLINE"),
        "{e}"
    );
}

#[test]
fn a_gguf_repo_without_a_tag_takes_a_default_quant_every_part_of_it() {
    let hub = gguf_hub();
    let cache = tempfile::tempdir().unwrap();
    // Q4_K_M comes first, split in three parts: all three are fetched, and
    // the model loads from the first. The projector is never a model, but
    // comes with it.
    let path = resolve_in(cache.path(), GGUF_REPO, &online(&hub.endpoint)).unwrap();
    let parts: Vec<String> = (1..=3)
        .map(|k| format!("Q4_K_M/tiny-Q4_K_M-0000{k}-of-00003.gguf"))
        .collect();
    assert_eq!(hub.downloads()[..3], parts);
    assert_eq!(hub.downloads()[3..], ["mmproj-tiny-Q8_0.gguf"]);
    assert!(path.ends_with(&parts[0]), "{}", path.display());
    let loaded = load(&path, &LoadOptions::default(), &Device::Cpu).unwrap();
    assert!(loaded.model.info().num_layers > 0);
    assert_eq!(
        resolve_in(cache.path(), GGUF_REPO, &Hub::Offline).unwrap(),
        path
    );

    let e = error(resolve_in(
        cache.path(),
        &format!("{GGUF_REPO}:Q5_K_M"),
        &online(&hub.endpoint),
    ));
    assert!(
        e.contains("no GGUF file tagged Q5_K_M")
            && e.contains("tiny-Q8_0.gguf")
            && !e.contains("mmproj"),
        "{e}"
    );
    assert_eq!(hub.downloads().len(), 4, "nothing more fetched");
}

/// A GGUF repo with Gemma 3's vision projector beside the model, as
/// llama.cpp's are published: the projector (F16 of the two) is fetched
/// with the model and found again offline, and the model then takes
/// images. A repo's projector that does not fit its model (here a text
/// GGUF under a projector's name) is passed over, text only; named with
/// `--mmproj`, the same file is an error.
#[test]
fn a_gguf_repo_s_vision_projector_comes_with_its_model() {
    use wick::load::hub::projector_in;

    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf-tiny");
    let files = [
        ("vl-Q8_0.gguf", "gemma3vl-q8_0.gguf"),
        ("mmproj-vl-F32.gguf", "mmproj-gemma3vl-f32.gguf"),
        ("mmproj-vl-F16.gguf", "mmproj-gemma3vl-f16.gguf"),
    ];
    let repo = "org/vl-GGUF";
    let hub = FakeHub::serving(
        repo,
        files
            .iter()
            .map(|(name, src)| (name.to_string(), tiny.join(src)))
            .collect(),
    );
    let cache = tempfile::tempdir().unwrap();
    let arg = format!("{repo}:Q8_0");
    assert_eq!(projector_in(cache.path(), &arg), None, "nothing cached yet");
    let model = resolve_in(cache.path(), &arg, &online(&hub.endpoint)).unwrap();
    assert_eq!(hub.downloads(), ["vl-Q8_0.gguf", "mmproj-vl-F16.gguf"]);
    let projector = projector_in(cache.path(), &arg).expect("the fetched projector");
    assert_eq!(
        std::fs::read(&projector).unwrap(),
        std::fs::read(tiny.join("mmproj-gemma3vl-f16.gguf")).unwrap()
    );
    drop(hub);
    assert_eq!(
        resolve_in(cache.path(), &arg, &Hub::Offline).unwrap(),
        model
    );
    assert_eq!(projector_in(cache.path(), repo), Some(projector.clone()));
    let found = LoadOptions {
        mmproj: Some(Projector::Found(projector)),
        ..Default::default()
    };
    let loaded = load(&model, &found, &Device::Cpu).unwrap();
    assert!(loaded.vision.is_some(), "the model takes images");

    let text_hub = gguf_hub();
    let cache = tempfile::tempdir().unwrap();
    let arg = format!("{GGUF_REPO}:Q8_0");
    let model = resolve_in(cache.path(), &arg, &online(&text_hub.endpoint)).unwrap();
    let misfit = projector_in(cache.path(), &arg).expect("the repo's mmproj file");
    let mut options = LoadOptions {
        mmproj: Some(Projector::Found(misfit.clone())),
        ..Default::default()
    };
    let loaded = load(&model, &options, &Device::Cpu).unwrap();
    assert!(loaded.vision.is_none(), "passed over");
    options.mmproj = Some(Projector::Named(misfit));
    let e = load(&model, &options, &Device::Cpu).err().expect("refused");
    assert!(
        format!("{e:#}").contains("is not a vision projector file"),
        "{e:#}"
    );
}

#[test]
fn quant_tags_are_words_of_the_file_name() {
    use wick::load::hub::{choose_gguf, split_tag};
    assert_eq!(
        split_tag("org/m-GGUF:Q4_K_M"),
        ("org/m-GGUF", Some("Q4_K_M"))
    );
    assert_eq!(split_tag("org/m-GGUF"), ("org/m-GGUF", None));
    assert!(wick::load::hub::is_repo_id("org/m-GGUF:Q4_K_M"));
    // As ollama writes them.
    assert_eq!(
        split_tag("hf.co/org/m-GGUF:Q8_0"),
        ("org/m-GGUF", Some("Q8_0"))
    );
    assert_eq!(split_tag("huggingface.co/org/m-GGUF"), ("org/m-GGUF", None));
    assert!(wick::load::hub::is_repo_id("hf.co/org/m-GGUF:Q8_0"));
    let files: Vec<String> = [
        "m-Q4_K.gguf",
        "m-Q4_K_M.gguf",
        "m.Q4_0.gguf",
        "mmproj-m-f16.gguf",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let pick = |tag| choose_gguf("org/m", &files, tag).map(|(f, _)| f);
    assert_eq!(pick(Some("q4_k")).unwrap(), ["m-Q4_K.gguf"]);
    assert_eq!(pick(Some("Q4_K_M")).unwrap(), ["m-Q4_K_M.gguf"]);
    assert_eq!(pick(None).unwrap(), ["m-Q4_K_M.gguf"]);
    assert!(pick(Some("f16")).is_err(), "a projector is not a model");
    let only: Vec<String> = vec!["model-IQ3_XXS.gguf".into()];
    assert_eq!(
        choose_gguf("org/m", &only, None).unwrap().0,
        ["model-IQ3_XXS.gguf"]
    );
    // Parts of a split: all of them, in order; a part missing is refused.
    let split: Vec<String> = ["m-Q8_0-00002-of-00002.gguf", "m-Q8_0-00001-of-00002.gguf"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        choose_gguf("org/m", &split, Some("Q8_0")).unwrap().0,
        ["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"]
    );
    assert!(choose_gguf("org/m", &split[..1], Some("Q8_0")).is_err());
}
