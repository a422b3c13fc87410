//! Shared helpers for the integration tests: the real default model, fetched
//! through the same code path `wick` itself uses.
#![allow(dead_code)]

pub mod transformers_ref;
pub mod venv;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use candle_core::Device;
use serde_json::Value;
use wick::engine::sequence::SeqId;
use wick::engine::{Engine, EngineConfig};
use wick::load::loader::{load, LoadedModel};
use wick::models::linear::WeightFormat;
use wick::sampling::params::SamplingParams;

pub fn model_path() -> PathBuf {
    wick::load::model_fetch::default_model_path().expect("fetching the default model")
}

pub fn load_default(format: WeightFormat) -> LoadedModel {
    load(&model_path(), &format.into(), &Device::Cpu).expect("loading the default model")
}

pub fn engine(cfg: &EngineConfig) -> (Engine, wick::text::tokenizer::Tokenizer) {
    let loaded = load_default(WeightFormat::Native);
    let eos = loaded.tokenizer.eos_ids().to_vec();
    (
        Engine::new(loaded.model, eos, cfg).expect("engine"),
        loaded.tokenizer,
    )
}

/// Asserts the engine's greedy continuation of each of `inputs` is exactly
/// the reference's (`want[i]`, as long as it is).
pub fn assert_greedy_matches(
    engine: &mut Engine,
    inputs: &[Vec<u32>],
    want: &[Vec<u32>],
    what: &str,
) {
    let requests = inputs
        .iter()
        .zip(want)
        .map(|(p, g)| (p.clone(), g.len()))
        .collect();
    let got = greedy_batch(engine, requests);
    for (i, want) in want.iter().enumerate() {
        assert_eq!(&got[i], want, "{what}: input {i}");
    }
}

/// Greedy ids for each `(prompt, max_tokens)`, all run together through
/// `engine` (EOS ignored), in request order.
pub fn greedy_batch(engine: &mut Engine, requests: Vec<(Vec<u32>, usize)>) -> Vec<Vec<u32>> {
    let ids: Vec<SeqId> = requests
        .into_iter()
        .map(|(prompt, max_tokens)| {
            let params = SamplingParams {
                max_tokens,
                temperature: 0.0,
                ignore_eos: true,
                ..Default::default()
            };
            engine.add_request(prompt, params).unwrap()
        })
        .collect();
    let mut out: HashMap<SeqId, Vec<u32>> = HashMap::new();
    while engine.has_work() {
        for ev in engine.step() {
            if let Some(t) = ev.token {
                out.entry(ev.seq).or_default().push(t.id);
            }
        }
    }
    ids.iter()
        .map(|id| out.remove(id).unwrap_or_default())
        .collect()
}

/// Teacher-forced logits: every sequence `(prompt_len, tokens)` runs through
/// one shared batch per step; step 0 prefills its prompt and each later step
/// feeds its next given token. Returns, per sequence, the logits row of each
/// step (predicting `tokens[prompt_len + step]`).
pub fn teacher_forced_logits(
    model: &dyn wick::models::Model,
    seqs: &[(usize, Vec<u32>)],
    kv_dtype: wick::kv::cache::KvDtype,
    force_tensor_kv: bool,
) -> Vec<Vec<Vec<f32>>> {
    use wick::engine::block_manager::BlockManager;
    use wick::kv::cache::{KvCache, KvLayout};
    use wick::models::{FlatBatch, LogitRows};

    let info = model.info().clone();
    let block_size = 16;
    let num_blocks: usize = seqs.iter().map(|(_, t)| t.len().div_ceil(block_size)).sum();
    let layout = KvLayout {
        num_layers: info.num_layers,
        num_kv_heads: info.num_kv_heads,
        head_dim: info.head_dim,
        block_size,
        num_blocks,
        dtype: kv_dtype,
        window_kv: None,
    };
    let mut cache = KvCache::new(layout, model.device(), force_tensor_kv).unwrap();
    let mut blocks = BlockManager::new(num_blocks, block_size);
    let tables: Vec<Vec<u32>> = seqs
        .iter()
        .map(|(_, toks)| {
            let mut t = Vec::new();
            assert!(blocks.grow(&mut t, toks.len()));
            // Reversed, so a sequence's blocks are not in pool order.
            t.reverse();
            t
        })
        .collect();
    let steps = seqs.iter().map(|(p, t)| t.len() - p).max().unwrap_or(0);
    let mut out = vec![Vec::new(); seqs.len()];
    for step in 0..steps {
        let mut batch = FlatBatch::default();
        let mut active = Vec::new();
        for (i, (prompt_len, toks)) in seqs.iter().enumerate() {
            if prompt_len + step >= toks.len() {
                continue;
            }
            let from = if step == 0 { 0 } else { prompt_len + step - 1 };
            batch.push(
                toks,
                from..prompt_len + step,
                tables[i].clone(),
                LogitRows::Last,
            );
            // A hybrid model's recurrent state: a slot per sequence.
            batch.seqs.last_mut().unwrap().state_slot = Some(i as u32);
            active.push(i);
        }
        let logits = model
            .forward(&batch, &mut cache)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (row, &i) in logits.into_iter().zip(&active) {
            out[i].push(row);
        }
    }
    out
}

