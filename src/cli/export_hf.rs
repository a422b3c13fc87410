//! `wick export-hf`: a GGUF Llama model written as a Hugging Face checkpoint
//! directory (f32 safetensors, `config.json`, `tokenizer.json`,
//! `tokenizer_config.json` with the chat template, `generation_config.json`),
//! which transformers and wick's own safetensors path can load.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use serde_json::json;
use tokenizers::processors::PostProcessorWrapper;

use crate::load::loader::open_model_gguf;
use crate::models::gguf_architecture;
use crate::models::llama::Config;
use crate::text::tokenizer::Tokenizer;

/// The HF name of a GGUF Llama tensor.
fn hf_name(gguf: &str) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let hf = match part {
        "attn_norm.weight" => "input_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

/// Undoes llama.cpp's converter, which reorders each head's q/k rows so
/// RoPE can rotate adjacent pairs: GGUF row `2i + j` of a head is HF row
/// `j * head_dim / 2 + i`. HF rotates the two halves of a head instead.
pub fn unpermute_rope_rows(w: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    w.reshape((heads, rows / heads / 2, 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))
}

/// Writes the Llama model in `gguf` to the directory `out` (created if
/// needed; files already there are overwritten).
pub fn export(gguf: &Path, out: &Path) -> Result<()> {
    if gguf.is_dir() {
        bail!(
            "export-hf converts a GGUF file, and {} is a directory (already a Hugging Face checkpoint?)",
            gguf.display()
        );
    }
    let (content, mut reader, _) = open_model_gguf(gguf)?;
    let arch = gguf_architecture(&content);
    if arch != "llama" {
        bail!("export-hf writes Llama checkpoints; this file's architecture is {arch:?}");
    }
    let config = Config::from_gguf(&content)?;
    let tokenizer = Tokenizer::from_gguf(&content)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;

    let mut tensors = HashMap::new();
    for name in content.tensor_infos.keys() {
        let hf = hf_name(name)
            .with_context(|| format!("no Hugging Face name for GGUF tensor {name}"))?;
        let mut w = content
            .tensor(&mut reader, name, &Device::Cpu)?
            .dequantize(&Device::Cpu)?;
        if hf.ends_with("q_proj.weight") {
            w = unpermute_rope_rows(&w, config.num_heads)?;
        } else if hf.ends_with("k_proj.weight") {
            w = unpermute_rope_rows(&w, config.num_kv_heads)?;
        }
        tensors.insert(hf, w);
    }
    let tied = !tensors.contains_key("lm_head.weight");
    candle_core::safetensors::save(&tensors, out.join("model.safetensors"))?;

    let token = |id: Option<u32>| id.and_then(|id| tokenizer.id_to_token(id));
    let bos = tokenizer.bos_id();
    let eos = tokenizer.eos_ids().first().copied();
    let write = |file: &str, value: serde_json::Value| -> Result<()> {
        let path = out.join(file);
        std::fs::write(&path, serde_json::to_string_pretty(&value)?)
            .with_context(|| format!("writing {}", path.display()))
    };
    write(
        "config.json",
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads,
            "num_key_value_heads": config.num_kv_heads,
            "head_dim": config.head_dim,
            "rms_norm_eps": shortest_f32(config.rms_norm_eps),
            "rope_theta": config.rope_theta,
            "max_position_embeddings": config.max_context,
            "vocab_size": config.vocab_size,
            "tie_word_embeddings": tied,
            "hidden_act": "silu",
            "bos_token_id": bos,
            "eos_token_id": eos,
            "torch_dtype": "float32",
        }),
    )?;
    let chat_template = content
        .metadata
        .get("tokenizer.chat_template")
        .and_then(|v| v.to_string().ok())
        .cloned();
    write(
        "tokenizer_config.json",
        json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": token(bos),
            "eos_token": token(eos),
            "add_bos_token": tokenizer.add_bos(),
            "model_max_length": config.max_context,
            "chat_template": chat_template,
        }),
    )?;
    write(
        "generation_config.json",
        json!({"bos_token_id": bos, "eos_token_id": tokenizer.eos_ids()}),
    )?;
    let path = out.join("tokenizer.json");
    hf_tokenizer(&tokenizer)?
        .save(&path, true)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The shortest decimal reading back as the f32 a GGUF holds (1e-5 rather
/// than its f64 widening 9.999999747378752e-6), as HF configs spell it.
fn shortest_f32(x: f64) -> f64 {
    let decimal = (x as f32).to_string();
    decimal.parse().unwrap_or(x)
}

/// The tokenizer as transformers should load it. wick prepends BOS itself
/// ([`Tokenizer::encode`]); transformers does only when `tokenizer.json`'s
/// post-processor says so (`add_bos_token` alone is ignored for it), so a
/// model that wants BOS gets one. The GGUF-built tokenizer has no
/// post-processor of its own to lose.
fn hf_tokenizer(tokenizer: &Tokenizer) -> Result<tokenizers::Tokenizer> {
    let mut inner = tokenizer.inner().clone();
    let Some(id) = tokenizer.bos_id().filter(|_| tokenizer.add_bos()) else {
        return Ok(inner);
    };
    let text = tokenizer
        .id_to_token(id)
        .with_context(|| format!("BOS id {id} is not in the vocabulary"))?;
    let bos = |type_id: u32| json!({"SpecialToken": {"id": text, "type_id": type_id}});
    let seq = |name: &str, type_id: u32| json!({"Sequence": {"id": name, "type_id": type_id}});
    let mut special = serde_json::Map::new();
    special.insert(
        text.clone(),
        json!({"id": text, "ids": [id], "tokens": [text]}),
    );
    let processor: PostProcessorWrapper = serde_json::from_value(json!({
        "type": "TemplateProcessing",
        "single": [bos(0), seq("A", 0)],
        "pair": [bos(0), seq("A", 0), bos(1), seq("B", 1)],
        "special_tokens": special,
    }))
    .context("building the BOS post-processor")?;
    inner.with_post_processor(Some(processor));
    Ok(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cover_every_llama_tensor() {
        assert_eq!(
            hf_name("blk.12.attn_q.weight").unwrap(),
            "model.layers.12.self_attn.q_proj.weight"
        );
        assert_eq!(
            hf_name("blk.0.ffn_down.weight").unwrap(),
            "model.layers.0.mlp.down_proj.weight"
        );
        assert_eq!(hf_name("output.weight").unwrap(), "lm_head.weight");
        assert!(hf_name("rope_freqs.weight").is_none());
        assert!(hf_name("blk.x.attn_q.weight").is_none());
    }

    /// The saved tokenizer, encoding with special tokens as transformers
    /// does, gives wick's ids: BOS exactly when wick prepends it.
    #[test]
    fn saved_tokenizer_adds_bos_as_wick_does() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama-tiny/tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(path).unwrap();
        for add_bos in [true, false] {
            let wick = Tokenizer::from_hf(inner.clone(), vec![2], Some(1), add_bos);
            let saved = hf_tokenizer(&wick).unwrap().to_string(false).unwrap();
            let hf: tokenizers::Tokenizer = saved.parse().unwrap();
            let ids = hf.encode("hi there", true).unwrap().get_ids().to_vec();
            assert_eq!(ids, wick.encode("hi there").unwrap(), "add_bos {add_bos}");
            assert_eq!(ids[0] == 1, add_bos, "{ids:?}");
        }
    }

    /// llama.cpp's permutation (`reshape(heads, 2, d/2, k).swapaxes(1, 2)`),
    /// written out independently, undone by `unpermute_rope_rows`.
    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        let (heads, hd, k) = (3, 8, 5);
        let hf: Vec<f32> = (0..heads * hd * k).map(|i| i as f32).collect();
        let mut gguf = vec![0f32; hf.len()];
        for h in 0..heads {
            for j in 0..2 {
                for i in 0..hd / 2 {
                    let (src, dst) = (h * hd + j * hd / 2 + i, h * hd + 2 * i + j);
                    gguf[dst * k..(dst + 1) * k].copy_from_slice(&hf[src * k..(src + 1) * k]);
                }
            }
        }
        let gguf = Tensor::from_vec(gguf, (heads * hd, k), &Device::Cpu).unwrap();
        let back = unpermute_rope_rows(&gguf, heads).unwrap();
        assert_eq!(back.flatten_all().unwrap().to_vec1::<f32>().unwrap(), hf);
    }
}
