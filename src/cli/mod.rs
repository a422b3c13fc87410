//! Command-line options shared by every subcommand that loads a model.

pub mod bench;
pub mod export_hf;
pub mod generate;

use std::path::PathBuf;

use clap::Args;

use crate::engine::kv_cache::KvDtype;
use crate::engine::EngineConfig;
use crate::load::loader::{LoadOptions, WeightDtype};
use crate::models::linear::WeightFormat;
use crate::quant::Kernel;

#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// A GGUF file, a Hugging Face checkpoint directory, or a hub repo id
    /// (ORG/NAME) found in the Hugging Face cache. Without it wick uses
    /// SmolLM2-135M-Instruct Q4_1, fetching it into its cache ($WICK_HOME,
    /// else ~/.cache/wick) on first use.
    #[arg(long, env = "WICK_MODEL")]
    pub model: Option<String>,
    /// How weights are held and multiplied.
    #[arg(long, value_enum, default_value_t = WeightFormat::Native, env = "WICK_WEIGHTS")]
    pub weights: WeightFormat,
    /// Which CPU code path multiplies weights held on wick's own kernels:
    /// the fastest this CPU runs, or a named one (generic runs anywhere).
    #[arg(long, value_enum, default_value_t = Kernel::Auto, env = "WICK_CPU_KERNEL")]
    pub cpu_kernel: Kernel,
    /// Dtype of safetensors weights (Hugging Face checkpoints).
    #[arg(long, value_enum, default_value_t = WeightDtype::F32, env = "WICK_DTYPE")]
    pub dtype: WeightDtype,
    /// A Jinja chat template file, used instead of the model's own (or where
    /// it has none, e.g. GPT-2).
    #[arg(long, env = "WICK_CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
    /// cpu, or cuda[:N] in a build with the `cuda` feature.
    #[arg(long, default_value = "cpu", env = "WICK_DEVICE")]
    pub device: String,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Memory for the paged KV cache, in MiB.
    #[arg(long, default_value_t = 512, env = "WICK_KV_CACHE_MEMORY")]
    pub kv_cache_memory: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16, env = "WICK_BLOCK_SIZE")]
    pub block_size: usize,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 256, env = "WICK_MAX_NUM_SEQS")]
    pub max_num_seqs: usize,
    /// Most tokens (prefill chunks plus decode rows) in one forward pass.
    #[arg(long, default_value_t = 512, env = "WICK_MAX_NUM_BATCHED_TOKENS")]
    pub max_num_batched_tokens: usize,
    /// How K/V are cached; default f32 for f32 weights, else f16. int8
    /// (per token and head, CPU only) takes about half f16's memory and
    /// bandwidth, which speeds up decoding many streams.
    #[arg(long, value_enum, env = "WICK_KV_CACHE_DTYPE")]
    pub kv_cache_dtype: Option<KvDtype>,
    /// Compute every prompt in full instead of reusing the cached K/V of a
    /// prefix seen before (automatic prefix caching is on by default).
    /// Also `--no-prefix-caching=false` (how a config file states it).
    #[arg(
        long,
        env = "WICK_NO_PREFIX_CACHING",
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub no_prefix_caching: bool,
}

impl EngineArgs {
    pub fn config(&self) -> EngineConfig {
        EngineConfig {
            block_size: self.block_size,
            kv_cache_bytes: self.kv_cache_memory << 20,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            kv_dtype: self.kv_cache_dtype,
            force_tensor_kv: false,
            prefix_caching: !self.no_prefix_caching,
        }
    }
}

impl ModelArgs {
    pub fn model_path(&self) -> anyhow::Result<PathBuf> {
        crate::load::model_fetch::resolve_model(self.model.as_deref())
    }

    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            weights: self.weights,
            kernel: self.cpu_kernel,
            dtype: self.dtype,
            chat_template: self.chat_template.clone(),
            context: None,
        }
    }
}
