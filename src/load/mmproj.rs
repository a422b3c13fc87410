//! A llama.cpp multimodal projector file (`--mmproj`): the vision tower and
//! projector that llama.cpp's converter writes beside a text GGUF
//! (`convert_hf_to_gguf.py --mmproj`, `general.architecture` `clip`). Its
//! metadata and tensors are read back into the checkpoint's terms (the
//! vision config, the image processor's config and the HF tensor names),
//! so one encoder ([`VisionEncoder`]) serves both kinds of file.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::{Content, Value as GgufValue};
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use serde_json::json;

use crate::models::linear::WeightFormat;
use crate::models::siglip::TowerMath;
use crate::models::vision::VisionEncoder;
use crate::text::tokenizer::Tokenizer;

/// The encoder in `path`, for a language model whose embeddings are
/// `text_hidden` wide and whose vocabulary is `tokenizer`'s. A tower stored
/// in F16 or BF16 multiplies on bf16 tiles where the CPU has them, unless
/// `weights` is `f32`.
pub fn load(
    path: &Path,
    text_hidden: usize,
    tokenizer: &Tokenizer,
    weights: WeightFormat,
    device: &Device,
) -> Result<VisionEncoder> {
    let shown = path.display();
    let file = File::open(path).with_context(|| format!("cannot open --mmproj {shown}"))?;
    let mut reader = BufReader::new(file);
    let content = Content::read(&mut reader)
        .with_context(|| format!("--mmproj {shown} is not a readable GGUF file"))?;
    let meta = Meta(&content);
    let arch = meta.string("general.architecture").unwrap_or_default();
    if arch != "clip" || !meta.flag("clip.has_vision_encoder") {
        bail!("--mmproj {shown} is not a vision projector file (architecture {arch:?})");
    }
    let projector = meta.string("clip.projector_type").unwrap_or_default();
    if projector != "gemma3" {
        bail!(
            "--mmproj {shown}: projector type {projector:?} is not supported; wick serves gemma3"
        );
    }
    // `[vision width, text width]`, as transformers holds it.
    let projection = content.tensor_infos.get("mm.input_projection.weight");
    let width = projection.and_then(|t| t.shape.dims().last().copied());
    if width != Some(text_hidden) {
        bail!(
            "--mmproj {shown} projects images to {} wide embeddings; the model's are \
             {text_hidden}: the two files are not a pair",
            width.map_or("unknown".into(), |w| w.to_string())
        );
    }
    let (config, preprocessor) = gemma3_configs(&meta, text_hidden, tokenizer)
        .with_context(|| format!("--mmproj {shown}"))?;
    let mut tensors = HashMap::new();
    for name in content.tensor_infos.keys() {
        let hf =
            hf_name(name).with_context(|| format!("--mmproj {shown}: unexpected tensor {name}"))?;
        let mut t = content
            .tensor(&mut reader, name, device)?
            .dequantize(device)?
            .to_dtype(DType::F32)?;
        // The converter stores this RMS norm's weight as 1 + w (llama.cpp
        // multiplies by it); the projector, as transformers', adds the 1.
        if name == "mm.soft_emb_norm.weight" {
            t = (t - 1.0)?;
        }
        tensors.insert(hf, t);
    }
    let vb = VarBuilder::from_tensors(tensors, DType::F32, device);
    let stored = content
        .tensor_infos
        .get("v.blk.0.attn_q.weight")
        .map(|t| t.ggml_dtype);
    let math = match (weights, stored) {
        (WeightFormat::F32, _) => TowerMath::Native,
        (_, Some(GgmlDType::F16)) => TowerMath::for_weights(DType::F16, device),
        (_, Some(GgmlDType::BF16)) => TowerMath::for_weights(DType::BF16, device),
        _ => TowerMath::Native,
    };
    let token_text = |id| tokenizer.id_to_token(id);
    VisionEncoder::gemma3(&config, &preprocessor, token_text, &vb, math)
        .with_context(|| format!("--mmproj {shown}"))
}

