//! What a server exposed beyond localhost needs, over real HTTP: API keys,
//! CORS for browser front ends, request ids, SSE keep-alive comments for
//! proxies, and a JSON access log.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use common::{assert_error, long_stream, open_stream, Server};

fn completion() -> Value {
    json!({"prompt": "Hi", "max_tokens": 2})
}

#[tokio::test(flavor = "multi_thread")]
async fn api_keys_guard_the_api_and_not_the_probes() {
    let keys = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys.path(), "# ops\nsk-from-file\n").unwrap();
    let s = Server::start(&[
        "--api-key",
        "sk-one",
        "--api-key-file",
        keys.path().to_str().unwrap(),
    ]);
    let client = reqwest::Client::new();
    let post = |auth: Option<&str>, path: &str, body: Value| {
        let mut r = client.post(s.url(path)).json(&body);
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r.send()
    };
    for (auth, want) in [
        (None, 401),
        (Some("Bearer sk-wrong"), 401),
        (Some("sk-one"), 401),
        (Some("Bearer sk-one"), 200),
        (Some("Bearer sk-from-file"), 200),
        // The scheme is case-insensitive (RFC 7235).
        (Some("bearer sk-one"), 200),
        (Some("BEARER sk-one"), 200),
    ] {
        for (path, body) in [
            ("/v1/completions", completion()),
            ("/tokenize", json!({"prompt": "Hi"})),
            ("/detokenize", json!({"tokens": [1]})),
        ] {
            let r = post(auth, path, body).await.unwrap();
            let status = r.status().as_u16();
            if want == 401 {
                assert_eq!(r.headers()["www-authenticate"], "Bearer");
                let body: Value = r.json().await.unwrap();
                assert_error(status, &body, 401, None);
                assert_eq!(body["error"]["code"], "invalid_api_key");
            } else {
                assert_eq!(status, want, "{auth:?} {path}");
            }
        }
    }
    let models = client.get(s.url("/v1/models")).send().await.unwrap();
    assert_eq!(models.status(), 401);
    for open in ["/health", "/metrics"] {
        assert_eq!(
            client.get(s.url(open)).send().await.unwrap().status(),
            200,
            "{open}"
        );
    }
}

