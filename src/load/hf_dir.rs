//! A Hugging Face checkpoint directory: `config.json`, safetensors weights
//! (one file, or shards listed by `model.safetensors.index.json`),
//! `tokenizer.json`, and when present `tokenizer_config.json` (special tokens,
//! chat template), `chat_template.jinja` and `generation_config.json` (EOS
//! ids).

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use serde_json::Value;

use crate::models::linear::WeightSpec;
use crate::models::registry;
use crate::models::vision::VisionEncoder;
use crate::models::Model;
use crate::text::chat_template::ChatTemplate;
use crate::text::tokenizer::Tokenizer;

fn read_json(path: &Path) -> Result<Value> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

/// `name` in `dir` as JSON, or `Null` when the file is absent.
fn optional_json(dir: &Path, name: &str) -> Result<Value> {
    let path = dir.join(name);
    match path.is_file() {
        true => read_json(&path),
        false => Ok(Value::Null),
    }
}

/// The weight files: the shards an index names, else `model.safetensors`.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let json = read_json(&index)?;
        let map = json["weight_map"]
            .as_object()
            .with_context(|| format!("{} has no weight_map", index.display()))?;
        let shards: BTreeSet<&str> = map.values().filter_map(Value::as_str).collect();
        return shards
            .into_iter()
            .map(|s| {
                let p = dir.join(s);
                match p.is_file() {
                    true => Ok(p),
                    false => bail!("shard {s} listed in {} is missing", index.display()),
                }
            })
            .collect();
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    bail!(
        "{} has neither model.safetensors nor model.safetensors.index.json",
        dir.display()
    )
}

