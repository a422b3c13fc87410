//! Every architecture wick runs, in one table: the names a family's GGUF
//! files (`general.architecture`) and Hugging Face checkpoints
//! (`config.json`'s `model_type`) give it, and the constructor that builds
//! it from each. The loader dispatches from the table, its refusals list
//! it, and the docs' table is checked against it (the tests below). A new
//! family is a row here and its model file.
//!
//! The table sits in `models`, not `load`: its constructors take what
//! `load` has already read (a GGUF's metadata and reader, a checkpoint's
//! config text and tensors), so `load` imports it and `models` imports
//! nothing from `load`.
//!
//! What a model can do (prefix caching, drafting, a sliding-window pool) is
//! not a column: it follows the checkpoint's config, not its family (a
//! Gemma 3 without local layers has no window; a Qwen3.5 of full-attention
//! layers only keeps no recurrent state), so the engine reads it off the
//! loaded model's [`ModelInfo`](super::ModelInfo) and
//! [`Model::state_bytes`].

use std::io::{Read, Seek};

use candle_core::Device;
use candle_nn::VarBuilder;
use serde_json::Value;

use super::gemma4::Gemma4;
use super::gpt2::Gpt2;
use super::linear::WeightSpec;
use super::llama::Llama;
use super::qwen35::Qwen35;
use super::siglip::TowerMath;
use super::vision::VisionEncoder;
use super::{Gguf, Model};

/// A GGUF file's reader, as the constructors take it.
pub trait ReadSeek: Read + Seek {}

impl<T: Read + Seek> ReadSeek for T {}

/// Builds a model from a GGUF file's metadata and reader; the `usize` caps
/// its context (`--max-model-len`).
pub type FromGguf = fn(
    &Gguf,
    &mut dyn ReadSeek,
    WeightSpec,
    Option<usize>,
    &Device,
) -> anyhow::Result<Box<dyn Model>>;

/// Builds a model from a checkpoint's `config.json` text and its tensors;
/// the `usize` caps its context.
pub type FromHf = fn(&str, VarBuilder, WeightSpec, Option<usize>) -> anyhow::Result<Box<dyn Model>>;

/// The names one format gives a family, and its constructor from it.
pub struct Format<F: 'static> {
    pub names: &'static [&'static str],
    pub load: F,
}

/// A family of models one constructor builds.
pub struct Family {
    /// The models it covers, as refusals and the docs name them.
    pub models: &'static str,
    pub gguf: Option<Format<FromGguf>>,
    pub hf: Option<Format<FromHf>>,
}

