//! `--model ORG/NAME`: a checkpoint in the Hugging Face hub cache, laid out
//! as `huggingface_hub` keeps it (`models--ORG--NAME/refs/main` naming a
//! snapshot whose files link into `blobs/`). A complete cached snapshot is
//! used without touching the network; missing files are fetched from the
//! hub when it can be reached, and otherwise the error says which files,
//! where, and why the hub did not provide them.
//!
//! `--model ORG/NAME:TAG` takes one GGUF file of a repo of them, the one
//! whose name carries the quantization tag (`Q4_K_M`, `Q8_0`, ...), as
//! `llama-server -hf` does; `ORG/NAME` alone on such a repo (no
//! `config.json`) takes the first of [`DEFAULT_QUANTS`] it has, and says
//! which. A vision projector file in the repo (`mmproj-*.gguf`) is fetched
//! with the model, as `llama-server -hf` fetches it ([`projector_in`]).

use std::collections::HashSet;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hf_hub::api::sync::ApiBuilder;
use hf_hub::api::RepoInfo;
use hf_hub::{Cache, CacheRepo, Repo};

use crate::load::gguf_split::part_of;

/// Files a checkpoint cannot load without (besides its weights).
const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
/// Files used when present.
const OPTIONAL: [&str; 3] = [
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
];
const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";
/// How long the first request to the hub may take, so an unreachable hub
/// fails fast rather than after ureq's 30 s connect timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// `huggingface_hub`'s limit on a repo id's length.
const MAX_REPO_ID_LEN: usize = 96;
const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Quantizations taken, in this order, from a repo of GGUF files named
/// without a tag: llama.cpp's default, then the smallest and the most
/// accurate of the common ones.
pub const DEFAULT_QUANTS: [&str; 3] = ["Q4_K_M", "Q4_0", "Q8_0"];

/// Whether the hub may be asked for missing files.
#[derive(Debug, Clone)]
pub enum Hub {
    /// `HF_HUB_OFFLINE`: the network is never touched.
    Offline,
    Online {
        /// The hub's base URL, e.g. `https://huggingface.co`.
        endpoint: String,
        /// Sent as a bearer token (gated and private repos need one).
        token: Option<String>,
    },
}

/// Whether `arg` is a hub repo id `ORG/NAME`, by `huggingface_hub`'s rules:
/// `[A-Za-z0-9_.-]`, each part starting and ending with a letter, digit or
/// `_`, no `--` or `..`, at most 96 characters.
pub fn is_repo_id(arg: &str) -> bool {
    let (arg, _) = split_tag(arg);
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    let part_ok = |p: &str| {
        word(p.chars().next())
            && word(p.chars().last())
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    arg.len() <= MAX_REPO_ID_LEN
        && !arg.contains("--")
        && !arg.contains("..")
        // A missing `dir/model.gguf` is a mistyped path, not a repo to fetch.
        && !arg.to_ascii_lowercase().ends_with(".gguf")
        && matches!(arg.split_once('/'), Some((org, name)) if part_ok(org) && part_ok(name))
}

/// `ORG/NAME:TAG` into the repo and its quantization tag. The hub's
/// address may lead, as ollama writes it (`hf.co/ORG/NAME:TAG`).
pub fn split_tag(arg: &str) -> (&str, Option<&str>) {
    let arg = ["https://huggingface.co/", "huggingface.co/", "hf.co/"]
        .iter()
        .find_map(|host| arg.strip_prefix(host))
        .unwrap_or(arg);
    match arg.rsplit_once(':') {
        Some((repo, tag))
            if !tag.is_empty()
                && tag
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) =>
        {
            (repo, Some(tag))
        }
        _ => (arg, None),
    }
}

/// An environment variable, unset when empty.
fn env(key: &str) -> Option<OsString> {
    std::env::var_os(key).filter(|v| !v.is_empty())
}

/// `huggingface_hub`'s home: `$HF_HOME`, else `~/.cache/huggingface`.
fn hf_home() -> PathBuf {
    match env("HF_HOME") {
        Some(home) => PathBuf::from(home),
        None => std::env::home_dir()
            .unwrap_or_default()
            .join(".cache")
            .join("huggingface"),
    }
}