/// A stored response belongs to the key that made it: another key can
/// neither read, continue nor delete it (404, as for one never stored),
/// and filling another key's share evicts none of it.
#[tokio::test(flavor = "multi_thread")]
async fn stored_responses_belong_to_the_key_that_stored_them() {
    let s = Server::start(&["--api-key", "sk-a", "--api-key", "sk-b"]);
    let client = reqwest::Client::new();
    let call = |method: reqwest::Method, key: &str, path: &str, body: Option<Value>| {
        let mut r = client
            .request(method, s.url(path))
            .header("authorization", format!("Bearer {key}"));
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            let r = r.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let create = |key: &'static str, previous: Option<&str>| {
        let mut body = json!({"input": "Hi", "max_output_tokens": 2});
        if let Some(p) = previous {
            body["previous_response_id"] = json!(p);
        }
        call(reqwest::Method::POST, key, "/v1/responses", Some(body))
    };
    let (st, made) = create("sk-a", None).await;
    assert_eq!(st, 200, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let path = format!("/v1/responses/{id}");
    let (st, r) = call(reqwest::Method::GET, "sk-b", &path, None).await;
    assert_error(st, &r, 404, None);
    let (st, r) = create("sk-b", Some(&id)).await;
    assert_error(st, &r, 404, Some("previous_response_id"));
    let (st, r) = call(reqwest::Method::DELETE, "sk-b", &path, None).await;
    assert_error(st, &r, 404, None);
    // Key b's traffic, more than its half of the store holds, leaves a's.
    for _ in 0..520 {
        let (st, r) = create("sk-b", None).await;
        assert_eq!(st, 200, "{r}");
    }
    let (st, got) = call(reqwest::Method::GET, "sk-a", &path, None).await;
    assert_eq!(st, 200, "{got}");
    assert_eq!(got, made);
    let (st, r) = create("sk-a", Some(&id)).await;
    assert_eq!(st, 200, "{r}");
    let (st, r) = call(reqwest::Method::DELETE, "sk-a", &path, None).await;
    assert_eq!((st, &r["deleted"]), (200, &json!(true)), "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cors_preflight_and_allowed_origins() {
    let any = Server::start(&["--api-key", "sk-one", "--allowed-origins", "*"]);
    let client = reqwest::Client::new();
    let preflight = |s: &Server, origin: &str| {
        client
            .request(reqwest::Method::OPTIONS, s.url("/v1/chat/completions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .send()
    };
    // No key on a preflight: browsers never send one.
    let r = preflight(&any, "https://chat.example").await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
    assert!(r.headers().contains_key("access-control-allow-methods"));
    assert!(r.headers().contains_key("access-control-allow-headers"));
    // A refusal carries CORS headers too, so the page can read the error.
    let r = client
        .post(any.url("/v1/completions"))
        .header("origin", "https://chat.example")
        .json(&completion())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["access-control-allow-origin"], "*");

    let listed = Server::start(&["--allowed-origins", "https://a.example,https://b.example"]);
    let r = preflight(&listed, "https://b.example").await.unwrap();
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://b.example"
    );
    let r = preflight(&listed, "https://evil.example").await.unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"));

    // By default no page on another origin may read a response.
    let default = Server::start(&[]);
    let r = preflight(&default, "https://chat.example").await.unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"));
    let r = client
        .post(default.url("/v1/completions"))
        .header("origin", "https://chat.example")
        .json(&completion())
        .send()
        .await
        .unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"));
}

/// Bound to loopback, wick answers only requests addressed to a loopback
/// name (a DNS-rebinding page sends its own), unless --allowed-hosts names
/// more; two Host headers are refused whatever they say.
#[tokio::test(flavor = "multi_thread")]
async fn foreign_and_duplicate_hosts_are_refused() {
    let raw = |s: &Server, head: &str| {
        let mut c = std::net::TcpStream::connect(s.addr()).unwrap();
        std::io::Write::write_all(
            &mut c,
            format!("GET /v1/models HTTP/1.1\r\n{head}\r\n").as_bytes(),
        )
        .unwrap();
        let mut out = Vec::new();
        let _ = std::io::Read::read_to_end(&mut c, &mut out);
        let text = String::from_utf8_lossy(&out).into_owned();
        let status: u16 = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (
            status,
            serde_json::from_str::<Value>(body).unwrap_or(Value::Null),
        )
    };
    let s = Server::start(&[]);
    let port = s.addr().rsplit(':').next().unwrap().to_string();
    for ok in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let (st, _) = raw(&s, &format!("Host: {ok}\r\nConnection: close\r\n"));
        assert_eq!(st, 200, "{ok}");
    }
    let (st, r) = raw(&s, "Host: evil.example\r\nConnection: close\r\n");
    common::assert_error(st, &r, 403, None);
    let (st, r) = raw(
        &s,
        &format!("Host: localhost:{port}\r\nHost: evil.example\r\nConnection: close\r\n"),
    );
    common::assert_error(st, &r, 400, None);
    // A list replaces the loopback names (the test reaches it by address).
    let listed = Server::start(&["--allowed-hosts", "wick.lan,127.0.0.1"]);
    let (st, _) = raw(&listed, "Host: wick.lan\r\nConnection: close\r\n");
    assert_eq!(st, 200);
    let (st, _) = raw(&listed, "Host: localhost\r\nConnection: close\r\n");
    assert_eq!(st, 403);
}

#[tokio::test(flavor = "multi_thread")]
async fn request_ids_are_echoed_or_made_unique() {
    let s = Server::start(&[]);
    let client = reqwest::Client::new();
    let r = client
        .post(s.url("/v1/completions"))
        .header("x-request-id", "trace-42")
        .json(&completion())
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "trace-42");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["id"], "cmpl-trace-42");
    let mut ids = std::collections::HashSet::new();
    for _ in 0..20 {
        let r = client
            .post(s.url("/v1/chat/completions"))
            .json(&json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}))
            .send()
            .await
            .unwrap();
        let header = r.headers()["x-request-id"].to_str().unwrap().to_string();
        assert_eq!(header.len(), 36, "a UUID: {header}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["id"], format!("chatcmpl-{header}"));
        assert!(ids.insert(header));
    }
    // An id with nothing to keep gets a fresh one, not an empty echo.
    let r = client
        .post(s.url("/v1/completions"))
        .header("x-request-id", "")
        .json(&completion())
        .send()
        .await
        .unwrap();
    let header = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(header.len(), 36, "a UUID: {header:?}");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["id"], format!("cmpl-{header}"));
}

