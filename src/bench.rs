//! `wick bench`: prefill and decode throughput of the engine on synthetic
//! prompts, per weight format, optionally beside llama.cpp's `llama-bench` on
//! the same file so the ratios come from one run on one machine.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;

use crate::cli::EngineArgs;
use crate::engine::Engine;
use crate::models::linear::WeightFormat;
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
}

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
        for _ in 0..args.decode_tokens {
            tokens += engine.step().len();
        }
        decode_tok_s.push((b, tokens as f64 / t.elapsed().as_secs_f64()));
        while engine.has_work() {
            engine.step();
        }
    }
    Ok(Row {
        weights,
        prefill_tok_s,
        decode_tok_s,
    })
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

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let path = crate::model_fetch::resolve_model(args.model.as_deref())?;
    let threads = rayon::current_num_threads();
    println!("model: {}  threads: {threads}", path.display());
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
            "{name:<8} {:>12.1} {}",
            row.prefill_tok_s,
            row.decode_tok_s
                .iter()
                .map(|(_, t)| format!("{t:>12.1}"))
                .collect::<String>()
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
        for row in &rows {
            let single = row
                .decode_tok_s
                .iter()
                .find(|(b, _)| *b == 1)
                .map(|(_, t)| *t);
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
