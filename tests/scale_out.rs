//! Two `wick serve` replicas behind nginx running the shipped
//! `deploy/nginx/wick.conf` (its upstream addresses and listen port swapped
//! for loopback ones): requests spread over both with no failure, a session
//! header keeps a conversation on one replica, and a replica stopped with
//! SIGTERM mid-run loses no request. Skipped, saying so, where nginx is not
//! installed (`.ci/run` installs Debian's `nginx-light`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{get_raw, metrics_text, Server};

/// nginx running the shipped config in a directory of its own, killed on drop.
struct Nginx {
    child: Child,
    base: String,
    dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nginx_bin() -> Option<PathBuf> {
    ["nginx", "/usr/sbin/nginx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|bin| {
            Command::new(bin)
                .arg("-v")
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

/// Replaces `from` in `text`, which must occur exactly `times` times, so the
/// test notices if the shipped config changes shape.
fn swap(text: &str, from: &str, to: &str, times: usize) -> String {
    assert_eq!(
        text.matches(from).count(),
        times,
        "deploy/nginx/wick.conf: expected {times} of {from:?}"
    );
    text.replace(from, to)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// nginx on a free port. The port is free when chosen but may be taken
/// before nginx binds it (by a replica another test starts meanwhile), so
/// a failed bind is retried on another port.
fn start_nginx(bin: &Path, replicas: [&str; 2]) -> Nginx {
    for _ in 0..5 {
        match try_nginx(bin, replicas, free_port()) {
            Ok(nginx) => return nginx,
            Err(log) if log.contains("Address already in use") => continue,
            Err(log) => panic!("nginx did not start: {log}"),
        }
    }
    panic!("nginx found no free port in 5 tries");
}

/// nginx listening on `port` and answering `/health` through to a replica,
/// or its error log if it exited.
fn try_nginx(bin: &Path, replicas: [&str; 2], port: u16) -> Result<Nginx, String> {
    let dir = tempfile::tempdir().unwrap();
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nginx/wick.conf"),
    )
    .unwrap();
    let conf = swap(&shipped, "127.0.0.1:8001", replicas[0], 2);
    let conf = swap(&conf, "127.0.0.1:8002", replicas[1], 2);
    let conf = swap(
        &conf,
        "listen 8000;",
        &format!("listen 127.0.0.1:{port};"),
        1,
    );
    std::fs::write(dir.path().join("wick.conf"), conf).unwrap();
    let d = dir.path().display();
    let main = format!(
        "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         include {d}/wick.conf;\n}}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), main).unwrap();
    let child = Command::new(bin)
        .arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(dir.path().join("nginx.conf"))
        .arg("-e")
        .arg(dir.path().join("error.log"))
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn nginx");
    let mut nginx = Nginx {
        child,
        base: format!("http://127.0.0.1:{port}"),
        dir,
    };
    // A healthy answer that nginx relayed, not just a TCP connect: if a
    // replica (of this test or another) took the port first, nginx exits
    // and the replica itself answers there.
    let deadline = Instant::now() + Duration::from_secs(10);
    let relayed = |answer: &str| {
        answer.starts_with("HTTP/1.1 200")
            && answer
                .lines()
                .any(|l| l.to_ascii_lowercase().starts_with("server: nginx"))
    };
    while !get_raw(&format!("{}/health", nginx.base)).is_ok_and(|a| relayed(&a)) {
        if nginx.child.try_wait().unwrap().is_some() {
            return Err(
                std::fs::read_to_string(nginx.dir.path().join("error.log")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "nginx did not answer /health");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(nginx)
}

/// Both replicas and nginx in front, or None (with a message) without nginx.
fn cluster(extra: &[&str]) -> Option<(Nginx, [Server; 2])> {
    let Some(bin) = nginx_bin() else {
        eprintln!("SKIPPED: nginx is not installed (apt-get install nginx-light)");
        return None;
    };
    let replicas = [Server::start(extra), Server::start(extra)];
    let nginx = start_nginx(&bin, [replicas[0].addr(), replicas[1].addr()]);
    Some((nginx, replicas))
}

/// One completion through nginx, streamed or whole; Err says what went wrong.
async fn complete(
    client: &reqwest::Client,
    base: &str,
    stream: bool,
    session: Option<&str>,
) -> Result<(), String> {
    let mut req = client.post(format!("{base}/v1/completions")).json(&json!({
        "prompt": "The capital of France is",
        "max_tokens": 24,
        "ignore_eos": true,
        "stream": stream,
    }));
    if let Some(s) = session {
        req = req.header("X-Session-Id", s);
    }
    // The whole error chain: reqwest's own message does not say the cause.
    let r = req.send().await.map_err(|e| format!("send: {e:?}"))?;
    let status = r.status();
    let text = r.text().await.map_err(|e| format!("body: {e}"))?;
    if status != 200 {
        return Err(format!("{status}: {text}"));
    }
    let finished = if stream {
        text.trim_end().ends_with("data: [DONE]") && text.contains("\"finish_reason\":\"length\"")
    } else {
        serde_json::from_str::<Value>(&text).is_ok_and(|b| {
            b["usage"]["completion_tokens"] == 24 && b["choices"][0]["finish_reason"] == "length"
        })
    };
    finished
        .then_some(())
        .ok_or_else(|| format!("incomplete response: {text}"))
}

/// Requests the replica finished, over every finish reason.
async fn served(replica: &Server) -> f64 {
    let name = "wick:request_success_total";
    metrics_text(replica)
        .await
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_spread_over_both_replicas_with_no_failures() {
    let Some((nginx, replicas)) = cluster(&[]) else {
        return;
    };
    let client = reqwest::Client::new();
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let (client, base) = (client.clone(), nginx.base.clone());
            tokio::spawn(async move { complete(&client, &base, i % 2 == 0, None).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let (a, b) = (served(&replicas[0]).await, served(&replicas[1]).await);
    assert_eq!(a + b, 24.0);
    assert!(
        a > 0.0 && b > 0.0,
        "one replica served everything: {a} / {b}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_header_keeps_a_conversation_on_one_replica() {
    let Some((nginx, replicas)) = cluster(&[]) else {
        return;
    };
    let client = reqwest::Client::new();
    for session in ["conversation-1", "conversation-2"] {
        let before = [served(&replicas[0]).await, served(&replicas[1]).await];
        for turn in 0..6 {
            complete(&client, &nginx.base, turn % 2 == 0, Some(session))
                .await
                .unwrap();
        }
        let after = [served(&replicas[0]).await, served(&replicas[1]).await];
        let mut delta = [after[0] - before[0], after[1] - before[1]];
        delta.sort_by(f64::total_cmp);
        assert_eq!(delta, [0.0, 6.0], "{session}: turns were split");
    }
}

/// SIGTERM to one replica while requests keep coming: its running requests
/// finish, it refuses new connections, and nginx sends those to the other,
/// so the clients see no error at all.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_stopped_mid_run_loses_no_request() {
    let Some((nginx, mut replicas)) = cluster(&["--shutdown-grace-secs", "30"]) else {
        return;
    };
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(6);
    // 8 clients, each sending request after request until the deadline.
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let (client, base) = (client.clone(), nginx.base.clone());
            tokio::spawn(async move {
                let (mut ok, mut errors) = (0, Vec::new());
                while Instant::now() < deadline {
                    match complete(&client, &base, i % 2 == 0, None).await {
                        Ok(()) => ok += 1,
                        Err(e) => errors.push(e),
                    }
                }
                (ok, errors)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        served(&replicas[0]).await > 0.0,
        "replica 0 had served nothing yet"
    );
    let survivor_at_stop = served(&replicas[1]).await;
    replicas[0].terminate();
    let (mut ok, mut errors) = (0, Vec::new());
    for c in clients {
        let (o, e) = c.await.unwrap();
        ok += o;
        errors.extend(e);
    }
    let status = replicas[0]
        .wait_exit(Duration::from_secs(10))
        .expect("the stopped replica exits once drained");
    assert!(status.success(), "{status:?}");
    assert!(
        errors.is_empty(),
        "{} of {} failed: {errors:?}",
        errors.len(),
        ok + errors.len()
    );
    // Requests kept completing after the stop, on the other replica.
    let survivor = served(&replicas[1]).await;
    assert!(
        survivor > survivor_at_stop,
        "nothing completed on replica 1 after the stop ({survivor})"
    );
    eprintln!(
        "{ok} requests, 0 failed; replica 1 served {} after the stop",
        survivor - survivor_at_stop
    );
}
