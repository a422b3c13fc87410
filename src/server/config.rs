//! `wick serve` options. Each comes, in falling precedence, from the command
//! line, a `WICK_…` environment variable, the TOML file named by `--config`,
//! and the built-in default. clap resolves the first, second and last; the
//! file fills in whatever clap only defaulted.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args, Command, FromArgMatches};

use crate::cli::ModelArgs;
use crate::engine::pooling::Pooling;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Server")]
pub struct ServeArgs {
    /// Address to bind (0.0.0.0: the network).
    #[arg(long, default_value = "127.0.0.1", env = "WICK_HOST")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8000, env = "WICK_PORT")]
    pub port: u16,
    /// A TOML file of these options; command line and environment win.
    #[arg(long, env = "WICK_CONFIG")]
    pub config: Option<PathBuf>,
    /// Names clients may send as `model` (the first is reported); repeatable.
    #[arg(long, env = "WICK_SERVED_MODEL_NAME", value_delimiter = ',')]
    pub served_model_name: Vec<String>,
    /// Longest context a request may use, below the model's own.
    #[arg(long, env = "WICK_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// Most sequences queued beyond the batch; past it, 503.
    #[arg(long, default_value_t = 1024, env = "WICK_MAX_WAITING")]
    pub max_waiting: usize,
    /// Largest request body in bytes; past it, 413.
    #[arg(long, default_value_t = 8 << 20, env = "WICK_MAX_BODY_BYTES")]
    pub max_body_bytes: usize,
    /// Largest request line plus headers in bytes; past it, 431.
    #[arg(long, default_value_t = 32 << 10, env = "WICK_MAX_HEADER_BYTES")]
    pub max_header_bytes: usize,
    /// Longest a generation may run, in seconds (then finish_reason length).
    #[arg(long, env = "WICK_REQUEST_TIMEOUT_SECS")]
    pub request_timeout_secs: Option<u64>,
    /// Seconds a client may take to send a head or body, or to read.
    #[arg(long, default_value_t = 30, env = "WICK_CLIENT_TIMEOUT_SECS")]
    pub client_timeout_secs: u64,
    /// Most open connections (the oldest idle one makes room).
    #[arg(long, default_value_t = 4096, env = "WICK_MAX_CONNECTIONS")]
    pub max_connections: usize,
    /// Seconds between SSE keep-alive comments on a quiet stream.
    #[arg(long, default_value_t = 15, env = "WICK_SSE_KEEP_ALIVE_SECS")]
    pub sse_keep_alive_secs: u64,
    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30, env = "WICK_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: u64,
    /// Require `Authorization: Bearer KEY` on the API; repeatable.
    #[arg(
        long,
        env = "WICK_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_key: Vec<String>,
    /// A file of API keys, one per line.
    #[arg(long, env = "WICK_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Origins browser pages may call from (CORS), comma-separated; `*`: any.
    #[arg(long, value_delimiter = ',', env = "WICK_ALLOWED_ORIGINS")]
    pub allowed_origins: Vec<String>,
    /// `Host` names requests may carry, comma-separated; `*`: any.
    #[arg(long, value_delimiter = ',', env = "WICK_ALLOWED_HOSTS")]
    pub allowed_hosts: Vec<String>,
    /// Hosts whose `http(s)` image URLs requests may name, comma-separated
    /// (exact names; none: images come only inline, as data: URLs).
    #[arg(long, value_delimiter = ',', env = "WICK_ALLOWED_MEDIA_DOMAINS")]
    pub allowed_media_domains: Vec<String>,
    /// A directory whose files requests may name by `file:` image URLs.
    #[arg(long, env = "WICK_ALLOWED_LOCAL_MEDIA_PATH")]
    pub allowed_local_media_path: Option<PathBuf>,
    /// Seconds one request's image URLs may take to fetch, all together.
    #[arg(long, default_value_t = 10, env = "WICK_MEDIA_FETCH_TIMEOUT_SECS")]
    pub media_fetch_timeout_secs: u64,
    /// Most images one request may carry.
    #[arg(long, default_value_t = 8, env = "WICK_MAX_IMAGES_PER_REQUEST")]
    pub max_images_per_request: usize,
    /// No chat page at `/` (it answers 404).
    #[arg(
        long,
        env = "WICK_NO_WEBUI",
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub no_webui: bool,
    /// Log lines as text or as JSON objects.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "WICK_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// How /v1/embeddings pools a text's hidden states into one vector.
    #[arg(long, value_enum, default_value_t = Pooling::Mean, env = "WICK_POOLING")]
    pub pooling: Pooling,
    #[command(flatten)]
    pub model: ModelArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl ServeArgs {
    /// Every accepted API key: --api-key, WICK_API_KEY and --api-key-file.
    pub fn api_keys(&self) -> anyhow::Result<Vec<String>> {
        let mut keys: Vec<String> = self
            .api_key
            .iter()
            .filter(|k| !k.is_empty())
            .cloned()
            .collect();
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --api-key-file {}", path.display()))?;
            let from_file = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'));
            keys.extend(from_file.map(str::to_string));
            if keys.is_empty() {
                bail!("--api-key-file {} holds no key", path.display());
            }
        }
        Ok(keys)
    }
}