pub static FAMILIES: &[Family] = &[
    Family {
        models: "Llama 2 and 3.x, Mistral, Mixtral, TinyLlama",
        gguf: Some(Format {
            names: &["llama"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["llama", "mistral", "mixtral"],
            load: llama_hf,
        }),
    },
    Family {
        models: "Ministral 3, Mistral Small 3.x, Devstral",
        gguf: Some(Format {
            names: &["mistral3"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["ministral3", "mistral3"],
            load: llama_hf,
        }),
    },
    Family {
        models: "Granite 3.x",
        gguf: Some(Format {
            names: &["granite"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["granite"],
            load: llama_hf,
        }),
    },
    Family {
        models: "Granite 3.x MoE",
        gguf: Some(Format {
            names: &["granitemoe"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["granitemoe"],
            load: llama_hf,
        }),
    },
    Family {
        models: "gpt-oss-20b, gpt-oss-120b",
        gguf: Some(Format {
            names: &["gpt-oss"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["gpt_oss"],
            load: llama_hf,
        }),
    },
    Family {
        models: "Qwen2, Qwen2.5",
        gguf: Some(Format {
            names: &["qwen2"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["qwen2"],
            load: llama_hf,
        }),
    },
    Family {
        models: "Qwen1.5-MoE, Qwen2-57B-A14B",
        gguf: Some(Format {
            names: &["qwen2moe"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["qwen2_moe"],
            load: llama_hf,
        }),
    },
    Family {
        models: "Qwen3",
        gguf: Some(Format {
            names: &["qwen3"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["qwen3"],
            load: llama_hf,
        }),
    },
    Family {
        models: "Qwen3-30B-A3B, Qwen3-Coder-30B-A3B",
        gguf: Some(Format {
            names: &["qwen3moe"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["qwen3_moe"],
            load: llama_hf,
        }),
    },
    Family {
        models: "OLMoE",
        gguf: Some(Format {
            names: &["olmoe"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["olmoe"],
            load: llama_hf,
        }),
    },
    Family {
        models: "SmolLM3",
        gguf: Some(Format {
            names: &["smollm3"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["smollm3"],
            load: llama_hf,
        }),
    },
    Family {
        models: "Phi-3.x, Phi-4-mini",
        gguf: Some(Format {
            names: &["phi3"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["phi3"],
            load: llama_hf,
        }),
    },
    Family {
        models: "Gemma 3",
        gguf: Some(Format {
            names: &["gemma3"],
            load: llama_gguf,
        }),
        hf: Some(Format {
            names: &["gemma3", "gemma3_text"],
            load: llama_hf,
        }),
    },
    Family {
        models: "Gemma 4",
        gguf: Some(Format {
            names: &["gemma4"],
            load: gemma4_gguf,
        }),
        hf: Some(Format {
            names: &["gemma4", "gemma4_text"],
            load: gemma4_hf,
        }),
    },
    Family {
        models: "Qwen3.5",
        gguf: Some(Format {
            names: &["qwen35"],
            load: qwen35_gguf,
        }),
        hf: Some(Format {
            names: &["qwen3_5", "qwen3_5_text"],
            load: qwen35_hf,
        }),
    },
    Family {
        models: "Qwen3.5-35B-A3B, Qwen3.6-35B-A3B",
        gguf: Some(Format {
            names: &["qwen35moe"],
            load: qwen35_gguf,
        }),
        hf: Some(Format {
            names: &["qwen3_5_moe", "qwen3_5_moe_text"],
            load: qwen35_hf,
        }),
    },
    Family {
        models: "GPT-2",
        gguf: None,
        hf: Some(Format {
            names: &["gpt2"],
            load: gpt2_hf,
        }),
    },
];

fn llama_gguf(
    content: &Gguf,
    mut reader: &mut dyn ReadSeek,
    spec: WeightSpec,
    context: Option<usize>,
    device: &Device,
) -> anyhow::Result<Box<dyn Model>> {
    Ok(Box::new(Llama::from_gguf(
        content,
        &mut reader,
        spec,
        context,
        device,
    )?))
}

fn llama_hf(
    config: &str,
    vb: VarBuilder,
    spec: WeightSpec,
    context: Option<usize>,
) -> anyhow::Result<Box<dyn Model>> {
    Ok(Box::new(Llama::from_safetensors(
        config, vb, spec, context,
    )?))
}

fn gemma4_gguf(
    content: &Gguf,
    mut reader: &mut dyn ReadSeek,
    spec: WeightSpec,
    context: Option<usize>,
    device: &Device,
) -> anyhow::Result<Box<dyn Model>> {
    Ok(Box::new(Gemma4::from_gguf(
        content,
        &mut reader,
        spec,
        context,
        device,
    )?))
}

fn gemma4_hf(
    config: &str,
    vb: VarBuilder,
    spec: WeightSpec,
    context: Option<usize>,
) -> anyhow::Result<Box<dyn Model>> {
    Ok(Box::new(Gemma4::from_safetensors(
        config, vb, spec, context,
    )?))
}

fn qwen35_gguf(
    content: &Gguf,
    mut reader: &mut dyn ReadSeek,
    spec: WeightSpec,
    context: Option<usize>,
    device: &Device,
) -> anyhow::Result<Box<dyn Model>> {
    Ok(Box::new(Qwen35::from_gguf(
        content,
        &mut reader,
        spec,
        context,
        device,
    )?))
}

fn qwen35_hf(
    config: &str,
    vb: VarBuilder,
    spec: WeightSpec,
    context: Option<usize>,
) -> anyhow::Result<Box<dyn Model>> {
    Ok(Box::new(Qwen35::from_safetensors(
        config, vb, spec, context,
    )?))
}

/// GPT-2's context is its `n_positions`: a cap changes nothing it holds.
fn gpt2_hf(
    config: &str,
    vb: VarBuilder,
    spec: WeightSpec,
    _context: Option<usize>,
) -> anyhow::Result<Box<dyn Model>> {
    Ok(Box::new(Gpt2::from_safetensors(config, vb, spec)?))
}

/// The constructor for GGUF files of `general.architecture` `arch`.
pub fn gguf(arch: &str) -> Option<FromGguf> {
    find(|f| &f.gguf, arch)
}

/// The constructor for checkpoints of `model_type` `model_type`.
pub fn hf(model_type: &str) -> Option<FromHf> {
    find(|f| &f.hf, model_type)
}

/// Builds a checkpoint's vision encoder from its `config.json`, its
/// `preprocessor_config.json`, the text of a token id, and its tensors.
pub type VisionFromHf = fn(
    &Value,
    &Value,
    &dyn Fn(u32) -> Option<String>,
    &VarBuilder,
) -> anyhow::Result<VisionEncoder>;

/// The `model_type`s whose checkpoints may hold a vision encoder beside
/// the language model (their `vision_config`), and its constructor: the
/// tower's products on bf16 tiles when the checkpoint is loaded in bf16.
static VISION: &[(&str, VisionFromHf)] = &[("gemma3", |config, pre, text, vb| {
    VisionEncoder::gemma3(
        config,
        pre,
        text,
        vb,
        TowerMath::for_weights(vb.dtype(), vb.device()),
    )
})];

/// The vision encoder constructor for a `model_type`, if it has one.
pub fn hf_vision(model_type: &str) -> Option<VisionFromHf> {
    VISION
        .iter()
        .find(|(name, _)| *name == model_type)
        .map(|(_, build)| *build)
}

fn find<F: Copy>(format: fn(&Family) -> &Option<Format<F>>, name: &str) -> Option<F> {
    FAMILIES
        .iter()
        .filter_map(|f| format(f).as_ref())
        .find(|g| g.names.contains(&name))
        .map(|g| g.load)
}

/// The GGUF architectures wick runs, for a refusal: each quoted, with the
/// models it covers, in the table's order.
pub fn gguf_supported() -> String {
    let names = FAMILIES.iter().flat_map(|f| {
        let names = f.gguf.as_ref().map_or(&[][..], |g| g.names);
        names.iter().map(move |n| format!("{n:?} ({})", f.models))
    });
    and_list(names.collect())
}

/// The checkpoint `model_type`s wick runs, for a refusal: alphabetically.
pub fn hf_supported() -> String {
    let mut names: Vec<String> = FAMILIES
        .iter()
        .filter_map(|f| f.hf.as_ref())
        .flat_map(|h| h.names.iter().map(|n| n.to_string()))
        .collect();
    names.sort();
    and_list(names)
}

/// `a, b and c`.
fn and_list(mut items: Vec<String>) -> String {
    match items.pop() {
        Some(last) if !items.is_empty() => format!("{} and {last}", items.join(", ")),
        last => last.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A format's names as the docs write them: quoted as code, or
    /// `(none)`.
    fn cell<F>(format: &Option<Format<F>>) -> String {
        match format {
            Some(f) => f
                .names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", "),
            None => "(none)".into(),
        }
    }

    /// The cells of each row of the first table after `heading`.
    fn table_after(text: &str, heading: &str) -> Vec<Vec<String>> {
        let (_, rest) = text.split_once(heading).expect("heading");
        rest.lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .map(|l| {
                let l = l.trim().trim_start_matches('|').trim_end_matches('|');
                l.split('|').map(|c| c.trim().to_string()).collect()
            })
            .collect()
    }

    /// docs/deploy.md's table of architectures has exactly the registry's
    /// rows, in its order, and its names.
    #[test]
    fn the_docs_table_is_the_registry() {
        let docs = include_str!("../../docs/deploy.md");
        let got: Vec<Vec<String>> = table_after(docs, "### Architectures")
            .into_iter()
            .map(|row| row[..3].to_vec())
            .collect();
        let want: Vec<Vec<String>> = FAMILIES
            .iter()
            .map(|f| vec![f.models.to_string(), cell(&f.gguf), cell(&f.hf)])
            .collect();
        assert_eq!(got, want);
    }

    /// The README's table of sources names exactly the registry's GGUF
    /// architectures and checkpoint `model_type`s.
    #[test]
    fn the_readme_names_the_registry() {
        let readme = include_str!("../../README.md");
        let rows = table_after(readme, "## Models and formats");
        let named = |source: &str| -> Vec<String> {
            let row = rows.iter().find(|r| r[0] == source).expect(source);
            row[2]
                .split('`')
                .skip(1)
                .step_by(2)
                .map(String::from)
                .collect()
        };
        let names = |format: fn(&Family) -> Vec<&str>| -> Vec<String> {
            FAMILIES.iter().flat_map(format).map(String::from).collect()
        };
        assert_eq!(
            named("GGUF file"),
            names(|f| f.gguf.as_ref().map_or(vec![], |g| g.names.to_vec()))
        );
        assert_eq!(
            named("Hugging Face checkpoint"),
            names(|f| f.hf.as_ref().map_or(vec![], |h| h.names.to_vec()))
        );
    }

    #[test]
    fn refusals_list_what_the_table_runs() {
        assert_eq!(
            hf_supported(),
            "gemma3, gemma3_text, gemma4, gemma4_text, gpt2, gpt_oss, granite, granitemoe, llama, \
             ministral3, mistral, mistral3, mixtral, olmoe, phi3, qwen2, qwen2_moe, qwen3, \
             qwen3_5, qwen3_5_moe, qwen3_5_moe_text, qwen3_5_text, qwen3_moe and smollm3"
        );
        assert!(gguf_supported()
            .starts_with("\"llama\" (Llama 2 and 3.x, Mistral, Mixtral, TinyLlama), "));
        assert!(gguf_supported().ends_with(" and \"qwen35moe\" (Qwen3.5-35B-A3B, Qwen3.6-35B-A3B)"));
        assert!(gguf("mamba").is_none() && hf("falcon").is_none());
    }
}