/// A stream queued behind another gets SSE comments while it waits, so a
/// proxy sees traffic before its first token.
#[tokio::test(flavor = "multi_thread")]
async fn idle_streams_get_keep_alive_comments() {
    let s = Server::start(&["--max-num-seqs", "1", "--sse-keep-alive-secs", "1"]);
    let mut first = open_stream(&s, &long_stream()).await.bytes_stream();
    first.next().await.unwrap().unwrap();
    let mut queued = open_stream(&s, &long_stream()).await.bytes_stream();
    let chunk = tokio::time::timeout(Duration::from_secs(5), queued.next())
        .await
        .expect("nothing within 5 s")
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&chunk);
    assert!(text.starts_with(':'), "a comment, not data: {text:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn json_logs_have_one_access_line_per_request() {
    let mut s = Server::start_with(
        &["--log-format", "json"],
        &[("RUST_LOG", "warn,wick=info")],
        Stdio::piped(),
    );
    let r = reqwest::Client::new()
        .post(s.url("/v1/completions"))
        .header("x-request-id", "log-me")
        .json(&json!({"prompt": "Hi", "max_tokens": 3, "ignore_eos": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    s.terminate();
    s.wait_exit(Duration::from_secs(10));
    let stderr = s.child.stderr.take().unwrap();
    let lines: Vec<Value> = BufReader::new(stderr)
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).expect("every log line is JSON"))
        .collect();
    let access: Vec<&Value> = lines
        .iter()
        .filter(|l| l["request_id"] == "log-me")
        .collect();
    assert_eq!(access.len(), 1, "{lines:?}");
    let line = access[0];
    assert_eq!(line["target"], "wick::access");
    assert_eq!(line["status"], 200);
    assert_eq!(line["path"], "/v1/completions");
    assert_eq!(line["prompt_tokens"], 1);
    assert_eq!(line["completion_tokens"], 3);
    assert_eq!(line["complete"], true);
    let (ttft, total) = (
        line["ttft_ms"].as_f64().unwrap(),
        line["total_ms"].as_f64().unwrap(),
    );
    assert!(0.0 < ttft && ttft <= total, "{line}");
}

/// A client's request id cannot forge fields of the text access line: it is
/// logged and echoed (in the body's id and the header) with only letters,
/// digits and `-_.:` kept.
#[tokio::test(flavor = "multi_thread")]
async fn request_ids_cannot_forge_log_fields() {
    let mut s = Server::start_with(&[], &[("RUST_LOG", "warn,wick=info")], Stdio::piped());
    let forged = "abc status=200 path=/admin/secret method=DELETE";
    let r = reqwest::Client::new()
        .post(s.url("/v1/completions"))
        .header("x-request-id", forged)
        .json(&json!({"prompt": "Hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = "abc_status_200_path__admin_secret_method_DELETE";
    assert_eq!(r.headers()["x-request-id"], id);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["id"], format!("cmpl-{id}"));
    s.terminate();
    s.wait_exit(Duration::from_secs(10));
    let mut log = String::new();
    std::io::Read::read_to_string(&mut s.child.stderr.take().unwrap(), &mut log).unwrap();
    // A pipe is no terminal: no colour codes in the log.
    assert!(!log.contains('\x1b'), "{log}");
    let access: Vec<&str> = log.lines().filter(|l| l.contains(id)).collect();
    assert!(!access.is_empty(), "{log}");
    for plain in access {
        // Each field once, as the server set it.
        for (field, count) in [("path=", 1), ("method=", 1), ("status=", 1)] {
            assert_eq!(plain.matches(field).count(), count, "{plain}");
        }
        assert!(plain.contains("path=/v1/completions") && plain.contains("method=POST"));
    }
}