/// The cache `huggingface_hub` uses: `$HF_HUB_CACHE`, else `$HF_HOME/hub`,
/// else `~/.cache/huggingface/hub`.
pub fn cache_dir() -> PathBuf {
    env("HF_HUB_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("hub"))
}

/// The token `huggingface_hub` would send: `$HF_TOKEN`, else the contents
/// of `$HF_TOKEN_PATH` or `$HF_HOME/token`.
fn token() -> Option<String> {
    if let Some(token) = env("HF_TOKEN") {
        return Some(token.to_string_lossy().into_owned());
    }
    let path = env("HF_TOKEN_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("token"));
    let text = std::fs::read_to_string(path).ok()?;
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

/// [`resolve_in`] with the cache and hub access the environment sets, as
/// `huggingface_hub` reads it (`HF_HUB_OFFLINE=1` keeps wick off the
/// network; `HF_ENDPOINT` moves the hub; `HF_TOKEN` authenticates).
pub fn resolve(repo_id: &str) -> Result<PathBuf> {
    let offline = env("HF_HUB_OFFLINE").is_some_and(|v| {
        matches!(
            v.to_string_lossy().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    });
    let hub = match offline {
        true => Hub::Offline,
        false => Hub::Online {
            endpoint: env("HF_ENDPOINT")
                .map(|e| e.to_string_lossy().trim_end_matches('/').to_string())
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()),
            token: token(),
        },
    };
    resolve_in(&cache_dir(), repo_id, &hub)
}

/// For a checkpoint, the snapshot directory `refs/main` names for the repo
/// of `arg` in `cache`, once every file a load needs is there; for a GGUF
/// repo, the chosen file. Missing files are fetched when `hub` allows.
pub fn resolve_in(cache: &Path, arg: &str, hub: &Hub) -> Result<PathBuf> {
    let (repo_id, tag) = split_tag(arg);
    let cached = Cache::new(cache.to_path_buf()).model(repo_id.to_string());
    let local = snapshot_files(cache, repo_id);
    if tag.is_some() || is_gguf_repo(&local) {
        return resolve_gguf(cache, repo_id, tag, &local, hub);
    }
    let mut gaps = missing(&cached)?;
    if gaps.is_empty() {
        return snapshot_dir(&cached);
    }
    let why = match hub {
        Hub::Offline => "HF_HUB_OFFLINE is set, so the hub was not asked".to_string(),
        Hub::Online { endpoint, token } => match list(cache, repo_id, endpoint, token) {
            Ok((_, info)) if is_gguf_repo(&file_names(&info)) => {
                return resolve_gguf(cache, repo_id, None, &local, hub);
            }
            Ok((repo, info)) => match fetch(cache, repo_id, endpoint, &repo, &info) {
                Ok(()) => {
                    gaps = missing(&cached)?;
                    if gaps.is_empty() {
                        return snapshot_dir(&cached);
                    }
                    format!("the hub at {endpoint} did not provide them")
                }
                Err(e) => format!("the hub at {endpoint} refused: {e:#}"),
            },
            Err(e) => format!("the hub at {endpoint} could not be reached or refused: {e:#}"),
        },
    };
    let repo_dir = cache.join(Repo::model(repo_id.to_string()).folder_name());
    bail!(
        "model {repo_id} is not a local path, and the Hugging Face cache lacks {} under {} \
         (a checkpoint needs {}, and {SINGLE} or {INDEX} with every shard it lists); {why}. \
         HF_HUB_CACHE or HF_HOME select another cache; --model DIR takes a checkpoint directory",
        gaps.join(", "),
        repo_dir.display(),
        REQUIRED.join(", "),
    )
}

/// Whether `files` are a repo of GGUF files rather than a checkpoint.
fn is_gguf_repo(files: &[String]) -> bool {
    !files.iter().any(|f| f == REQUIRED[0]) && files.iter().any(|f| is_gguf(f))
}

/// A model GGUF, not a vision projector's.
fn is_gguf(file: &str) -> bool {
    let lower = file.to_ascii_lowercase();
    lower.ends_with(".gguf") && !base_name(&lower).contains("mmproj")
}

fn base_name(file: &str) -> &str {
    file.rsplit('/').next().unwrap_or(file)
}

/// Whether `tag` stands in `file`'s name as a word of its own (so `Q4_K`
/// is not `Q4_K_M`), in any case.
fn has_tag(file: &str, tag: &str) -> bool {
    let (name, tag) = (
        base_name(file).to_ascii_uppercase(),
        tag.to_ascii_uppercase(),
    );
    let part = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    name.match_indices(&tag).any(|(at, _)| {
        !part(name[..at].chars().last()) && !part(name[at + tag.len()..].chars().next())
    })
}

/// The vision projector file among `files` (`mmproj` in its name), F16
/// first as llama.cpp publishes it, then BF16, F32 and Q8_0.
fn choose_projector(files: &[String]) -> Option<String> {
    let mut projectors: Vec<&String> = files
        .iter()
        .filter(|f| {
            let lower = f.to_ascii_lowercase();
            lower.ends_with(".gguf") && base_name(&lower).contains("mmproj")
        })
        .collect();
    projectors.sort();
    ["F16", "BF16", "F32", "Q8_0"]
        .iter()
        .find_map(|t| projectors.iter().find(|f| has_tag(f, t)))
        .or(projectors.first())
        .map(|f| f.to_string())
}

/// The vision projector file the cached snapshot of `arg`'s repo holds
/// beside its GGUF model, fetched with it when the repo lists one.
pub fn projector_in(cache: &Path, arg: &str) -> Option<PathBuf> {
    let (repo_id, _) = split_tag(arg);
    let file = choose_projector(&snapshot_files(cache, repo_id))?;
    Cache::new(cache.to_path_buf())
        .model(repo_id.to_string())
        .get(&file)
}

/// [`projector_in`] in the environment's cache.
pub fn projector(arg: &str) -> Option<PathBuf> {
    projector_in(&cache_dir(), arg)
}

/// The GGUF file of `files` that `tag` names (or, without one, the first
/// of [`DEFAULT_QUANTS`] present, or the only GGUF), and the tag taken: one
/// file, or every part of a split one, the first part first.
pub fn choose_gguf(
    repo_id: &str,
    files: &[String],
    tag: Option<&str>,
) -> Result<(Vec<String>, String)> {
    let ggufs: Vec<&String> = files.iter().filter(|f| is_gguf(f)).collect();
    let tagged = |t: &str| -> Vec<String> {
        let mut found: Vec<String> = ggufs
            .iter()
            .filter(|f| has_tag(f, t))
            .map(|f| f.to_string())
            .collect();
        found.sort();
        found
    };
    let (taken, found) = match tag {
        Some(t) => (t.to_string(), tagged(t)),
        None => DEFAULT_QUANTS
            .iter()
            .map(|t| (t.to_string(), tagged(t)))
            .find(|(_, f)| !f.is_empty())
            .or_else(|| match ggufs[..] {
                [only] => Some((base_name(only).to_string(), vec![only.clone()])),
                _ => None,
            })
            .unwrap_or_default(),
    };
    let listed = || {
        ggufs
            .iter()
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match &found[..] {
        [] => match tag {
            Some(t) => bail!("{repo_id} has no GGUF file tagged {t}; its GGUF files: {}", listed()),
            None => bail!(
                "{repo_id} has no config.json and no GGUF file tagged {}; name one as                  {repo_id}:TAG (its GGUF files: {})",
                DEFAULT_QUANTS.join(", "),
                listed()
            ),
        },
        [one] if part_of(Path::new(one)).is_none() => Ok((vec![one.clone()], taken)),
        parts if parts.iter().all(|f| part_of(Path::new(f)).is_some()) => {
            // `found` is sorted, so the parts of one split are in order.
            let total = part_of(Path::new(&parts[0])).map_or(0, |(_, n)| n);
            let whole = parts.len() == total
                && parts
                    .iter()
                    .enumerate()
                    .all(|(k, f)| part_of(Path::new(f)) == Some((k + 1, total)));
            if !whole {
                bail!(
                    "{repo_id}:{taken} matches parts that are not one whole split GGUF: {}",
                    parts.join(", ")
                );
            }
            Ok((parts.to_vec(), taken))
        }
        many => bail!(
            "{repo_id}:{taken} matches {} files ({}); name one with a longer tag",
            many.len(),
            many.join(", ")
        ),
    }
}

/// A GGUF file of `repo_id`, from the cached snapshot's files (`local`) or
/// fetched.
fn resolve_gguf(
    cache: &Path,
    repo_id: &str,
    tag: Option<&str>,
    local: &[String],
    hub: &Hub,
) -> Result<PathBuf> {
    let cached = Cache::new(cache.to_path_buf()).model(repo_id.to_string());
    if let Ok((files, _)) = choose_gguf(repo_id, local, tag) {
        let paths: Option<Vec<PathBuf>> = files.iter().map(|f| cached.get(f)).collect();
        if let Some(first) = paths.and_then(|p| p.into_iter().next()) {
            return Ok(first);
        }
    }
    let (endpoint, token) = match hub {
        Hub::Offline => {
            let why = match choose_gguf(repo_id, local, tag) {
                Ok((files, _)) => format!("{} is not all in it", files.join(", ")),
                Err(e) => format!("{e:#}"),
            };
            bail!(
                "{repo_id}: the Hugging Face cache under {} lacks the GGUF file asked for \
                 ({why}), and HF_HUB_OFFLINE is set, so the hub was not asked",
                cache
                    .join(Repo::model(repo_id.to_string()).folder_name())
                    .display()
            );
        }
        Hub::Online { endpoint, token } => (endpoint, token),
    };
    let (repo, info) = list(cache, repo_id, endpoint, token)?;
    let (files, taken) = choose_gguf(repo_id, &file_names(&info), tag)?;
    if tag.is_none() {
        eprintln!(
            "wick: {repo_id} names no quantization; taking {taken}: {}",
            files[0]
        );
    }
    let mut paths = Vec::with_capacity(files.len());
    for file in &files {
        eprintln!("wick: fetching {file} of {repo_id} from {endpoint}");
        paths.push(
            repo.download(file)
                .with_context(|| format!("downloading {file}"))?,
        );
    }
    // The model works without its projector (text only), so a failed
    // fetch of it is said, not fatal.
    if let Some(file) = choose_projector(&file_names(&info)) {
        eprintln!("wick: fetching the vision projector {file} of {repo_id} from {endpoint}");
        if let Err(e) = repo.download(&file) {
            eprintln!("wick: {file} could not be fetched ({e}); serving text only");
        }
    }
    cached.create_ref(&info.sha).context("writing refs/main")?;
    paths.into_iter().next().context("no file chosen")
}

/// The files of the snapshot `refs/main` names for `repo_id` in `cache`
/// (none if there is none), as paths within it.
fn snapshot_files(cache: &Path, repo_id: &str) -> Vec<String> {
    let repo = cache.join(Repo::model(repo_id.to_string()).folder_name());
    let Ok(revision) = std::fs::read_to_string(repo.join("refs/main")) else {
        return Vec::new();
    };
    let root = repo.join("snapshots").join(revision.trim());
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if let Ok(rel) = path.strip_prefix(&root) {
                files.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    files
}

fn file_names(info: &RepoInfo) -> Vec<String> {
    info.siblings.iter().map(|s| s.rfilename.clone()).collect()
}

/// The hub's API for `repo_id`, and its current file list.
fn list(
    cache: &Path,
    repo_id: &str,
    endpoint: &str,
    token: &Option<String>,
) -> Result<(hf_hub::api::sync::ApiRepo, RepoInfo)> {
    let api = ApiBuilder::from_cache(Cache::new(cache.to_path_buf()))
        .with_endpoint(endpoint.to_string())
        .with_token(token.clone())
        .with_progress(std::io::stderr().is_terminal())
        .with_retries(0)
        .build()?;
    let repo = api.model(repo_id.to_string());
    let info: RepoInfo = repo
        .info_request()
        .timeout(PROBE_TIMEOUT)
        .call()
        .with_context(|| format!("asking for {repo_id}'s files"))?
        .into_json()
        .context("reading the hub's list of files")?;
    Ok((repo, info))
}

/// The snapshot directory of a complete cached checkpoint.
fn snapshot_dir(cached: &CacheRepo) -> Result<PathBuf> {
    let config = cached
        .get(REQUIRED[0])
        .context("config.json vanished from the Hugging Face cache")?;
    config
        .parent()
        .map(Path::to_path_buf)
        .context("a cached file outside any snapshot")
}

/// The files a load needs that the cached snapshot lacks.
fn missing(cached: &CacheRepo) -> Result<Vec<String>> {
    let have = |f: &str| cached.get(f).is_some();
    let mut missing: Vec<String> = REQUIRED
        .iter()
        .filter(|f| !have(f))
        .map(|f| f.to_string())
        .collect();
    match (cached.get(INDEX), have(SINGLE)) {
        (Some(index), _) => missing.extend(shards(&index)?.into_iter().filter(|s| !have(s))),
        (None, true) => {}
        (None, false) => missing.push(format!("{SINGLE} (or {INDEX} and its shards)")),
    }
    Ok(missing)
}

/// Shard file names an index's `weight_map` lists.
fn shards(index: &Path) -> Result<Vec<String>> {
    let text =
        std::fs::read_to_string(index).with_context(|| format!("reading {}", index.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", index.display()))?;
    let map = json["weight_map"]
        .as_object()
        .with_context(|| format!("{} has no weight_map", index.display()))?;
    let mut names: Vec<String> = map
        .values()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// Downloads into `cache` the files of the hub's current main revision
/// (`info`, listed by `repo`) that a load needs (and the optional ones it
/// has) which its snapshot lacks, then points `refs/main` at that
/// revision. Files of an older cached revision are not mixed in.
fn fetch(
    cache: &Path,
    repo_id: &str,
    endpoint: &str,
    repo: &hf_hub::api::sync::ApiRepo,
    info: &RepoInfo,
) -> Result<()> {
    let listed: HashSet<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
    let snapshot = cache
        .join(Repo::model(repo_id.to_string()).folder_name())
        .join("snapshots")
        .join(&info.sha);
    eprintln!(
        "wick: fetching {repo_id} from {endpoint} into {}",
        snapshot.display()
    );
    let get = |file: &str| -> Result<()> {
        if !snapshot.join(file).exists() {
            repo.download(file)
                .with_context(|| format!("downloading {file}"))?;
        }
        Ok(())
    };
    for file in REQUIRED {
        get(file)?;
    }
    if listed.contains(INDEX) {
        get(INDEX)?;
        for shard in shards(&snapshot.join(INDEX))? {
            get(&shard)?;
        }
    } else {
        get(SINGLE)?;
    }
    for file in OPTIONAL.into_iter().filter(|f| listed.contains(f)) {
        get(file)?;
    }
    Cache::new(cache.to_path_buf())
        .model(repo_id.to_string())
        .create_ref(&info.sha)
        .context("writing refs/main")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_follow_huggingface_hub_rules() {
        assert!(is_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(is_repo_id("openai-community/gpt2"));
        assert!(is_repo_id("Qwen/Qwen2.5-0.5B"));
        assert!(is_repo_id("a_b/c_"));
        assert!(!is_repo_id("gpt2"));
        assert!(!is_repo_id("a/b/c"));
        assert!(!is_repo_id("/abs"));
        assert!(!is_repo_id("org/"));
        assert!(!is_repo_id("../x"));
        assert!(!is_repo_id("./x"));
        assert!(!is_repo_id("org/na me"));
        assert!(!is_repo_id("org/name-"));
        assert!(!is_repo_id("org/-name"));
        assert!(!is_repo_id("org/a--b"));
        assert!(!is_repo_id("org/a..b"));
        assert!(!is_repo_id("models/SmolLM2.Q4_1.GGUF"));
        assert!(is_repo_id(&format!("o/{}", "n".repeat(94))));
        assert!(!is_repo_id(&format!("o/{}", "n".repeat(95))));
    }
}