/// Builds the options from `wick serve`'s parsed arguments, then takes from
/// the `--config` file every option that neither the command line nor the
/// environment set.
pub fn load_serve_config(matches: &ArgMatches) -> anyhow::Result<ServeArgs> {
    let mut args = ServeArgs::from_arg_matches(matches)?;
    if let Some(path) = args.config.clone() {
        apply_file(&mut args, matches, &path)?;
    }
    Ok(args)
}

fn apply_file(args: &mut ServeArgs, matches: &ArgMatches, path: &Path) -> anyhow::Result<()> {
    let file = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {file}"))?;
    let table: toml::Table = toml::from_str(&text).with_context(|| format!("parsing {file}"))?;
    // Without env and defaults, parsing one `--key=value` yields matches that
    // hold that key alone, so the update below touches only that field; the
    // value still goes through the option's own parser.
    let file_cmd = ServeArgs::augment_args(Command::new("wick serve"))
        .mut_args(|a| a.env(None).default_value(None));
    for (key, value) in &table {
        if key == "config" {
            bail!("{file}: `config` cannot be set from a config file");
        }
        let arg = file_cmd
            .get_arguments()
            .find(|a| a.get_id() == key.as_str() && !is_builtin(a.get_action()))
            .ok_or_else(|| anyhow!("{file}: unknown key `{key}`"))?;
        let scalar = |value: &toml::Value| match value {
            toml::Value::String(s) => Ok(s.clone()),
            toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) => {
                Ok(value.to_string())
            }
            _ => Err(anyhow!(
                "{file}: `{key}` must be a string, a number or a list of them"
            )),
        };
        // A list is the option repeated (--api-key a --api-key b).
        let values = match value {
            toml::Value::Array(items) => items.iter().map(scalar).collect::<Result<Vec<_>, _>>()?,
            _ => vec![scalar(value)?],
        };
        let long = arg.get_long().context("config options are long options")?;
        let argv = std::iter::once("wick serve".to_string())
            .chain(values.iter().map(|v| format!("--{long}={v}")));
        let one = file_cmd
            .clone()
            .try_get_matches_from(argv)
            .map_err(|e| anyhow!("{file}: `{key}`: {}", clap_message(&e)))?;
        // Checked above even when overridden, so a bad file fails everywhere.
        let set_by_user = matches
            .value_source(key)
            .is_some_and(|s| s != ValueSource::DefaultValue);
        if !set_by_user {
            args.update_from_arg_matches(&one)?;
        }
    }
    Ok(())
}

/// clap's own --help/--version, which are no config keys.
fn is_builtin(action: &ArgAction) -> bool {
    matches!(
        action,
        ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
    )
}

