//! The engine: owns the model runner, the scheduler and every sequence, and
//! advances them one continuous-batching step at a time. It speaks token ids
//! only; text, stop strings and HTTP live with whoever drives it.

pub mod block_manager;
pub mod drafter;
pub mod image_features;
pub mod mask_budget;
pub mod model_runner;
pub mod output;
pub mod pooling;
pub mod prompt;
pub mod request_rules;
pub mod sample;
pub mod scheduler;
pub mod sequence;
pub mod speculation;
pub mod state_slots;
pub mod step_budget;
pub mod step_plan;
pub mod window_blocks;

use std::time::{Duration, Instant};

use crate::engine::block_manager::BlockManager;
use crate::engine::drafter::Drafter;
use crate::engine::model_runner::ModelRunner;
use crate::engine::pooling::{Pool, Pooling};
use crate::engine::prompt::Prompt;
use crate::engine::scheduler::{Scheduler, SchedulerConfig, SchedulerStats};
use crate::engine::sequence::{SeqId, Sequence, StepEvent};
use crate::engine::speculation::Speculation;
use crate::engine::state_slots::StateSlots;
use crate::engine::step_plan::StepPlan;
use crate::engine::window_blocks::WindowBlocks;
use crate::error::{Result, WickError};
use crate::kv::cache::{KvCache, KvDtype, KvLayout};
use crate::models::vision::{ImageSpec, VisionEncoder, CHUNK_PATCHES};
use crate::models::Model;
use crate::models::ModelInfo;
use crate::sampling::params::SamplingParams;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Memory for the KV pool, in bytes; the pool never grows past it.
    pub kv_cache_bytes: usize,
    /// On a CUDA device, size the pool instead from this fraction of the
    /// device's memory, less what is in use once the weights are loaded and
    /// an activation reserve ([`gpu_kv_budget`]). `None`, or another
    /// device: `kv_cache_bytes`.
    pub gpu_memory_utilization: Option<f64>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// Most a step with prompt tokens may take, as a multiple of a
    /// decode-only step of the batch ([`step_budget`]); 0: no bound but
    /// `max_num_batched_tokens`.
    pub max_step_slowdown: f64,
    /// How K/V are stored; `None` takes the model's choice.
    pub kv_dtype: Option<KvDtype>,
    /// Take the path other devices take even on the CPU (to test it): the
    /// candle-tensor KV pool and attention, and greedy rows' argmax picked
    /// before the logits come back.
    pub force_device_path: bool,
    /// Reuse cached K/V of prompt prefixes seen before (vLLM's automatic
    /// prefix caching).
    pub prefix_caching: bool,
    /// Draft decode rows by prompt lookup ([`speculation`]).
    pub speculation: Option<Speculation>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            kv_cache_bytes: 512 << 20,
            gpu_memory_utilization: None,
            max_num_seqs: 256,
            max_num_batched_tokens: 512,
            max_step_slowdown: step_budget::DEFAULT_MAX_STEP_SLOWDOWN,
            kv_dtype: None,
            force_device_path: false,
            prefix_caching: true,
            speculation: None,
        }
    }
}

/// The scheduler's state, as the metrics report it.
pub type EngineStats = SchedulerStats;

/// The KV pool's bytes on a GPU of `total` bytes with `free` left once the
/// weights are loaded: what `utilization` of `total` allows in all, less
/// what is already used (weights, CUDA context, other processes) and the
/// activation `reserve`. Not positive is an error naming what to set.
pub fn gpu_kv_budget(
    total: u64,
    free: u64,
    utilization: f64,
    reserve: u64,
) -> std::result::Result<u64, String> {
    let allowed = (total as f64 * utilization) as u64;
    let used = total.saturating_sub(free);
    match allowed.saturating_sub(used).saturating_sub(reserve) {
        0 => Err(format!(
            "no GPU memory left for the KV cache: {} MiB of {} MiB free after loading the \
             weights, --gpu-memory-utilization {utilization} allows {} MiB in all and {} MiB \
             are kept for activations; raise --gpu-memory-utilization or set \
             --kv-cache-memory (MiB)",
            free >> 20,
            total >> 20,
            allowed >> 20,
            reserve >> 20,
        )),
        budget => Ok(budget),
    }
}

