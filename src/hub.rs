//! `--model ORG/NAME`: a checkpoint in the Hugging Face hub cache, laid out
//! as `huggingface_hub` keeps it (`models--ORG--NAME/refs/main` naming a
//! snapshot whose files link into `blobs/`). It works offline from a
//! populated cache; missing files are fetched from the hub when it can be
//! reached, and otherwise the error says which files and where.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, CacheRepo, Repo};

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

/// Whether the hub may be asked for missing files.
#[derive(Debug, Clone)]
pub enum Hub {
    Offline,
    /// The hub's base URL.
    Online(String),
}

/// Whether `arg` looks like a hub repo id (`ORG/NAME`).
pub fn is_repo_id(arg: &str) -> bool {
    let part_ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with(['.', '-'])
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    matches!(arg.split_once('/'), Some((org, name)) if part_ok(org) && part_ok(name))
}

/// The cache `huggingface_hub` uses: `$HF_HUB_CACHE`, else `$HF_HOME/hub`,
/// else `~/.cache/huggingface/hub`.
pub fn cache_dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(dir) = var("HF_HUB_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(home) = var("HF_HOME") {
        return PathBuf::from(home).join("hub");
    }
    let home = var("HOME").map(PathBuf::from).unwrap_or_default();
    home.join(".cache/huggingface/hub")
}

/// [`resolve_in`] with the cache and hub access the environment sets
/// (`HF_HUB_OFFLINE=1` keeps wick off the network; `HF_ENDPOINT` moves it).
pub fn resolve(repo_id: &str) -> Result<PathBuf> {
    let offline = std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
    let hub = match offline {
        true => Hub::Offline,
        false => Hub::Online(
            std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into()),
        ),
    };
    resolve_in(&cache_dir(), repo_id, &hub)
}

/// The snapshot directory of `repo_id` in `cache` once every file a load
/// needs is there, fetching missing ones when `hub` allows.
pub fn resolve_in(cache: &Path, repo_id: &str, hub: &Hub) -> Result<PathBuf> {
    let cached = Cache::new(cache.to_path_buf()).model(repo_id.to_string());
    let mut gaps = missing(&cached)?;
    let mut hub_error = match hub {
        Hub::Offline => "HF_HUB_OFFLINE is set, so the hub was not asked".to_string(),
        Hub::Online(_) => String::new(),
    };
    if !gaps.is_empty() {
        if let Hub::Online(endpoint) = hub {
            if let Err(e) = fetch(cache, repo_id, endpoint) {
                hub_error = format!("the hub at {endpoint} could not be reached: {e:#}");
            }
            gaps = missing(&cached)?;
        }
    }
    if gaps.is_empty() {
        let config = cached.get(REQUIRED[0]).context("config.json vanished")?;
        return Ok(config.parent().expect("a file in a snapshot").to_path_buf());
    }
    let repo_dir = cache.join(Repo::model(repo_id.to_string()).folder_name());
    bail!(
        "model {repo_id} is not in the Hugging Face cache: missing {} under {} \
         (a checkpoint needs {}, and {SINGLE} or {INDEX} with every shard it lists); \
         {hub_error}. Set HF_HUB_CACHE or HF_HOME to use another cache, or pass --model DIR",
        gaps.join(", "),
        repo_dir.display(),
        REQUIRED.join(", "),
    )
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

/// Downloads the files a load needs into `cache`.
fn fetch(cache: &Path, repo_id: &str, endpoint: &str) -> Result<()> {
    let api = ApiBuilder::from_cache(Cache::new(cache.to_path_buf()))
        .with_endpoint(endpoint.to_string())
        .with_progress(false)
        .with_retries(0)
        .build()?;
    let repo = api.model(repo_id.to_string());
    for f in REQUIRED {
        repo.get(f).with_context(|| format!("fetching {f}"))?;
    }
    match repo.get(INDEX) {
        Ok(index) => {
            for shard in shards(&index)? {
                repo.get(&shard)
                    .with_context(|| format!("fetching {shard}"))?;
            }
        }
        Err(_) => {
            repo.get(SINGLE)
                .with_context(|| format!("fetching {SINGLE}"))?;
        }
    }
    for f in OPTIONAL {
        // Most checkpoints lack some of these.
        let _ = repo.get(f);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_are_org_slash_name() {
        assert!(is_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(is_repo_id("openai-community/gpt2"));
        assert!(!is_repo_id("gpt2"));
        assert!(!is_repo_id("a/b/c"));
        assert!(!is_repo_id("/abs"));
        assert!(!is_repo_id("../x"));
        assert!(!is_repo_id("org/na me"));
    }
}