/// A clap error on one line (the problem and any possible values), without
/// its `error: ` tag or its command-line usage, help and tip lines.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty()
                && !["Usage:", "For more", "tip:"]
                    .iter()
                    .any(|p| l.starts_with(p))
        })
        .collect();
    let joined = lines.join(" ");
    joined
        .strip_prefix("error: ")
        .unwrap_or(&joined)
        .to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::io::Write;

    use super::*;

    /// The `wick serve` command as a user would get it.
    fn command() -> Command {
        ServeArgs::augment_args(Command::new("wick serve"))
    }

    /// The command blind to the environment, so a developer's own `WICK_…`
    /// variables cannot change what these tests see.
    fn command_no_env() -> Command {
        command().mut_args(|a| a.env(None))
    }

    fn load(cmd: Command, argv: &[&str]) -> anyhow::Result<ServeArgs> {
        let matches =
            cmd.try_get_matches_from(std::iter::once("wick serve").chain(argv.iter().copied()))?;
        load_serve_config(&matches)
    }

    fn toml_file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    const FILE: &str = "kv_cache_memory = 64\ngpu_memory_utilization = 0.8\nport = 9001\n\
                        max_step_slowdown = 4\nthreads = 3\n\
                        host = \"0.0.0.0\"\n\
                        weights = \"q8_0\"\nrequest_timeout_secs = 5\nmodel = \"/m.gguf\"\n";

    #[test]
    fn defaults_without_a_file() {
        let a = load(command_no_env(), &[]).unwrap();
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 8000));
        assert_eq!(a.model.engine.kv_cache_memory, None);
        assert_eq!(a.model.engine.gpu_memory_utilization, 0.9);
        assert_eq!(a.model.engine.max_step_slowdown, 2.5);
        assert_eq!(a.model.engine.threads, None);
        assert_eq!((a.max_waiting, a.max_body_bytes), (1024, 8 << 20));
        assert_eq!((a.request_timeout_secs, a.shutdown_grace_secs), (None, 30));
        assert_eq!((a.client_timeout_secs, a.max_connections), (30, 4096));
        assert!(a.allowed_origins.is_empty() && a.allowed_hosts.is_empty());
        assert_eq!(a.log_format, LogFormat::Text);
        assert!(a.model.model.is_none() && a.served_model_name.is_empty());
        assert_eq!(a.max_model_len, None);
    }

    #[test]
    fn file_beats_default_and_cli_beats_file() {
        let f = toml_file(FILE);
        let path = f.path().to_str().unwrap();
        let a = load(command_no_env(), &["--config", path, "--port", "7000"]).unwrap();
        assert_eq!(a.model.engine.kv_cache_memory, Some(64));
        assert_eq!(a.model.engine.gpu_memory_utilization, 0.8);
        assert_eq!(a.model.engine.max_step_slowdown, 4.0);
        assert_eq!(a.model.engine.threads, Some(3));
        assert_eq!(a.host, "0.0.0.0");
        assert_eq!(a.model.weights, crate::models::linear::WeightFormat::Q8_0);
        assert_eq!(a.request_timeout_secs, Some(5));
        assert_eq!(a.model.model.as_deref(), Some("/m.gguf"));
        assert_eq!(a.port, 7000);
        // Options the file leaves out keep their defaults.
        assert_eq!(a.model.engine.block_size, 16);
        assert_eq!(a.shutdown_grace_secs, 30);
    }

    #[test]
    fn lists_repeat_the_option() {
        let f = toml_file("api_key = [\"k1\", \"k2\"]\nallowed_origins = \"https://a.example,https://b.example\"\n");
        let path = f.path().to_str().unwrap();
        let a = load(command_no_env(), &["--config", path]).unwrap();
        assert_eq!(a.api_keys().unwrap(), ["k1", "k2"]);
        assert_eq!(
            a.allowed_origins,
            ["https://a.example", "https://b.example"]
        );
        let a = load(command_no_env(), &["--config", path, "--api-key", "k3"]).unwrap();
        assert_eq!(
            a.api_keys().unwrap(),
            ["k3"],
            "the command line replaces the file's list"
        );
    }

    #[test]
    fn served_model_names_and_max_model_len() {
        let f =
            toml_file("served_model_name = [\"smol\", \"gpt-4o-mini\"]\nmax_model_len = 2048\n");
        let path = f.path().to_str().unwrap();
        let a = load(command_no_env(), &["--config", path]).unwrap();
        assert_eq!(a.served_model_name, ["smol", "gpt-4o-mini"]);
        assert_eq!(a.max_model_len, Some(2048));
        let a = load(
            command_no_env(),
            &["--served-model-name", "a", "--served-model-name", "b,c"],
        )
        .unwrap();
        assert_eq!(a.served_model_name, ["a", "b", "c"]);
    }

    #[test]
    fn api_key_file_adds_keys() {
        let f = toml_file("# keys\n\nfile-key-1\n  file-key-2  \n");
        let path = f.path().to_str().unwrap();
        let a = load(
            command_no_env(),
            &["--api-key", "cli-key", "--api-key-file", path],
        )
        .unwrap();
        assert_eq!(
            a.api_keys().unwrap(),
            ["cli-key", "file-key-1", "file-key-2"]
        );
        let empty = toml_file("# none\n");
        let path = empty.path().to_str().unwrap();
        let a = load(command_no_env(), &["--api-key-file", path]).unwrap();
        assert!(a.api_keys().is_err(), "a key file with no key is a mistake");
        assert!(load(command_no_env(), &[])
            .unwrap()
            .api_keys()
            .unwrap()
            .is_empty());
    }

    #[test]
    fn unknown_key_names_key_and_file() {
        let f = toml_file("port = 1\nkv_cache_memroy = 64\n");
        let path = f.path().to_str().unwrap();
        let err = load(command_no_env(), &["--config", path])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("kv_cache_memroy") && err.contains(path),
            "{err}"
        );
    }

    #[test]
    fn bad_values_are_errors() {
        for text in [
            "port = \"eighty\"",
            "port = 70000",
            "weights = \"q5\"",
            "host = [[1]]",
            "log_format = \"xml\"",
            "gpu_memory_utilization = 1.5",
            "gpu_memory_utilization = 0",
            "max_step_slowdown = 0.5",
            "threads = 0",
        ] {
            let f = toml_file(text);
            let path = f.path().to_str().unwrap();
            let err = load(command_no_env(), &["--config", path])
                .unwrap_err()
                .to_string();
            let key = text.split(' ').next().unwrap();
            assert!(err.contains(key) && err.contains(path), "{text}: {err}");
        }
        let f = toml_file("port = \"eighty\"");
        let path = f.path().to_str().unwrap();
        assert!(load(command_no_env(), &["--config", path, "--port", "1"]).is_err());
        let f = toml_file("config = \"other.toml\"");
        let path = f.path().to_str().unwrap();
        assert!(load(command_no_env(), &["--config", path]).is_err());
        assert!(load(command_no_env(), &["--config", "/nonexistent/wick.toml"]).is_err());
    }

    fn shipped_default() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/default.toml")
    }

    /// The shipped file sets every option that has a default to exactly that
    /// default, and shows every other option as a commented-out example.
    #[test]
    fn shipped_default_matches_built_in_defaults() {
        let path = shipped_default();
        let text = std::fs::read_to_string(&path).unwrap();
        let set: BTreeSet<String> = toml::from_str::<toml::Table>(&text)
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let commented: BTreeSet<String> = text
            .lines()
            .filter_map(|l| {
                l.strip_prefix("# ")?
                    .split_once(" = ")
                    .map(|(k, _)| k.to_string())
            })
            .collect();
        let cmd = command_no_env();
        let options: Vec<_> = cmd
            .get_arguments()
            .filter(|a| !is_builtin(a.get_action()) && a.get_id() != "config")
            .collect();
        let with_default: BTreeSet<String> = options
            .iter()
            .filter(|a| !a.get_default_values().is_empty())
            .map(|a| a.get_id().to_string())
            .collect();
        let without: BTreeSet<String> = options
            .iter()
            .filter(|a| a.get_default_values().is_empty())
            .map(|a| a.get_id().to_string())
            .collect();
        assert_eq!(set, with_default, "keys set in {}", path.display());
        assert!(
            commented.is_superset(&without),
            "commented keys in {}",
            path.display()
        );

        let from_file = load(command_no_env(), &["--config", path.to_str().unwrap()]).unwrap();
        let built_in = load(command_no_env(), &[]).unwrap();
        // ModelArgs has no PartialEq; Debug shows every field.
        let normalize = |a: ServeArgs| format!("{:?}", ServeArgs { config: None, ..a });
        assert_eq!(normalize(from_file), normalize(built_in));
    }

    const ENV_CHILD: &str = "WICK_TEST_CONFIG_ENV_CHILD";

    /// clap reads `WICK_…` variables from the process environment, so this
    /// runs its assertions in a child test process with its own environment
    /// instead of mutating the one every other test shares.
    #[test]
    fn env_beats_file_and_cli_beats_env() {
        let f = toml_file(FILE);
        let name = format!("{}::env_child", module_path!().split_once("::").unwrap().1);
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child.args([name.as_str(), "--exact", "--ignored", "--test-threads=1"]);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("WICK_") {
                child.env_remove(k);
            }
        }
        child
            .env(ENV_CHILD, "1")
            .env("WICK_CONFIG", f.path())
            .env("WICK_KV_CACHE_MEMORY", "128")
            .env("WICK_GPU_MEMORY_UTILIZATION", "0.95")
            .env("WICK_PORT", "9100")
            .env("WICK_THREADS", "5")
            .env("WICK_SHUTDOWN_GRACE_SECS", "3");
        let out = child.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    #[ignore = "run by env_beats_file_and_cli_beats_env in a child process"]
    fn env_child() {
        if std::env::var_os(ENV_CHILD).is_none() {
            return;
        }
        let a = load(command(), &["--port", "9200"]).unwrap();
        assert_eq!(a.model.engine.kv_cache_memory, Some(128), "env beats file");
        assert_eq!(
            a.model.engine.gpu_memory_utilization, 0.95,
            "env beats file"
        );
        assert_eq!(a.port, 9200, "cli beats env");
        assert_eq!(a.model.engine.threads, Some(5), "env beats file");
        assert_eq!(a.model.engine.max_step_slowdown, 4.0, "file beats default");
        assert_eq!(a.shutdown_grace_secs, 3, "env beats default");
        assert_eq!(
            a.host, "0.0.0.0",
            "file beats default (file from WICK_CONFIG)"
        );
        assert_eq!(a.model.engine.block_size, 16, "default");
    }
}