/// A short greedy chat request ("What is 2 + 2?", 8 tokens) with `extra`'s
/// fields added.
pub fn chat(extra: Value) -> Value {
    let mut body = serde_json::json!({"messages": [{"role": "user", "content": "What is 2 + 2?"}],
                          "max_tokens": 8, "temperature": 0});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

pub fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u32
}

/// llama.cpp's outputs on the default model (see tests/fixtures/README.md).
pub fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama-cpp")
}

/// A `wick serve` child process on an ephemeral port, killed on drop.
pub struct Server {
    pub child: Child,
    pub base: String,
}

/// The wick binary under test: this build's, or `WICK_TEST_BIN` (to show a
/// test fails on another build, such as the one before a fix).
pub fn wick_bin() -> PathBuf {
    std::env::var_os("WICK_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_wick")))
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        // The access log would drown the test output.
        let quiet = std::env::var_os("RUST_LOG")
            .is_none()
            .then_some(("RUST_LOG", "warn"));
        Server::start_with(extra, quiet.as_slice(), Stdio::inherit())
    }

    /// With extra environment variables and the server's stderr going to
    /// `stderr` (piped, to read its log).
    pub fn start_with(extra: &[&str], env: &[(&str, &str)], stderr: Stdio) -> Server {
        model_path(); // fetch once, outside the server's start-up
        let mut child = Command::new(wick_bin())
            .args(["serve", "--port", "0"])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn wick serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let base = line
            .trim()
            .rsplit(' ')
            .next()
            .expect("listening line")
            .to_string();
        assert!(
            base.starts_with("http://"),
            "unexpected first line {line:?}"
        );
        let server = Server { child, base };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = get_status(&format!("{}/health", server.base)) {
                if r == 200 {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "server never became healthy");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// host:port, for raw TCP.
    pub fn addr(&self) -> &str {
        self.base.strip_prefix("http://").unwrap()
    }

    /// The server process's peak resident memory in bytes (`VmHWM`).
    pub fn peak_rss(&self) -> u64 {
        self.status_bytes("VmHWM:")
    }

    /// The server's resident memory now, in bytes.
    pub fn rss(&self) -> u64 {
        self.status_bytes("VmRSS:")
    }

    fn status_bytes(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/PID/status"));
        kib << 10
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(ok.success());
    }

    /// Waits up to `limit` for the process to exit; its status, or None if
    /// it is still running.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether the peer closes `stream` within `limit`: a read returns end of
/// file or an error (reset). Bytes it sends first are returned too.
pub fn closed_within(stream: &mut std::net::TcpStream, limit: Duration) -> (bool, Vec<u8>) {
    use std::io::Read;
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (false, got);
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return (true, got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return (false, got)
            }
            Err(_) => return (true, got),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Status of a plain blocking GET, so start-up polling needs no runtime.
pub fn get_status(url: &str) -> std::io::Result<u16> {
    Ok(get_raw(url)?
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

/// The whole answer (status line, headers, body) to a plain blocking GET.
pub fn get_raw(url: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap();
    let mut s = std::net::TcpStream::connect(host)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    Ok(buf)
}

pub async fn post(server: &Server, path: &str, body: Value) -> (u16, Value) {
    post_url(server.url(path), body).await
}

/// `post` without borrowing the server, for spawned tasks.
pub async fn post_url(url: String, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

pub async fn metrics_text(server: &Server) -> String {
    reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// A sample's value; `name` may end in `{label="value"}` to pick a series
/// (the `model_name` label every series carries is left out).
pub async fn metric(server: &Server, name: &str) -> f64 {
    let (base, label) = match name.split_once('{') {
        Some((base, label)) => (base, label.trim_end_matches('}')),
        None => (name, ""),
    };
    metrics_text(server)
        .await
        .lines()
        .find(|l| {
            l.starts_with(base) && l[base.len()..].starts_with([' ', '{']) && l.contains(label)
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

/// A streamed completion long enough to keep the server busy for the test.
pub fn long_stream() -> Value {
    serde_json::json!({"prompt": "Count:", "max_tokens": 3000, "ignore_eos": true, "stream": true})
}

/// Posts `body` on a connection of its own; the response once its headers
/// are in, its body still streaming.
pub async fn open_stream(server: &Server, body: &Value) -> reqwest::Response {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
        .post(server.url("/v1/completions"))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// One choice's entries across stream chunks, in order.
pub fn choice_chunks(chunks: &[Value], index: usize) -> Vec<&Value> {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap())
        .filter(|c| c["index"] == index)
        .collect()
}

/// The body of `r`, a successful event stream.
pub async fn event_stream_text(r: reqwest::Response) -> String {
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    r.text().await.unwrap()
}

/// The `data:` payloads of an SSE response, `[DONE]` included.
pub async fn sse(server: &Server, path: &str, body: Value) -> Vec<String> {
    let r = reqwest::Client::new()
        .post(server.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    let text = event_stream_text(r).await;
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {e:?}"))
                .to_string()
        })
        .collect()
}

pub fn chunks(events: &[String]) -> Vec<Value> {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

pub fn assert_error(status: u16, body: &Value, want_status: u16, param: Option<&str>) {
    assert_eq!(status, want_status, "{body}");
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(e["type"].is_string(), "{body}");
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "{body}"
    );
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{body}");
    }
}
