//! Command-line options shared by every subcommand that loads a model.

pub mod bench;
pub mod export_hf;
pub mod generate;

use std::path::PathBuf;

use clap::Args;

use crate::engine::speculation::Speculation;
use crate::engine::step_budget::DEFAULT_MAX_STEP_SLOWDOWN;
use crate::engine::EngineConfig;
use crate::kv::cache::KvDtype;
use crate::load::loader::{LoadOptions, Projector, WeightDtype};
use crate::models::linear::WeightFormat;
use crate::quant::Kernel;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Model")]
pub struct ModelArgs {
    /// A GGUF file, a checkpoint directory, ORG/NAME or ORG/NAME:Q4_K_M (default: SmolLM2-135M).
    #[arg(long, env = "WICK_MODEL")]
    pub model: Option<String>,
    /// How weights are held and multiplied.
    #[arg(long, value_enum, default_value_t = WeightFormat::Native, env = "WICK_WEIGHTS")]
    pub weights: WeightFormat,
    /// CPU code path for wick's kernels (generic runs anywhere).
    #[arg(long, value_enum, default_value_t = Kernel::Auto, env = "WICK_CPU_KERNEL")]
    pub cpu_kernel: Kernel,
    /// Dtype of a checkpoint's safetensors weights.
    #[arg(long, value_enum, default_value_t = WeightDtype::F32, env = "WICK_DTYPE")]
    pub dtype: WeightDtype,
    /// A Jinja chat template file, instead of the model's own.
    #[arg(long, env = "WICK_CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
    /// cpu, or cuda[:N] in a build with the `cuda` feature.
    #[arg(long, default_value = "cpu", env = "WICK_DEVICE")]
    pub device: String,
    /// A llama.cpp vision projector GGUF (mmproj) for a GGUF model: images in.
    /// A hub GGUF repo's own is fetched and used unless --no-mmproj.
    #[arg(long, env = "WICK_MMPROJ", conflicts_with = "no_mmproj")]
    pub mmproj: Option<PathBuf>,
    /// Not the vision projector of a hub GGUF repo: text only.
    #[arg(
        long,
        env = "WICK_NO_MMPROJ",
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub no_mmproj: bool,
    /// A smaller model, same tokenizer, to draft tokens (speculative decoding).
    #[arg(long, env = "WICK_DRAFT_MODEL")]
    pub draft_model: Option<String>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Engine")]
pub struct EngineArgs {
    /// Memory for the paged KV cache, in MiB (CPU default: 512).
    #[arg(long, env = "WICK_KV_CACHE_MEMORY")]
    pub kv_cache_memory: Option<usize>,
    /// Share of the GPU's memory wick may use in all.
    #[arg(
        long,
        default_value_t = 0.9,
        env = "WICK_GPU_MEMORY_UTILIZATION",
        value_parser = parse_utilization,
    )]
    pub gpu_memory_utilization: f64,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16, env = "WICK_BLOCK_SIZE")]
    pub block_size: usize,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 256, env = "WICK_MAX_NUM_SEQS")]
    pub max_num_seqs: usize,
    /// Most tokens in one forward pass.
    #[arg(long, default_value_t = 512, env = "WICK_MAX_NUM_BATCHED_TOKENS")]
    pub max_num_batched_tokens: usize,
    /// Most a prefill-carrying step may take, in decode-only steps (0: no bound).
    #[arg(
        long,
        default_value_t = DEFAULT_MAX_STEP_SLOWDOWN,
        env = "WICK_MAX_STEP_SLOWDOWN",
        value_parser = parse_slowdown,
    )]
    pub max_step_slowdown: f64,
    /// Threads for kernels, sampling and grammar masks (default: physical cores).
    #[arg(long, env = "WICK_THREADS", value_parser = parse_threads)]
    pub threads: Option<usize>,
    /// How K/V are cached (default: f16, or f32 for f32 weights).
    #[arg(long, value_enum, env = "WICK_KV_CACHE_DTYPE")]
    pub kv_cache_dtype: Option<KvDtype>,
    /// Compute every prompt in full (no prefix caching).
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
    /// Speculative decoding: `ngram` drafts by prompt lookup.
    #[arg(long, value_enum, default_value_t = SpecMethod::None, env = "WICK_SPECULATIVE")]
    pub speculative: SpecMethod,
    /// Most tokens drafted for one sequence in one step.
    #[arg(long, default_value_t = Speculation::default().max_draft, env = "WICK_NUM_SPECULATIVE_TOKENS", value_parser = parse_positive)]
    pub num_speculative_tokens: usize,
    /// Longest run of last tokens prompt lookup matches.
    #[arg(long, default_value_t = Speculation::default().ngram_max, env = "WICK_PROMPT_LOOKUP_MAX", value_parser = parse_positive)]
    pub prompt_lookup_max: usize,
    /// Shortest run of last tokens prompt lookup matches.
    #[arg(long, default_value_t = Speculation::default().ngram_min, env = "WICK_PROMPT_LOOKUP_MIN", value_parser = parse_positive)]
    pub prompt_lookup_min: usize,
}