/// Loads the model a checkpoint's `config.json` describes, and its vision
/// encoder where it has one (`tokenizer` names its image tokens).
pub fn load_model(
    dir: &Path,
    spec: WeightSpec,
    dtype: DType,
    context: Option<usize>,
    device: &Device,
    tokenizer: &Tokenizer,
) -> Result<(Box<dyn Model>, Option<VisionEncoder>)> {
    let config_path = dir.join("config.json");
    let config = fs::read_to_string(&config_path)
        .with_context(|| format!("{} has no readable config.json", dir.display()))?;
    let config_json = serde_json::from_str::<Value>(&config)
        .with_context(|| format!("{} is not valid JSON", config_path.display()))?;
    let model_type = config_json["model_type"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let Some(build) = registry::hf(&model_type) else {
        bail!(
            "model_type {model_type:?} in {} is not supported; wick runs {}",
            config_path.display(),
            registry::hf_supported()
        );
    };
    let mut tensors = HashMap::new();
    for file in safetensors_files(dir)? {
        tensors.extend(
            candle_core::safetensors::load(&file, device)
                .with_context(|| format!("reading {}", file.display()))?,
        );
    }
    let vb = VarBuilder::from_tensors(tensors, dtype, device);
    let with_config = |e: anyhow::Error| {
        e.context(format!(
            "loading the {model_type} checkpoint in {}",
            dir.display()
        ))
    };
    let vision = match registry::hf_vision(&model_type) {
        Some(build) if !config_json["vision_config"].is_null() => {
            let pre = read_json(&dir.join("preprocessor_config.json"))
                .context("a checkpoint with a vision tower needs its image processor's config")
                .map_err(with_config)?;
            let text = |id: u32| tokenizer.id_to_token(id);
            Some(build(&config_json, &pre, &text, &vb).map_err(with_config)?)
        }
        _ => None,
    };
    let model = build(&config, vb, spec, context).map_err(with_config)?;
    Ok((model, vision))
}

/// A special token as `tokenizer_config.json` writes it: a string or an
/// `AddedToken` object with `content`.
fn token_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// Token ids from a config's `eos_token_id`: one id or a list.
fn ids(v: &Value) -> Vec<u32> {
    match v {
        Value::Number(n) => n.as_u64().map(|n| n as u32).into_iter().collect(),
        Value::Array(a) => a
            .iter()
            .filter_map(|n| n.as_u64())
            .map(|n| n as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// The tokenizer and chat template of a checkpoint.
pub fn load_tokenizer(dir: &Path) -> Result<(Tokenizer, Option<ChatTemplate>)> {
    let path = dir.join("tokenizer.json");
    let inner = tokenizers::Tokenizer::from_file(&path)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("loading {}", path.display()))?;
    let tok_config = optional_json(dir, "tokenizer_config.json")?;
    let gen_config = optional_json(dir, "generation_config.json")?;
    let model_config = optional_json(dir, "config.json")?;
    let special = |key: &str| -> Option<(String, u32)> {
        let text = token_text(&tok_config[key])?;
        let id = inner.token_to_id(&text)?;
        Some((text, id))
    };
    let bos = special("bos_token");
    let eos = special("eos_token");
    let bos_id = bos
        .as_ref()
        .map(|b| b.1)
        .or_else(|| ids(&gen_config["bos_token_id"]).first().copied())
        .or_else(|| ids(&model_config["bos_token_id"]).first().copied());
    // Generation stops at every id generation_config lists, and at the
    // tokenizer's EOS, which goes first: it is the `eos_token` transformers
    // gives templates and reports (Llama 3.1 lists `<|end_of_text|>` first
    // in generation_config, but its tokenizer's EOS is `<|eot_id|>`).
    let mut eos_ids = ids(&gen_config["eos_token_id"]);
    if eos_ids.is_empty() {
        eos_ids = ids(&model_config["eos_token_id"]);
    }
    if let Some((_, id)) = &eos {
        eos_ids.retain(|e| e != id);
        eos_ids.insert(0, *id);
    }
    // transformers adds BOS when `add_bos_token` says so, else when the
    // tokenizer's post-processor does; find the latter by trying it.
    let add_bos = match tok_config["add_bos_token"].as_bool() {
        Some(b) => b,
        None => {
            let with = inner.encode("a", true).map_err(anyhow::Error::msg)?;
            let without = inner.encode("a", false).map_err(anyhow::Error::msg)?;
            with.len() > without.len() && with.get_ids().first().copied() == bos_id
        }
    };
    let (pad, unk) = (special("pad_token"), special("unk_token"));
    let tokenizer = Tokenizer::from_hf(inner, eos_ids, bos_id, add_bos)
        .with_pad_and_unk(pad.map(|p| p.1), unk.map(|u| u.1));

    let jinja = dir.join("chat_template.jinja");
    let template = match jinja.is_file() {
        true => Some(
            fs::read_to_string(&jinja).with_context(|| format!("reading {}", jinja.display()))?,
        ),
        false => chat_template_text(&tok_config["chat_template"]),
    };
    let chat_template = template.map(|t| template_for(&tokenizer, t)).transpose()?;
    Ok((tokenizer, chat_template))
}

/// `chat_template` from `tokenizer_config.json`: a string, or a list of
/// named templates of which wick uses "default".
fn chat_template_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// Compiles a chat template for `tokenizer`, exposing its BOS and first EOS
/// token texts to the template.
pub fn template_for(tokenizer: &Tokenizer, template: String) -> Result<ChatTemplate> {
    let text = |id: Option<u32>| {
        id.and_then(|id| tokenizer.id_to_token(id))
            .unwrap_or_default()
    };
    ChatTemplate::new(
        template,
        text(tokenizer.bos_id()),
        text(tokenizer.eos_ids().first().copied()),
    )
}

/// The name clients use for a checkpoint: `ORG/NAME` for a hub cache
/// snapshot (`…/models--ORG--NAME/snapshots/REV`), else the directory's name.
pub fn model_name(dir: &Path) -> String {
    let parts: Vec<&str> = dir
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .collect();
    if let [.., repo, "snapshots", _rev] = parts.as_slice() {
        if let Some(id) = repo.strip_prefix("models--") {
            return id.replacen("--", "/", 1);
        }
    }
    dir.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("model")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_snapshots_are_named_by_repo() {
        assert_eq!(
            model_name(Path::new(
                "/c/hub/models--HuggingFaceTB--SmolLM2-135M/snapshots/abc123"
            )),
            "HuggingFaceTB/SmolLM2-135M"
        );
        assert_eq!(model_name(Path::new("/data/gpt2-tiny")), "gpt2-tiny");
    }

    #[test]
    fn special_tokens_and_eos_ids_parse_in_both_spellings() {
        assert_eq!(token_text(&serde_json::json!("<s>")), Some("<s>".into()));
        assert_eq!(
            token_text(&serde_json::json!({"content": "</s>", "lstrip": false})),
            Some("</s>".into())
        );
        assert_eq!(ids(&serde_json::json!(2)), vec![2]);
        assert_eq!(ids(&serde_json::json!([2, 7])), vec![2, 7]);
        assert!(ids(&Value::Null).is_empty());
    }

    #[test]
    fn named_chat_templates_use_the_default() {
        let v = serde_json::json!([
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D"}
        ]);
        assert_eq!(chat_template_text(&v), Some("D".into()));
        assert_eq!(chat_template_text(&Value::Null), None);
    }
}