/// Device memory kept out of the KV pool for one step's work.
fn activation_reserve(info: &ModelInfo, max_num_batched_tokens: usize) -> u64 {
    // 16 hidden-wide f32 buffers and an f32 logits row per batched token; 1 GiB at least.
    let per_token = (16 * info.num_heads * info.head_dim + info.vocab_size) as u64 * 4;
    (max_num_batched_tokens as u64)
        .saturating_mul(per_token)
        .max(1 << 30)
}

/// The KV pool's bytes: on a CUDA device with `gpu_memory_utilization` set,
/// [`gpu_kv_budget`] of its memory as it is now; else `kv_cache_bytes`.
fn kv_budget(model: &dyn Model, cfg: &EngineConfig) -> Result<usize> {
    let Some(utilization) = cfg.gpu_memory_utilization else {
        return Ok(cfg.kv_cache_bytes);
    };
    let Some((free, total)) = device_memory(model.device())? else {
        return Ok(cfg.kv_cache_bytes);
    };
    let reserve = activation_reserve(model.info(), cfg.max_num_batched_tokens);
    let budget = gpu_kv_budget(total, free, utilization, reserve).map_err(WickError::Model)?;
    tracing::info!(
        "KV cache: {} MiB of GPU memory (total {} MiB, free {} MiB after loading the \
         weights, --gpu-memory-utilization {utilization}, {} MiB kept for activations)",
        budget >> 20,
        total >> 20,
        free >> 20,
        reserve >> 20,
    );
    Ok(usize::try_from(budget).unwrap_or(usize::MAX))
}

/// `(free, total)` bytes of a CUDA device's memory, once the work queued on
/// it (the weights' upload) is done; `None` for other devices.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn device_memory(device: &candle_core::Device) -> Result<Option<(u64, u64)>> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(dev) = device {
        let query = || -> std::result::Result<(usize, usize), String> {
            device.synchronize().map_err(|e| e.to_string())?;
            let stream = dev.cuda_stream();
            stream.context().mem_get_info().map_err(|e| e.to_string())
        };
        let (free, total) =
            query().map_err(|e| WickError::Model(format!("reading the GPU's free memory: {e}")))?;
        return Ok(Some((free as u64, total as u64)));
    }
    Ok(None)
}

pub struct Engine {
    runner: ModelRunner,
    scheduler: Scheduler,
    /// A draft model, when decode rows draft from one.
    drafter: Option<Drafter>,
    eos_ids: Vec<u32>,
    next_id: SeqId,
}