/// --speculative's methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpecMethod {
    None,
    Ngram,
}

/// The KV budget in MiB where --kv-cache-memory is unset and no GPU sizes it.
pub const DEFAULT_KV_CACHE_MIB: usize = 512;

/// --max-step-slowdown: 0 (off), or a multiple of at least 1.
fn parse_slowdown(s: &str) -> Result<f64, String> {
    let x: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if x == 0.0 || (x.is_finite() && x >= 1.0) {
        Ok(x)
    } else {
        Err(format!(
            "must be a multiple of at least 1 (e.g. 2.5), or 0 for no bound, got {s}"
        ))
    }
}

/// A count of at least one.
fn parse_positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("must be a whole number, at least 1, got {s}")),
    }
}

/// --threads: at least one.
fn parse_threads(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "must be a whole number of threads, at least 1, got {s}"
        )),
    }
}

/// Where the thread count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadSource {
    Flag,
    RayonEnv,
    PhysicalCores,
}

/// The kernels' thread count: `--threads`, else a valid
/// `RAYON_NUM_THREADS` (`rayon_env`), else the physical cores, no more
/// than the CPUs this process may use (`available`: a cgroup quota or an
/// affinity mask can allow fewer than the machine has).
pub fn thread_count(
    threads: Option<usize>,
    rayon_env: Option<&str>,
    physical: usize,
    available: usize,
) -> (usize, ThreadSource) {
    if let Some(n) = threads {
        return (n, ThreadSource::Flag);
    }
    if let Some(n) = rayon_env.and_then(|v| v.trim().parse::<usize>().ok()) {
        if n > 0 {
            return (n, ThreadSource::RayonEnv);
        }
    }
    (physical.min(available).max(1), ThreadSource::PhysicalCores)
}

/// Sizes the global rayon pool, which wick's kernels, sampling and
/// grammar masks run on, before anything uses it, and logs the count.
/// RAYON_NUM_THREADS is set to the same count, so candle's own CPU ops
/// (which read it) agree. Call it once, early, while the process has one
/// thread.
pub fn init_threads(threads: Option<usize>) -> usize {
    let env = std::env::var("RAYON_NUM_THREADS").ok();
    let (n, source) = thread_count(
        threads,
        env.as_deref(),
        num_cpus::get_physical(),
        num_cpus::get(),
    );
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    if let Err(e) = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
    {
        tracing::warn!("the thread pool was already set up: {e}");
        return rayon::current_num_threads();
    }
    let from = match source {
        ThreadSource::Flag => "--threads",
        ThreadSource::RayonEnv => "RAYON_NUM_THREADS",
        ThreadSource::PhysicalCores => "physical cores",
    };
    tracing::info!("{n} threads ({from})");
    n
}

/// --gpu-memory-utilization: a fraction above 0 and at most 1.
fn parse_utilization(s: &str) -> Result<f64, String> {
    let u: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if u > 0.0 && u <= 1.0 {
        Ok(u)
    } else {
        Err(format!(
            "must be a fraction of GPU memory above 0 and at most 1 (e.g. 0.9), got {s}"
        ))
    }
}

impl EngineArgs {
    pub fn config(&self) -> EngineConfig {
        EngineConfig {
            block_size: self.block_size,
            kv_cache_bytes: self.kv_cache_memory.unwrap_or(DEFAULT_KV_CACHE_MIB) << 20,
            gpu_memory_utilization: self
                .kv_cache_memory
                .is_none()
                .then_some(self.gpu_memory_utilization),
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_step_slowdown: self.max_step_slowdown,
            kv_dtype: self.kv_cache_dtype,
            force_device_path: false,
            prefix_caching: !self.no_prefix_caching,
            speculation: (self.speculative == SpecMethod::Ngram).then_some(Speculation {
                max_draft: self.num_speculative_tokens,
                ngram_max: self.prompt_lookup_max,
                ngram_min: self.prompt_lookup_min,
            }),
        }
    }
}

impl ModelArgs {
    pub fn model_path(&self) -> anyhow::Result<PathBuf> {
        crate::load::model_fetch::resolve_model(self.model.as_deref())
    }