/// Gemma 3's `config.json` and `preprocessor_config.json`, as far as the
/// encoder reads them, from the file's metadata; the image token ids from
/// the text model's vocabulary.
fn gemma3_configs(
    meta: &Meta,
    text_hidden: usize,
    tokenizer: &Tokenizer,
) -> Result<(serde_json::Value, serde_json::Value)> {
    let image_size = meta.usize("clip.vision.image_size")?;
    let patch_size = meta.usize("clip.vision.patch_size")?;
    // Patches pooled along each side per image token; llama.cpp's default.
    let scale = match meta.0.metadata.get("clip.vision.projector.scale_factor") {
        Some(_) => meta.usize("clip.vision.projector.scale_factor")?,
        None => 4,
    };
    let side = (image_size / patch_size.max(1)) / scale.max(1);
    let id = |text: &str| {
        tokenizer
            .token_to_id(text)
            .with_context(|| format!("the model's vocabulary has no {text}"))
    };
    let config = json!({
        "vision_config": {
            "hidden_size": meta.usize("clip.vision.embedding_length")?,
            "intermediate_size": meta.usize("clip.vision.feed_forward_length")?,
            "num_hidden_layers": meta.usize("clip.vision.block_count")?,
            "num_attention_heads": meta.usize("clip.vision.attention.head_count")?,
            "image_size": image_size,
            "patch_size": patch_size,
            "layer_norm_eps": meta.f32("clip.vision.attention.layer_norm_epsilon")?,
        },
        "text_config": {"hidden_size": text_hidden},
        "mm_tokens_per_image": side * side,
        "boi_token_index": id("<start_of_image>")?,
        "eoi_token_index": id("<end_of_image>")?,
        "image_token_index": id("<image_soft_token>")?,
    });
    // Gemma3ImageProcessor's: bilinear resize to the tower's size, 1/255,
    // then the file's mean and std.
    let preprocessor = json!({
        "size": {"height": image_size, "width": image_size},
        "resample": 2,
        "rescale_factor": 1.0 / 255.0,
        "image_mean": meta.floats("clip.vision.image_mean")?,
        "image_std": meta.floats("clip.vision.image_std")?,
    });
    Ok((config, preprocessor))
}

/// The checkpoint's name for a tensor of the file (llama.cpp's names, as
/// its converter maps Gemma 3's SigLIP and projector).
fn hf_name(gguf: &str) -> Option<String> {
    let fixed = match gguf {
        "v.patch_embd.weight" => "vision_tower.embeddings.patch_embedding.weight",
        "v.patch_embd.bias" => "vision_tower.embeddings.patch_embedding.bias",
        "v.position_embd.weight" => "vision_tower.embeddings.position_embedding.weight",
        "v.post_ln.weight" => "vision_tower.post_layernorm.weight",
        "v.post_ln.bias" => "vision_tower.post_layernorm.bias",
        "mm.input_projection.weight" => "multi_modal_projector.mm_input_projection_weight",
        "mm.soft_emb_norm.weight" => "multi_modal_projector.mm_soft_emb_norm.weight",
        _ => "",
    };
    if !fixed.is_empty() {
        return Some(fixed.to_string());
    }
    let rest = gguf.strip_prefix("v.blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, kind) = rest.rsplit_once('.')?;
    let part = match part {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_out" => "self_attn.out_proj",
        "ln1" => "layer_norm1",
        "ln2" => "layer_norm2",
        "ffn_up" => "mlp.fc1",
        "ffn_down" => "mlp.fc2",
        _ => return None,
    };
    matches!(kind, "weight" | "bias")
        .then(|| format!("vision_tower.encoder.layers.{layer}.{part}.{kind}"))
}

/// The file's metadata, each value read as the encoder needs it.
struct Meta<'a>(&'a Content);

impl Meta<'_> {
    fn get(&self, key: &str) -> Result<&GgufValue> {
        self.0
            .metadata
            .get(key)
            .with_context(|| format!("the file has no {key}"))
    }

    fn string(&self, key: &str) -> Option<String> {
        self.get(key).ok()?.to_string().ok().cloned()
    }

    fn flag(&self, key: &str) -> bool {
        self.get(key).is_ok_and(|v| v.to_bool().unwrap_or(false))
    }

    fn usize(&self, key: &str) -> Result<usize> {
        let v = self.get(key)?;
        let n = v
            .to_u32()
            .map(u64::from)
            .or_else(|_| v.to_u64())
            .or_else(|_| v.to_i32().map(|n| n.max(0) as u64))
            .with_context(|| format!("{key} is not a count"))?;
        Ok(n as usize)
    }

    fn f32(&self, key: &str) -> Result<f32> {
        self.get(key)?
            .to_f32()
            .with_context(|| format!("{key} is not a number"))
    }

    fn floats(&self, key: &str) -> Result<Vec<f32>> {
        self.get(key)?
            .to_vec()
            .with_context(|| format!("{key} is not a list"))?
            .iter()
            .map(|v| {
                v.to_f32()
                    .with_context(|| format!("{key} holds a non-number"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_names_map_to_the_checkpoint_s() {
        for (gguf, hf) in [
            (
                "v.blk.3.attn_out.bias",
                "vision_tower.encoder.layers.3.self_attn.out_proj.bias",
            ),
            (
                "v.blk.0.ffn_up.weight",
                "vision_tower.encoder.layers.0.mlp.fc1.weight",
            ),
            (
                "v.blk.12.ln2.weight",
                "vision_tower.encoder.layers.12.layer_norm2.weight",
            ),
            (
                "mm.soft_emb_norm.weight",
                "multi_modal_projector.mm_soft_emb_norm.weight",
            ),
        ] {
            assert_eq!(hf_name(gguf).as_deref(), Some(hf), "{gguf}");
        }
        for odd in [
            "v.blk.x.ln1.weight",
            "v.blk.0.attn_qkv.weight",
            "v.blk.0.ln1.scale",
            "a.x",
        ] {
            assert_eq!(hf_name(odd), None, "{odd}");
        }
    }
}