impl Engine {
    pub fn new(model: Box<dyn Model>, eos_ids: Vec<u32>, cfg: &EngineConfig) -> Result<Self> {
        let info = model.info().clone();
        info.check_heads().map_err(WickError::Model)?;
        let kv_dtype = cfg.kv_dtype.unwrap_or(info.kv_dtype);
        let budget = kv_budget(model.as_ref(), cfg)?;
        // A hybrid model's recurrent-state slots come out of the same
        // budget, at most `--max-num-seqs` of them and fewer where the
        // budget could not also keep a KV pool worth the name
        // ([`state_slots::split_budget`]); fewer slots cap the sequences
        // that run at once.
        let states = match model.state_bytes() {
            Some(bytes) => {
                let block_bytes = KvLayout::bytes_per_block(
                    info.num_layers,
                    info.num_kv_heads,
                    info.head_dim,
                    cfg.block_size,
                    kv_dtype,
                );
                let split = state_slots::split_budget(budget, bytes, block_bytes, cfg.max_num_seqs)
                    .map_err(WickError::Model)?;
                Some((bytes, split))
            }
            None => None,
        };
        let kv_cache_bytes = states.map_or(budget, |(_, split)| split.kv_bytes);
        let max_num_seqs = states.map_or(cfg.max_num_seqs, |(_, split)| split.num_slots);
        let layout = KvLayout::from_budget(
            info.num_layers,
            info.num_kv_heads,
            info.head_dim,
            cfg.block_size,
            kv_dtype,
            kv_cache_bytes,
        );
        if layout.num_blocks == 0 {
            return Err(WickError::Model(format!(
                "a KV budget of {} bytes holds no block of {} tokens ({} bytes); raise --kv-cache-memory",
                kv_cache_bytes,
                cfg.block_size,
                KvLayout::bytes_per_block(info.num_layers, info.num_kv_heads, info.head_dim, cfg.block_size, kv_dtype)
            )));
        }
        let scheduler_cfg = SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            max_step_slowdown: cfg.max_step_slowdown,
        };
        let caching = cfg.prefix_caching && model.state_bytes().is_none();
        let (cache, scheduler) = match info.sliding_window {
            None => (
                KvCache::new(layout, model.device(), cfg.force_device_path)?,
                Scheduler::new(
                    scheduler_cfg,
                    BlockManager::new(layout.num_blocks, cfg.block_size).with_caching(caching),
                ),
            ),
            // The sliding-window layers' K/V go in a pool of their own,
            // from which each sequence holds only its window.
            Some(window) => {
                let per_seq = WindowBlocks::held_at_most(
                    window,
                    cfg.block_size,
                    cfg.max_num_batched_tokens,
                    info.max_context,
                );
                let layout = KvLayout {
                    window_kv: info.window_kv,
                    ..layout
                };
                let block_bytes = |window: bool| {
                    let s = layout.shape(window);
                    KvLayout::bytes_per_block(
                        1,
                        s.num_kv_heads,
                        s.head_dim,
                        cfg.block_size,
                        kv_dtype,
                    )
                };
                let window_layers = info.window_layers.len();
                let (global, window_blocks) = window_blocks::split_budget(
                    kv_cache_bytes,
                    (info.num_layers - window_layers, block_bytes(false)),
                    (window_layers, block_bytes(true)),
                    cfg.max_num_seqs.saturating_mul(per_seq),
                );
                let layout = KvLayout {
                    num_blocks: global,
                    ..layout
                };
                let cache = KvCache::with_window_layers(
                    layout,
                    &info.window_layers,
                    window_blocks,
                    model.device(),
                    cfg.force_device_path,
                )?;
                let scheduler = Scheduler::new(
                    scheduler_cfg,
                    BlockManager::new(global, cfg.block_size).with_caching(caching),
                )
                .with_window(WindowBlocks::new(
                    window_blocks,
                    cfg.block_size,
                    window,
                    caching,
                ));
                (cache, scheduler)
            }
        };
        // A hybrid model's linear-attention layers keep a state per
        // sequence: a slot for every sequence that may run. A state sums up
        // a whole prefix, which cached blocks would come without, so the
        // prefix cache is off for such models (above).
        let scheduler = match states {
            Some((bytes, split)) => {
                tracing::info!(
                    "recurrent state: {} slots of {} KiB ({} MiB of the KV budget's {} MiB, \
                     allocated as sequences first use them); prefix caching is off for \
                     this model",
                    split.num_slots,
                    bytes >> 10,
                    (split.num_slots * bytes) >> 20,
                    budget >> 20,
                );
                if split.num_slots < cfg.max_num_seqs {
                    tracing::warn!(
                        "the KV budget holds {} recurrent-state slots, not --max-num-seqs {}: at \
                         most {} sequences run at once; raise --kv-cache-memory (on a GPU, \
                         --gpu-memory-utilization) for more",
                        split.num_slots,
                        cfg.max_num_seqs,
                        split.num_slots,
                    );
                }
                scheduler.with_states(StateSlots::new(split.num_slots))
            }
            None => scheduler,
        };
        // A draft rejected must leave nothing behind: a recurrent state
        // cannot be cut back. (A window pool frees only blocks that the
        // row's own first token no longer sees, which no later step needs
        // whatever the drafts' fate.) Other models draft from predictions,
        // and by prompt lookup where asked.
        let can_draft = model.state_bytes().is_none();
        if let Some(spec) = cfg.speculation {
            spec.validate().map_err(WickError::Model)?;
            match can_draft {
                true => tracing::info!(
                    "speculative decoding: prompt lookup, up to {} tokens a row, {}..={}-token \
                     matches",
                    spec.max_draft,
                    spec.ngram_min,
                    spec.ngram_max
                ),
                false => tracing::warn!(
                    "--speculative is off for this model: its recurrent-state layers cannot take \
                     back a rejected draft"
                ),
            }
        }
        let scheduler = match can_draft {
            true => scheduler.with_drafts(cfg.speculation),
            false => scheduler,
        };
        Ok(Engine {
            runner: ModelRunner::new(model, cache, cfg.force_device_path),
            scheduler,
            drafter: None,
            eos_ids,
            next_id: 0,
        })
    }

    pub fn model(&self) -> &dyn Model {
        self.runner.model()
    }

    /// With `encoder` computing the input vectors of the images prompts
    /// carry.
    pub fn with_vision(mut self, encoder: VisionEncoder) -> Self {
        self.runner.set_vision(encoder);
        self
    }

    /// How prompts hold an image, where the model takes images.
    pub fn image_spec(&self) -> Option<&ImageSpec> {
        self.runner.image_spec()
    }

    /// With `draft` proposing for decode rows that have nothing else to
    /// draft (`--draft-model`), greedily, from a KV pool of its own of
    /// `kv_cache_bytes`. It must share the target's vocabulary, and the
    /// target must be able to take a draft back.
    pub fn with_draft_model(
        mut self,
        draft: Box<dyn Model>,
        kv_cache_bytes: usize,
    ) -> Result<Self> {
        let (target, info) = (self.runner.model().info(), draft.info().clone());
        info.check_heads().map_err(WickError::Model)?;
        if info.vocab_size != target.vocab_size {
            return Err(WickError::Model(format!(
                "the draft model's vocabulary ({} tokens) is not the model's ({}): it must share \
                 the tokenizer",
                info.vocab_size, target.vocab_size
            )));
        }
        if !self.scheduler.drafts() {
            return Err(WickError::Model(
                "--draft-model cannot be used with this model: its recurrent layers cannot \
                 take back a rejected draft"
                    .into(),
            ));
        }
        if draft.state_bytes().is_some() || info.sliding_window.is_some() {
            return Err(WickError::Model(
                "the draft model has recurrent layers, which cannot take back a rejected \
                 draft, or sliding-window ones, which its KV pool does not hold"
                    .into(),
            ));
        }
        let block_size = self.scheduler.block_size();
        let layout = KvLayout::from_budget(
            info.num_layers,
            info.num_kv_heads,
            info.head_dim,
            block_size,
            info.kv_dtype,
            kv_cache_bytes,
        );
        let cache = KvCache::new(layout, draft.device(), false)?;
        tracing::info!(
            "draft model: {} layers, a KV pool of {} blocks",
            info.num_layers,
            layout.num_blocks
        );
        let blocks = BlockManager::new(layout.num_blocks, block_size);
        self.drafter = Some(Drafter::new(draft, cache, blocks));
        self.scheduler = self.scheduler.with_model_drafts();
        Ok(self)
    }

    /// Most tokens one sequence can ever hold: the whole KV pool. A request
    /// that could grow past it is refused by [`Engine::add_request`].
    pub fn max_seq_tokens(&self) -> usize {
        self.scheduler.num_blocks() * self.scheduler.block_size()
    }

    /// Queues a request after checking it can run at all.
    pub fn add_request(
        &mut self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
    ) -> Result<SeqId> {
        self.add_to_group(prompt, params, None)
    }

    /// Queues one sequence of a request whose first sequence was `group`
    /// (`None` for the first): a request's sequences share one fair share
    /// of the KV pool.
    pub fn add_to_group(
        &mut self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        group: Option<SeqId>,
    ) -> Result<SeqId> {
        let prompt = prompt.into();
        let info = self.runner.model().info();
        request_rules::check_prompt(&prompt.tokens, info.vocab_size)?;
        request_rules::check_media(&prompt, self.runner.image_spec())?;
        params.validate(info.vocab_size)?;
        request_rules::check_context(prompt.tokens.len(), params.max_tokens, info.max_context)?;
        if !params.prediction.is_empty() && !self.scheduler.drafts() {
            return Err(WickError::invalid(
                "this model cannot use a prediction: its recurrent layers cannot take back \
                 a rejected draft"
                    .to_string(),
                "prediction".to_string(),
            ));
        }
        let id = self.next_id;
        let mut seq = Sequence::new(id, prompt, params, info.max_context, &self.eos_ids);
        seq.group = group.unwrap_or(id);
        if !self.scheduler.fits(&seq) {
            let (bs, blocks) = (self.scheduler.block_size(), self.scheduler.num_blocks());
            return Err(WickError::KvCacheTooSmall(format!(
                "the request needs up to {} tokens of KV cache but the pool holds {} ({blocks} blocks of {bs}); raise --kv-cache-memory or lower max_tokens",
                seq.max_len,
                blocks * bs,
            )));
        }
        self.next_id += 1;
        self.scheduler.add(seq);
        Ok(id)
    }

    /// Queues an embedding request: `prompt` is prefilled with the rest of
    /// the batch and its final hidden states pooled; the event that ends it
    /// carries the vector.
    pub fn add_embedding(&mut self, prompt: Vec<u32>, pooling: Pooling) -> Result<SeqId> {
        let info = self.runner.model().info();
        request_rules::check_prompt(&prompt, info.vocab_size)?;
        request_rules::check_context(prompt.len(), 0, info.max_context)?;
        let seq = Sequence::embedding(self.next_id, prompt, Pool::new(pooling));
        if !self.scheduler.fits(&seq) {
            return Err(WickError::KvCacheTooSmall(format!(
                "the input needs {} tokens of KV cache, more than the pool holds; raise --kv-cache-memory",
                seq.max_len
            )));
        }
        self.next_id += 1;
        self.scheduler.add(seq);
        Ok(self.next_id - 1)
    }

    /// Drops a request wherever it is and frees its blocks. False if unknown
    /// (already finished).
    pub fn abort(&mut self, id: SeqId) -> bool {
        self.scheduler.abort(id)
    }

    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    pub fn stats(&self) -> EngineStats {
        self.scheduler.stats()
    }

    /// How long each sequence first admitted since the last call waited.
    pub fn take_queue_waits(&mut self) -> Vec<std::time::Duration> {
        self.scheduler.take_queue_waits()
    }

    /// One continuous-batching step: schedule, draft, run one forward over
    /// the flat batch (grammar masks computed alongside), sample, let the
    /// scheduler apply what came of it, then encode the images running
    /// prompts wait for in the time the step budget leaves. Its time, less
    /// the encoder's, is what the step budget learns from.
    pub fn step(&mut self) -> Vec<StepEvent> {
        let start = Instant::now();
        let runner = &self.runner;
        let mut plan = self.scheduler.schedule(&|hash| runner.has_image(hash));
        self.draft(&mut plan);
        let mut events = Vec::new();
        if !plan.is_empty() {
            let batch = plan.batch(self.scheduler.running());
            let images = plan.images(self.scheduler.running());
            let mut rows = self.scheduler.rows(&plan.rows);
            let picks = sample::picks(&mut rows, self.runner.samples_on_device());
            // Inside the rayon pool, the kernels' parallel calls are cheap
            // forks rather than a cross-thread hand-off each.
            let runner = &mut self.runner;
            let (out, masks) = rayon::join(
                || runner.execute(batch, &images, &picks),
                || sample::grammar_masks(&mut rows),
            );
            let out = sample::sample_held(runner, out, &masks);
            let outputs = (out.rows).map(|(logits, hidden)| {
                rayon::scope(|_| sample::sample(rows, logits, hidden, masks))
            });
            self.scheduler.note_forward(out.took);
            events = self.scheduler.update(&plan, outputs, &self.eos_ids);
        }
        let wanted = self.scheduler.images_wanted();
        if !wanted.is_empty() {
            let begun = Instant::now();
            let slice = self.scheduler.encode_slice();
            let until = begun + Duration::from_secs_f64(slice.seconds);
            let patches = match slice.streams_wait {
                true => CHUNK_PATCHES,
                false => usize::MAX,
            };
            let failed = self.runner.encode_images(&wanted, until, patches);
            events.extend(self.scheduler.fail_images(&failed));
            self.scheduler.note_encoding(begun.elapsed());
        }
        self.scheduler.note_step(start.elapsed());
        events
    }

    /// Has the draft model propose for the rows the plan gave placeholder
    /// drafts, after forgetting the sequences no longer running.
    fn draft(&mut self, plan: &mut StepPlan) {
        let Some(drafter) = &mut self.drafter else {
            return;
        };
        drafter.retain(&self.scheduler.running_ids());
        let start = Instant::now();
        let run = drafter.propose(self.scheduler.rows(&mut plan.rows));
        self.scheduler.note_drafts(run, start.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn gpu_budget_is_the_fraction_less_what_is_used_and_the_reserve() {
        // 80 GiB card, 16 GiB of weights and context in use: 72 allowed.
        assert_eq!(gpu_kv_budget(80 * GIB, 64 * GIB, 0.9, GIB), Ok(55 * GIB));
        // The whole card: all that is free, less the reserve.
        assert_eq!(gpu_kv_budget(80 * GIB, 64 * GIB, 1.0, GIB), Ok(63 * GIB));
        assert_eq!(
            gpu_kv_budget(80 * GIB, 64 * GIB, 1.0, 0),
            Ok(64 * GIB),
            "never more than is free"
        );
    }

    #[test]
    fn weights_past_the_fraction_are_an_error_naming_the_options() {
        // 24 GiB card with 22 GiB used: 0.9 allows 21.6 GiB.
        let err = gpu_kv_budget(24 * GIB, 2 * GIB, 0.9, GIB).unwrap_err();
        assert!(err.contains("2048 MiB of 24576 MiB free"), "{err}");
        assert!(
            err.contains("--gpu-memory-utilization") && err.contains("--kv-cache-memory"),
            "{err}"
        );
        assert!(!err.contains('\n'), "one line: {err}");
        // Room for the weights but none past the reserve is no better.
        assert!(gpu_kv_budget(24 * GIB, 4 * GIB, 0.9, 2 * GIB).is_err());
        assert!(gpu_kv_budget(24 * GIB, 4 * GIB, 0.9, GIB).is_ok());
    }

    #[test]
    fn activation_reserve_grows_with_the_batch_past_its_floor() {
        let info = ModelInfo {
            num_layers: 32,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            vocab_size: 128_256,
            max_context: 8192,
            kv_dtype: KvDtype::F16,
            window_layers: Vec::new(),
            sliding_window: None,
            window_kv: None,
        };
        assert_eq!(activation_reserve(&info, 512), GIB);
        let big = activation_reserve(&info, 8192);
        assert_eq!(big, 8192 * (16 * 4096 + 128_256) * 4);
        assert!(big > 5 * GIB);
    }
}