    /// `engine` with the draft model (--draft-model) loaded beside it,
    /// where one is named, on `device` as `options` say.
    pub fn with_draft(
        &self,
        engine: crate::engine::Engine,
        options: &LoadOptions,
        device: &candle_core::Device,
    ) -> anyhow::Result<crate::engine::Engine> {
        let Some(name) = &self.draft_model else {
            return Ok(engine);
        };
        let path = crate::load::model_fetch::resolve_model(Some(name))?;
        // Drafts must be cheap: the draft model keeps its file's own
        // format whatever --weights makes of the served one (a Q4 file
        // can draft for its own f32 form).
        let options = LoadOptions {
            weights: WeightFormat::Native,
            mmproj: None,
            ..options.clone()
        };
        let draft = crate::load::loader::load(&path, &options, device)
            .map_err(|e| anyhow::anyhow!("loading the draft model {name}: {e:#}"))?;
        let mib = self.engine.kv_cache_memory.unwrap_or(DEFAULT_KV_CACHE_MIB);
        Ok(engine.with_draft_model(draft.model, (mib << 20) / 4)?)
    }

    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            weights: self.weights,
            kernel: self.cpu_kernel,
            dtype: self.dtype,
            chat_template: self.chat_template.clone(),
            context: None,
            mmproj: match &self.mmproj {
                Some(file) => Some(Projector::Named(file.clone())),
                None => self.repo_projector().map(Projector::Found),
            },
        }
    }

    /// The vision projector the hub cache holds beside `--model`'s GGUF,
    /// when `--model` is a repo and `--no-mmproj` is not given.
    fn repo_projector(&self) -> Option<PathBuf> {
        let arg = self.model.as_deref().filter(|_| !self.no_mmproj)?;
        let is_repo = !std::path::Path::new(arg).exists() && crate::load::hub::is_repo_id(arg);
        is_repo.then(|| crate::load::hub::projector(arg)).flatten()
    }
}

#[cfg(test)]
mod tests {
    use clap::{Command, FromArgMatches};

    use super::*;

    fn parse(argv: &[&str]) -> Result<EngineArgs, clap::Error> {
        let cmd = EngineArgs::augment_args(Command::new("wick")).mut_args(|a| a.env(None));
        let m = cmd.try_get_matches_from(std::iter::once("wick").chain(argv.iter().copied()))?;
        EngineArgs::from_arg_matches(&m)
    }

    #[test]
    fn unset_kv_cache_memory_is_512_mib_or_the_gpu_share() {
        let cfg = parse(&[]).unwrap().config();
        assert_eq!(cfg.kv_cache_bytes, 512 << 20);
        assert_eq!(cfg.gpu_memory_utilization, Some(0.9));
        let cfg = parse(&["--gpu-memory-utilization", "0.5"])
            .unwrap()
            .config();
        assert_eq!(cfg.gpu_memory_utilization, Some(0.5));
    }

    #[test]
    fn set_kv_cache_memory_wins() {
        let cfg = parse(&["--kv-cache-memory", "64", "--gpu-memory-utilization", "1"])
            .unwrap()
            .config();
        assert_eq!(cfg.kv_cache_bytes, 64 << 20);
        assert_eq!(cfg.gpu_memory_utilization, None);
    }

    #[test]
    fn step_slowdown_defaults_and_bounds() {
        assert_eq!(parse(&[]).unwrap().config().max_step_slowdown, 2.5);
        for (arg, want) in [("4", 4.0), ("1", 1.0), ("0", 0.0)] {
            let a = parse(&["--max-step-slowdown", arg]).unwrap();
            assert_eq!(a.config().max_step_slowdown, want);
        }
        for bad in ["0.5", "-1", "inf", "NaN", "fast"] {
            let arg = format!("--max-step-slowdown={bad}");
            let err = parse(&[&arg]).unwrap_err().to_string();
            assert!(err.contains("--max-step-slowdown"), "{bad}: {err}");
        }
    }

    #[test]
    fn threads_from_the_option_then_rayon_then_physical_cores() {
        use ThreadSource::*;
        assert_eq!(parse(&[]).unwrap().threads, None);
        assert_eq!(parse(&["--threads", "3"]).unwrap().threads, Some(3));
        assert!(parse(&["--threads", "0"]).is_err());
        assert_eq!(thread_count(Some(3), Some("8"), 4, 8), (3, Flag));
        assert_eq!(thread_count(None, Some("8"), 4, 8), (8, RayonEnv));
        assert_eq!(thread_count(None, Some(" 6 "), 4, 8), (6, RayonEnv));
        for junk in ["0", "", "many"] {
            assert_eq!(thread_count(None, Some(junk), 4, 8), (4, PhysicalCores));
        }
        assert_eq!(thread_count(None, None, 4, 8), (4, PhysicalCores));
        // A CPU quota of two on a 16-core host: two.
        assert_eq!(thread_count(None, None, 16, 2), (2, PhysicalCores));
        assert_eq!(thread_count(None, None, 0, 0), (1, PhysicalCores));
    }

    #[test]
    fn utilization_must_be_a_fraction() {
        assert_eq!(
            parse(&["--gpu-memory-utilization", "1"])
                .unwrap()
                .gpu_memory_utilization,
            1.0
        );
        for bad in ["0", "-0.5", "1.01", "NaN", "ninety"] {
            let arg = format!("--gpu-memory-utilization={bad}");
            let err = parse(&[&arg]).unwrap_err().to_string();
            assert!(
                err.contains("--gpu-memory-utilization") && err.contains(bad),
                "{bad}: {err}"
            );
        }
    }
}
