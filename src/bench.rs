//! `wick bench`: prefill and decode throughput of the engine on synthetic
//! prompts, per weight format, optionally beside llama.cpp's `llama-bench` on
//! the same file so the ratios come from one run on one machine. For a GGUF
//! it also measures the machine's memory read bandwidth and the decode speed
//! that bandwidth allows, the ceiling for one stream.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use candle_core::quantized::gguf_file::Content;
use clap::Args;
use rayon::prelude::*;

use crate::cli::EngineArgs;
use crate::engine::Engine;
use crate::models::linear::WeightFormat;
use crate::quant::WeightBuf;
use crate::sampling_params::SamplingParams;

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[arg(long, env = "WICK_MODEL")]
    pub model: Option<String>,
    /// Weight formats to measure, comma separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "native")]
    pub weights: Vec<WeightFormat>,
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Prompt length for the prefill figure.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Decode steps timed per batch size.
    #[arg(long, default_value_t = 128)]
    pub decode_tokens: usize,
    /// Concurrent sequences for the decode figures, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub batch: Vec<usize>,
    /// Path to llama.cpp's `llama-bench`; runs `-t 2 -p P -n N` on the same file.
    #[arg(long)]
    pub llama_bench: Option<PathBuf>,
    /// One more argument for llama-bench (repeatable), e.g.
    /// `--llama-bench-arg=--repack --llama-bench-arg=0` where its AMX repacking
    /// crashes (CPUs that report AMX that the VM does not enable).
    #[arg(long, allow_hyphen_values = true)]
    pub llama_bench_arg: Vec<String>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Debug, serde::Serialize)]
struct Row {
    weights: WeightFormat,
    prefill_tok_s: f64,
    /// (batch size, aggregate decode tok/s)
    decode_tok_s: Vec<(usize, f64)>,
    /// One stream's fastest window of `WINDOW` decode steps, in tok/s: a
    /// best case, like the bandwidth probe's, to set against its bound.
    decode_best_window_tok_s: Option<f64>,
}

/// Decode steps per window for [`Row::decode_best_window_tok_s`].
const WINDOW: usize = 16;

/// Distinct, non-special token ids for sequence `seq`.
fn synthetic_prompt(seq: usize, len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|i| (100 + (i * 7919 + seq * 104_729) % (vocab - 100)) as u32)
        .collect()
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        temperature: 0.0,
        ignore_eos: true,
        ..Default::default()
    }
}

