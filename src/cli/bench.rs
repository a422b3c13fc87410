//! `wick bench`: prefill and decode throughput of the engine on synthetic
//! prompts, per weight format, optionally beside llama.cpp's `llama-bench` on
//! the same file so the ratios come from one run on one machine. For a GGUF
//! it also measures the machine's memory read bandwidth and the decode speed
//! that bandwidth allows, the ceiling for one stream.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use rayon::prelude::*;

use crate::cli::EngineArgs;
use crate::engine::Engine;
use crate::models::linear::WeightFormat;
use crate::quant::WeightBuf;
use crate::sampling::params::SamplingParams;

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
    /// Measure this many times, alternating with llama-bench, and end with
    /// each figure's median and the median of the rounds' ratios: on a
    /// shared host either side's speed drifts 10% or more within minutes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
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
    let device = crate::load::loader::device(&args.device)?;
    let loaded = crate::load::loader::load(path, &weights.into(), &device)?;
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
/// the output head is tied to them, and Gemma 4's per-layer token
/// embeddings (one row too); of a mixture of experts' stacked expert
/// tensors (`*_exps`), only the share one token's experts hold
/// (`expert_used_count / expert_count`). None for other files.
fn gguf_weight_bytes_per_token(path: &std::path::Path) -> Option<u64> {
    let content = crate::load::loader::read_gguf_header(path).ok()?;
    let tied = !content.has("output.weight");
    let arch = crate::models::gguf_architecture(&content);
    let count = |key: &str| {
        let v = content.metadata.get(&format!("{arch}.{key}"))?;
        v.to_u32().ok().filter(|&n| n > 0).map(f64::from)
    };
    let active = match (count("expert_used_count"), count("expert_count")) {
        (Some(used), Some(all)) => used / all,
        _ => 1.0,
    };
    let bytes = content
        .tensor_sizes()
        .filter(|&(name, _)| tied || name != "token_embd.weight")
        .filter(|&(name, _)| name != "per_layer_token_embd.weight")
        .map(|(name, bytes)| match name.contains("_exps.") {
            true => bytes as f64 * active,
            false => bytes as f64,
        })
        .sum::<f64>();
    Some(bytes as u64)
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

/// One round's figures: the bandwidth bound, wick's rows and llama-bench's
/// (pp, tg).
struct Round {
    bound: Option<f64>,
    rows: Vec<Row>,
    llama: Option<(f64, f64)>,
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let path = crate::load::model_fetch::resolve_model(args.model.as_deref())?;
    let threads = rayon::current_num_threads();
    println!("model: {}  threads: {threads}", path.display());
    let weight_bytes = gguf_weight_bytes_per_token(&path);
    let mut rounds = Vec::new();
    for r in 1..=args.rounds {
        if args.rounds > 1 {
            println!("\nround {r} of {}", args.rounds);
        }
        rounds.push(run_round(args, &path, weight_bytes)?);
    }
    if rounds.len() > 1 {
        print_medians(args, &rounds);
    }
    Ok(())
}

fn run_round(
    args: &BenchArgs,
    path: &std::path::Path,
    weight_bytes: Option<u64>,
) -> anyhow::Result<Round> {
    // Measured before loading, while the machine's memory is quiet.
    let bound = weight_bytes.map(|bytes| {
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
        let row = measure(args, path, w)?;
        println!(
            "{:<8} {:>12.1} {}{}",
            format_name(w),
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
    let llama = match &args.llama_bench {
        Some(bin) => {
            let (pp, tg) = llama_bench(
                bin,
                path,
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
            Some((pp, tg))
        }
        None => None,
    };
    println!("{}", serde_json::to_string(&rows)?);
    Ok(Round { bound, rows, llama })
}

fn format_name(w: WeightFormat) -> String {
    serde_json::to_value(w)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

/// The middle value (the mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n % 2 {
        1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Each figure's median over the rounds; ratios are taken within a round
/// (wick and llama-bench back to back) before their median.
fn print_medians(args: &BenchArgs, rounds: &[Round]) {
    let over = |f: &dyn Fn(&Round) -> Option<f64>| -> Option<f64> {
        let v: Vec<f64> = rounds.iter().map(f).collect::<Option<_>>()?;
        Some(median(v))
    };
    println!("\nmedians of {} rounds", rounds.len());
    for (i, &w) in args.weights.iter().enumerate() {
        let decode = args
            .batch
            .iter()
            .enumerate()
            .filter_map(|(j, b)| {
                Some(format!(
                    ", decode@{b} {:.1}",
                    over(&|r| Some(r.rows[i].decode_tok_s.get(j)?.1))?
                ))
            })
            .collect::<String>();
        println!(
            "{}: pp{} {:.1}{decode} tok/s",
            format_name(w),
            args.prompt_tokens,
            over(&|r| Some(r.rows[i].prefill_tok_s)).unwrap_or(f64::NAN),
        );
        if let Some(p) = over(&|r| Some(single_stream(&r.rows[i])? / r.bound?)) {
            println!("  decode@1 = {:.0}% of the bound", 100.0 * p);
        }
        if let Some(x) = over(&|r| Some(r.rows[i].prefill_tok_s / r.llama?.0)) {
            print!("  prefill {x:.2}x llama.cpp");
            if let Some(y) = over(&|r| Some(single_stream(&r.rows[i])? / r.llama?.1)) {
                print!(", single-stream decode {y:.2}x llama.cpp");
            }
            println!();
        }
    }
    if let (Some(pp), Some(tg)) = (over(&|r| Some(r.llama?.0)), over(&|r| Some(r.llama?.1))) {
        println!(
            "llama.cpp: pp{} {pp:.1}, tg{} {tg:.1} tok/s",
            args.prompt_tokens, args.decode_tokens
        );
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_takes_the_middle_or_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(vec![7.0]), 7.0);
    }
}
