use std::io::Write;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use wick::cli::ModelArgs;
use wick::engine::Engine;
use wick::sampling::params::SamplingParams;
use wick::server::config::LogFormat;
use wick::text::chat_template::ChatMessage;

#[derive(Parser)]
#[command(
    name = "wick",
    version,
    about = "An OpenAI-compatible LLM inference server on candle"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text for one or more prompts, batched together.
    Generate(GenerateArgs),
    /// Print the token ids of TEXT as a JSON array.
    Tokenize {
        #[arg(long, env = "WICK_MODEL")]
        model: Option<String>,
        text: String,
    },
    /// Measure prefill and decode throughput.
    Bench(wick::cli::bench::BenchArgs),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(Box<wick::server::config::ServeArgs>),
    /// Write a GGUF Llama model as a Hugging Face checkpoint directory
    /// (f32 safetensors, config, tokenizer and chat template).
    ExportHf {
        /// A GGUF file; the default model when omitted.
        #[arg(long, env = "WICK_MODEL")]
        model: Option<String>,
        /// Directory to write (created if needed).
        #[arg(long)]
        out: std::path::PathBuf,
    },
}

#[derive(clap::Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A prompt; repeat for several prompts run together.
    #[arg(long = "prompt", required = true)]
    prompts: Vec<String>,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// 0 disables top-k.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Stop string; repeatable.
    #[arg(long)]
    stop: Vec<String>,
    /// Keep generating past end-of-sequence.
    #[arg(long)]
    ignore_eos: bool,
    /// Render each prompt as a user turn with the model's chat template.
    #[arg(long)]
    chat: bool,
    /// One JSON object per output line.
    #[arg(long)]
    json: bool,
}

/// Each step allocates activations and logits of a few MB and frees them.
/// By default glibc serves such blocks with mmap (or trims them off the heap)
/// and gives them back to the kernel, so every step paid page faults and page
/// clearing (~4% of a 32-row decode step). Keep them in the heap for reuse.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// Logs to stderr; `RUST_LOG` overrides `default_filter`. Coloured only
/// on a terminal, and not where `NO_COLOR` is set (no-color.org).
fn init_logging(default_filter: &str, format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal() && !no_color)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => fmt.init(),
        LogFormat::Json => fmt.json().flatten_event(true).init(),
    }
}

/// `--help` as `-h`: one line an option, their value lists inline (the
/// details are in docs/deploy.md), under the subcommands too.
fn short_help(cmd: clap::Command) -> clap::Command {
    let help = clap::Arg::new("help")
        .short('h')
        .long("help")
        .help("Print help")
        .action(clap::ArgAction::HelpShort);
    let with_help = |c: clap::Command| c.disable_help_flag(true).arg(help.clone());
    with_help(cmd).mut_subcommands(with_help)
}

/// Errors print on one line, causes joined by `: `; the full chain and
/// backtrace only when RUST_BACKTRACE asks for them.
fn main() -> std::process::ExitCode {
    keep_freed_memory();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            match std::env::var("RUST_BACKTRACE") {
                Ok(v) if v != "0" => eprintln!("error: {e:?}"),
                _ => eprintln!("error: {e:#}"),
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let matches = short_help(Cli::command()).get_matches();
    let command = Cli::from_arg_matches(&matches)?.command;
    // serve sets up its own logging, from its options.
    if !matches!(command, Command::Serve(_)) {
        init_logging("warn", LogFormat::Text);
    }
    match command {
        Command::Serve(_) => serve(&matches),
        Command::Generate(args) => generate(args),
        Command::Tokenize { model, text } => {
            let path = wick::load::model_fetch::resolve_model(model.as_deref())?;
            let tokenizer = wick::load::loader::load_tokenizer(&path)?;
            println!("{}", serde_json::to_string(&tokenizer.encode(&text)?)?);
            Ok(())
        }
        Command::Bench(args) => {
            wick::cli::init_threads(args.engine.threads);
            wick::cli::bench::run(&args)
        }
        Command::ExportHf { model, out } => {
            let path = wick::load::model_fetch::resolve_model(model.as_deref())?;
            wick::cli::export_hf::export(&path, &out)?;
            eprintln!("wrote {}", out.display());
            Ok(())
        }
    }
}

fn serve(matches: &clap::ArgMatches) -> anyhow::Result<()> {
    // The config file fills whatever the command line and env left at defaults.
    let sub = matches
        .subcommand_matches("serve")
        .context("serve subcommand")?;
    let args = wick::server::config::load_serve_config(sub)?;
    // wick's own info lines are the access log and start-up notes.
    init_logging("warn,wick=info", args.log_format);
    // Before the runtime's threads exist: it sets RAYON_NUM_THREADS.
    wick::cli::init_threads(args.model.engine.threads);
    let runtime = tokio::runtime::Runtime::new()?;
    let served = runtime.block_on(wick::server::serve(args));
    // A tokenization still running on the blocking pool must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served
}

fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    wick::cli::init_threads(args.model.engine.threads);
    let path = args.model.model_path()?;
    let device = wick::load::loader::device(&args.model.device)?;
    let loaded = wick::load::loader::load(&path, &args.model.load_options(), &device)?;
    let params = SamplingParams {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
        stop: args.stop.clone().into(),
        ignore_eos: args.ignore_eos,
        ..Default::default()
    };
    let mut requests = Vec::new();
    for prompt in &args.prompts {
        let text = if args.chat {
            let template = loaded
                .chat_template
                .as_ref()
                .context("the model has no chat template; drop --chat")?;
            template.render(
                &[ChatMessage {
                    role: "user".into(),
                    content: prompt.clone(),
                }],
                true,
            )?
        } else {
            prompt.clone()
        };
        requests.push((loaded.tokenizer.encode(&text)?, params.clone()));
    }
    let engine = Engine::new(
        loaded.model,
        loaded.tokenizer.eos_ids().to_vec(),
        &args.model.engine.config(),
    )?;
    let mut engine = args
        .model
        .with_draft(engine, &args.model.load_options(), &device)?;
    let (outputs, stats) = wick::cli::generate::generate(&mut engine, &loaded.tokenizer, requests)?;
    let mut out = std::io::stdout().lock();
    for c in &outputs {
        if args.json {
            writeln!(out, "{}", serde_json::to_string(c)?)?;
        } else {
            writeln!(out, "[{}] {}{}", c.index, args.prompts[c.index], c.text)?;
            writeln!(
                out,
                "    (finish_reason: {}, {} tokens)",
                c.finish_reason,
                c.token_ids.len()
            )?;
        }
    }
    eprintln!(
        "prompt tokens: {}, generated tokens: {}, prefill: {:.1} tok/s, decode: {:.1} tok/s",
        stats.prompt_tokens,
        stats.generated_tokens,
        stats.prefill_tok_s(),
        stats.decode_tok_s(outputs.len())
    );
    Ok(())
}