fn measure(args: &BenchArgs, path: &std::path::Path, weights: WeightFormat) -> anyhow::Result<Row> {
    let device = crate::loader::device(&args.device)?;
    let loaded = crate::loader::load(path, &weights.into(), &device)?;
    let mut cfg = args.engine.config();
    cfg.max_num_batched_tokens = cfg.max_num_batched_tokens.max(args.prompt_tokens);
    let mut engine = Engine::new(loaded.model, Vec::new(), &cfg)?;
    let vocab = engine.model().info().vocab_size;

    // Prefill: one step over the whole prompt; best of three after a warm-up.
    let mut best = f64::INFINITY;
    for round in 0..4 {
        engine.add_request(
            synthetic_prompt(round, args.prompt_tokens, vocab),
            greedy(1),
        )?;
        let t = Instant::now();
        while engine.has_work() {
            engine.step();
        }
        if round > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    let prefill_tok_s = args.prompt_tokens as f64 / best;

    let mut decode_tok_s = Vec::new();
    let mut decode_best_window_tok_s = None;
    for &b in &args.batch {
        for s in 0..b {
            engine.add_request(
                synthetic_prompt(s + 10, 32, vocab),
                greedy(args.decode_tokens + 2),
            )?;
        }
        // Prefill everything (and one warm-up decode step) before timing.
        while engine.stats().running < b || engine.stats().waiting > 0 {
            engine.step();
        }
        engine.step();
        let t = Instant::now();
        let mut tokens = 0;
        let mut steps = Vec::with_capacity(args.decode_tokens);
        for _ in 0..args.decode_tokens {
            let s = Instant::now();
            tokens += engine.step().len();
            steps.push(s.elapsed().as_secs_f64());
        }
        decode_tok_s.push((b, tokens as f64 / t.elapsed().as_secs_f64()));
        if b == 1 {
            decode_best_window_tok_s = steps
                .windows(WINDOW)
                .map(|w| WINDOW as f64 / w.iter().sum::<f64>())
                .reduce(f64::max);
        }
        while engine.has_work() {
            engine.step();
        }
    }
    Ok(Row {
        weights,
        prefill_tok_s,
        decode_tok_s,
        decode_best_window_tok_s,
    })
}

/// Memory read bandwidth in bytes/s with rayon's threads: the best of five
/// passes summing a 1 GiB buffer, far larger than any cache, held in the
/// same kind of memory (huge pages where offered) as the weights.
fn read_bandwidth() -> f64 {
    let mut buf = WeightBuf::zeroed(1 << 30);
    // Written first: untouched pages would all read the one shared zero page.
    buf.as_mut_slice().fill(1);
    // SAFETY: any 8 bytes are a valid u64; the buffer is 64-byte aligned, so
    // all of it lands in the middle slice.
    let (_, words, _) = unsafe { buf.as_slice().align_to::<u64>() };
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        let sum = words
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
            .reduce(|| 0, u64::wrapping_add);
        black_box(sum);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (words.len() * 8) as f64 / best
}

/// Bytes of weights one decode step must read, as stored in the GGUF: every
/// tensor but the token embeddings, of which a step reads one row, unless
/// the output head is tied to them. None for other files.
fn gguf_weight_bytes_per_token(path: &std::path::Path) -> Option<u64> {
    let mut f = std::fs::File::open(path).ok()?;
    let content = Content::read(&mut f).ok()?;
    let tied = !content.tensor_infos.contains_key("output.weight");
    let bytes = content
        .tensor_infos
        .iter()
        .filter(|(name, _)| tied || name.as_str() != "token_embd.weight")
        .map(|(_, t)| {
            let dtype = t.ggml_dtype;
            (t.shape.elem_count() / dtype.block_size() * dtype.type_size()) as u64
        })
        .sum();
    Some(bytes)
}

/// llama-bench's (pp, tg) tok/s on the same file with 2 threads.
fn llama_bench(
    bin: &std::path::Path,
    model: &std::path::Path,
    p: usize,
    n: usize,
    extra: &[String],
) -> anyhow::Result<(f64, f64)> {
    let mut cmd = std::process::Command::new(bin);
    cmd.args([
        "-m",
        &model.to_string_lossy(),
        "-t",
        "2",
        "-p",
        &p.to_string(),
        "-n",
        &n.to_string(),
        "-o",
        "json",
    ]);
    cmd.args(extra);
    if let Some(dir) = bin.parent() {
        cmd.env("LD_LIBRARY_PATH", dir);
    }
    let out = cmd
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "llama-bench failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let runs: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).context("parsing llama-bench's JSON")?;
    let ts = |pp: bool| {
        runs.iter()
            .find(|r| (r["n_prompt"].as_u64().unwrap_or(0) > 0) == pp)
            .and_then(|r| r["avg_ts"].as_f64())
            .context("llama-bench printed no such run")
    };
    Ok((ts(true)?, ts(false)?))
}

fn single_stream(row: &Row) -> Option<f64> {
    row.decode_tok_s
        .iter()
        .find(|(b, _)| *b == 1)
        .map(|(_, t)| *t)
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let path = crate::model_fetch::resolve_model(args.model.as_deref())?;
    let threads = rayon::current_num_threads();
    println!("model: {}  threads: {threads}", path.display());
    // Measured before loading, while the machine's memory is quiet.
    let bound = gguf_weight_bytes_per_token(&path).map(|bytes| {
        let bw = read_bandwidth();
        println!(
            "memory read bandwidth {:.1} GB/s; weights read per token {:.1} MB; \
             single-stream decode bound {:.1} tok/s",
            bw / 1e9,
            bytes as f64 / 1e6,
            bw / bytes as f64
        );
        bw / bytes as f64
    });
    let header: Vec<String> = args.batch.iter().map(|b| format!("decode@{b}")).collect();
    println!(
        "{:<8} {:>12} {}",
        "weights",
        format!("pp{}", args.prompt_tokens),
        header
            .iter()
            .map(|h| format!("{h:>12}"))
            .collect::<String>()
    );
    let mut rows = Vec::new();
    for &w in &args.weights {
        let row = measure(args, &path, w)?;
        let name = serde_json::to_value(w)?.as_str().unwrap_or("?").to_string();
        println!(
            "{name:<8} {:>12.1} {}{}",
            row.prefill_tok_s,
            row.decode_tok_s
                .iter()
                .map(|(_, t)| format!("{t:>12.1}"))
                .collect::<String>(),
            match (bound, single_stream(&row), row.decode_best_window_tok_s) {
                (Some(b), Some(t), Some(best)) => format!(
                    "   decode@1 = {:.0}% of the bound; best {WINDOW} steps {best:.1} tok/s = {:.0}%",
                    100.0 * t / b,
                    100.0 * best / b
                ),
                _ => String::new(),
            }
        );
        rows.push(row);
    }
    if let Some(bin) = &args.llama_bench {
        let (pp, tg) = llama_bench(
            bin,
            &path,
            args.prompt_tokens,
            args.decode_tokens,
            &args.llama_bench_arg,
        )?;
        println!(
            "llama.cpp llama-bench: pp{} {pp:.1} tok/s, tg{} {tg:.1} tok/s",
            args.prompt_tokens, args.decode_tokens
        );
        if let Some(b) = bound {
            println!("  llama.cpp tg = {:.0}% of the bound", 100.0 * tg / b);
        }
        for row in &rows {
            let single = single_stream(row);
            println!(
                "  {:?}: prefill {:.2}x llama.cpp{}",
                row.weights,
                row.prefill_tok_s / pp,
                single
                    .map(|t| format!(", single-stream decode {:.2}x llama.cpp", t / tg))
                    .unwrap_or_default()
            );
        }
    }
    println!("{}", serde_json::to_string(&rows)?);
    Ok(())
}
