//! `wick serve` against clients that connect and do nothing, send slowly,
//! send too much, or hold a request open across a shutdown: none of them may
//! lock others out or keep the process alive.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{closed_within, long_stream, open_stream, post, post_url, Server};

/// Splits a raw HTTP/1.1 response into its status and JSON body.
fn parse_response(raw: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(raw);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Two connections stalled mid-request: one in its head, one in its body.
fn half_sent_requests(s: &Server) -> (TcpStream, TcpStream) {
    let mut head = TcpStream::connect(s.addr()).unwrap();
    write!(head, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n").unwrap();
    let mut body = TcpStream::connect(s.addr()).unwrap();
    write!(
        body,
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n\
         content-length: 1000\r\n\r\n{{\"prompt\""
    )
    .unwrap();
    (head, body)
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_neither_lock_out_others_nor_stay_open() {
    let s = Server::start(&["--max-connections", "32", "--client-timeout-secs", "2"]);
    // Three times the cap, all idle: the oldest are closed to make room.
    let mut idle: Vec<TcpStream> = (0..96)
        .map(|_| TcpStream::connect(s.addr()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let health = reqwest::get(s.url("/health")).await.unwrap();
    assert_eq!(health.status(), 200);
    let (st, b) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 4}),
    )
    .await;
    assert_eq!(st, 200, "{b}");
    // Every idle connection is gone once the client timeout has passed.
    let start = Instant::now();
    for conn in &mut idle {
        let left = Duration::from_secs(5).saturating_sub(start.elapsed());
        assert!(
            closed_within(conn, left).0,
            "an idle connection was left open"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn at_the_cap_with_every_connection_busy_new_ones_get_503() {
    let s = Server::start(&["--max-connections", "2", "--max-num-seqs", "1"]);
    let mut busy = Vec::new();
    for _ in 0..2 {
        busy.push(open_stream(&s, &long_stream()).await);
    }
    let mut extra = TcpStream::connect(s.addr()).unwrap();
    write!(extra, "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let (closed, raw) = closed_within(&mut extra, Duration::from_secs(5));
    assert!(closed);
    let (status, body) = parse_response(&raw);
    assert_eq!(status, 503);
    common::assert_error(status, &body, 503, None);
    drop(busy);
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_heads_and_bodies_are_cut_off() {
    let s = Server::start(&["--client-timeout-secs", "2"]);
    let (mut head, mut body) = half_sent_requests(&s);
    let (closed, _) = closed_within(&mut head, Duration::from_secs(5));
    assert!(closed, "a half-sent head was kept open");
    let (closed, raw) = closed_within(&mut body, Duration::from_secs(5));
    assert!(closed, "a half-sent body was kept open");
    let (status, json) = parse_response(&raw);
    common::assert_error(status, &json, 408, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_headers_get_431_with_a_json_body() {
    let s = Server::start(&["--max-header-bytes", "16384"]);
    let r = reqwest::Client::new()
        .get(s.url("/health"))
        .header("x-filler", "a".repeat(20000))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_eq!(r.headers()["content-type"], "application/json");
    common::assert_error(status, &r.json().await.unwrap(), 431, None);
    // Too many header fields, each small.
    let mut many = reqwest::Client::new().get(s.url("/health"));
    for i in 0..300 {
        many = many.header(format!("x-h{i}"), "1");
    }
    let r = many.send().await.unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    common::assert_error(status, &body, 431, None);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("256"),
        "{body}"
    );
    assert_eq!(reqwest::get(s.url("/health")).await.unwrap().status(), 200);
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_exits_within_the_grace_period_despite_half_sent_requests() {
    let mut s = Server::start(&["--shutdown-grace-secs", "2", "--client-timeout-secs", "60"]);
    let _held = half_sent_requests(&s);
    std::thread::sleep(Duration::from_millis(300));
    s.terminate();
    // Nothing is running, so nothing needs the grace period: the half-sent
    // head is closed and the half-sent body refused at once.
    let status = s.wait_exit(Duration::from_secs(2));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

/// In-flight requests cut off by the end of the grace period end with an
/// error a client understands: 503 whole, an error event on a stream.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn requests_cut_off_at_shutdown_get_an_error_not_a_made_up_finish() {
    let mut s = Server::start(&["--shutdown-grace-secs", "1"]);
    let long = |stream: bool| json!({"prompt": "Count:", "max_tokens": 4000, "ignore_eos": true, "stream": stream});
    let whole = tokio::spawn(post_url(s.url("/v1/completions"), long(false)));
    let streamed = reqwest::Client::new()
        .post(s.url("/v1/completions"))
        .json(&long(true))
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.terminate();
    let (status, body) = whole.await.unwrap();
    common::assert_error(status, &body, 503, None);
    let text = streamed.text().await.unwrap();
    let events: Vec<&str> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let error: Value = serde_json::from_str(events[events.len() - 2]).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shut down"),
        "{error}"
    );
    assert!(
        !text.contains("\"finish_reason\":\"abort\""),
        "abort is not an OpenAI finish reason"
    );
    assert!(s
        .wait_exit(Duration::from_secs(5))
        .is_some_and(|s| s.success()));
}

/// `/tokenize` takes the byte bound the generation endpoints apply before
/// encoding, and the same bound on how many tokenize at once: 16 bodies of
/// 8 MB at once are refused without being encoded, and the process stays
/// small.
#[tokio::test(flavor = "multi_thread")]
async fn huge_tokenize_bodies_are_refused_before_encoding() {
    let s = Server::start(&[]);
    let text = "hello world ".repeat((8 << 20) / 12 - 64);
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let url = s.url("/tokenize");
            let body = json!({"prompt": text.clone()});
            tokio::spawn(async move { post_url(url, body).await })
        })
        .collect();
    for t in tasks {
        let (st, r) = t.await.unwrap();
        common::assert_error(st, &r, 400, Some("prompt"));
        assert_eq!(r["error"]["code"], "context_length_exceeded", "{r}");
    }
    let peak = s.peak_rss();
    assert!(peak < 2 << 30, "peak RSS {} MiB", peak >> 20);
    // Text within the bound still tokenizes.
    let (st, r) = post(&s, "/tokenize", json!({"prompt": "hello world"})).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["count"], r["tokens"].as_array().unwrap().len(), "{r}");
}

/// Waits until the server runs at least `n` sequences.
async fn until_running(s: &Server, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while common::metric(s, "wick:num_requests_running").await < n {
        assert!(Instant::now() < deadline, "the big request never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fair admission: a small request is answered while one client's
/// `n = 128, max_tokens = 1000` request holds the pool, and while an
/// 8,000-token prompt prefills, not after them; its queue wait is in
/// /metrics.
#[tokio::test(flavor = "multi_thread")]
async fn one_request_cannot_lock_others_out() {
    let s = Server::start(&[]);
    let small = json!({"prompt": "Hi there", "max_tokens": 1});
    let big = tokio::spawn(post_url(
        s.url("/v1/completions"),
        json!({"prompt": "Once upon a time", "n": 128, "max_tokens": 1000, "ignore_eos": true}),
    ));
    until_running(&s, 8.0).await;
    let (st, r) = post(&s, "/v1/completions", small.clone()).await;
    assert_eq!(st, 200, "{r}");
    assert!(
        !big.is_finished(),
        "the small request waited for the big one"
    );
    big.abort();

    // One prompt of 8,000 tokens (16 steps of prefill at the default
    // budget) with max_tokens 1: the small request starts in the next step.
    let long: Vec<u32> = (0..8000).map(|i| 1000 + i % 20000).collect();
    let long = tokio::spawn(post_url(
        s.url("/v1/completions"),
        json!({"prompt": long, "max_tokens": 1}),
    ));
    until_running(&s, 1.0).await;
    let (st, r) = post(&s, "/v1/completions", small).await;
    assert_eq!(st, 200, "{r}");
    assert!(
        !long.is_finished(),
        "the small request waited for the prefill"
    );
    let (st, r) = long.await.unwrap();
    assert_eq!(st, 200, "{r}");
    let waits = common::metric(&s, "wick:request_queue_time_seconds_count").await;
    assert!(waits >= 3.0, "{waits}");
}

/// Connections that trickle their request bodies cannot fill the cap: past
/// a second of upload, the slowest is closed to let a new client in.
#[tokio::test(flavor = "multi_thread")]
async fn slow_bodies_cannot_fill_the_connection_cap() {
    let s = Server::start(&["--max-connections", "4"]);
    let mut slow: Vec<TcpStream> = (0..4).map(|_| half_sent_requests(&s).1).collect();
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..2 {
        let health = reqwest::get(s.url("/health")).await.unwrap();
        assert_eq!(health.status(), 200);
    }
    let closed = slow
        .iter_mut()
        .map(|c| closed_within(c, Duration::from_millis(500)).0)
        .filter(|&closed| closed)
        .count();
    assert!(closed >= 1, "no slow body was closed");
}

/// Sends `n` copies of `body` to chat completions at once; their statuses
/// and bodies.
async fn chats(s: &Server, body: Value, n: usize) -> Vec<(u16, Value)> {
    let calls: Vec<_> = (0..n)
        .map(|_| tokio::spawn(post_url(s.url("/v1/chat/completions"), body.clone())))
        .collect();
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.unwrap());
    }
    out
}

/// An expensive grammar (about a millisecond of mask a token) cannot slow
/// the plain requests beside it: its rows take turns sitting steps out,
/// and still finish under their grammar. A JSON schema's masks are cheap
/// enough never to wait.
#[tokio::test(flavor = "multi_thread")]
async fn expensive_grammars_take_turns_instead_of_slowing_everyone() {
    let s = Server::start(&[]);
    let deferrals = || common::metric(&s, "wick:grammar_mask_deferrals_total");
    let grammar = |schema: Value| {
        json!({"messages": [{"role": "user", "content": "Write something"}], "max_tokens": 24,
               "response_format": {"type": "json_schema",
                                   "json_schema": {"name": "x", "schema": schema}}})
    };
    let plain = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 24,
                       "ignore_eos": true});
    let (costly, others) = tokio::join!(
        chats(
            &s,
            grammar(json!({"type": "string", "pattern": "^.*a.{60}$"})),
            12
        ),
        chats(&s, plain.clone(), 12),
    );
    for (st, r) in costly.iter().chain(&others) {
        assert_eq!(*st, 200, "{r}");
    }
    for (_, r) in &costly {
        let text = r["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(text.starts_with('"'), "not under its grammar: {text:?}");
    }
    let after_costly = deferrals().await;
    assert!(after_costly > 0.0, "no row sat out for its mask time");

    let person = json!({"type": "object", "properties": {"name": {"type": "string"},
                        "age": {"type": "integer"}}, "required": ["name", "age"]});
    let (cheap, others) = tokio::join!(chats(&s, grammar(person), 12), chats(&s, plain, 12));
    for (st, r) in cheap.iter().chain(&others) {
        assert_eq!(*st, 200, "{r}");
    }
    assert_eq!(
        deferrals().await,
        after_costly,
        "a JSON schema's rows waited"
    );
}

/// The body limit's worth of one kind of item, each made by `item(i)`.
fn filling(item: impl Fn(usize) -> Value) -> Vec<Value> {
    let each = serde_json::to_vec(&item(999_999)).unwrap().len() + 1;
    (0..((8 << 20) - 4096) / each).map(item).collect()
}

/// The largest request the body limit allows, of each shape a client can
/// repeat items in, is answered at once (refused where it passes a bound,
/// served where it may), and a small request sent beside it is not held
/// up. Pairwise checks took 11-19 s on such bodies.
#[tokio::test(flavor = "multi_thread")]
async fn the_largest_bodies_of_each_shape_are_answered_at_once() {
    let s = Server::start(&[]);
    let user = json!([{"role": "user", "content": "hi"}]);
    let tool_uses = || {
        filling(|i| json!({"type": "tool_use", "id": format!("t{i}"), "name": "f", "input": {}}))
    };
    let metadata: serde_json::Map<String, Value> = (0..500_000)
        .map(|i| (format!("k{i}"), json!("v")))
        .collect();
    // 64 stop strings of 127 KiB for 128 choices: shared, not copied.
    let long_stops: Vec<String> = (0..64)
        .map(|i| format!("{i}{}", "z".repeat(127 << 10)))
        .collect();
    let cases: Vec<(&str, &str, Value, u16, &str)> = vec![
        (
            "chat tools",
            "/v1/chat/completions",
            json!({"messages": user, "tools": filling(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))}),
            400,
            "tools",
        ),
        (
            "chat stop",
            "/v1/chat/completions",
            json!({"messages": user, "stop": filling(|i| json!(format!("s{i}")))}),
            400,
            "stop",
        ),
        (
            "chat logit_bias",
            "/v1/chat/completions",
            json!({"messages": user, "logit_bias": (0..450_000)
             .map(|i| (format!("{}{}", "0".repeat(i / 40_000), i % 40_000), json!(1)))
             .collect::<serde_json::Map<_, _>>()}),
            400,
            "logit_bias",
        ),
        (
            "chat stop_token_ids",
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 2, "stop_token_ids": (0..1_600_000).map(|i| i % 1000).collect::<Vec<u32>>()}),
            200,
            "",
        ),
        (
            "chat metadata",
            "/v1/chat/completions",
            json!({"messages": user, "metadata": metadata}),
            400,
            "metadata",
        ),
        (
            "messages tools",
            "/v1/messages",
            json!({"messages": user, "max_tokens": 2,
                "tools": filling(|i| json!({"name": format!("f{i}"), "input_schema": {"type": "object"}}))}),
            400,
            "at most 128",
        ),
        (
            "messages tool_use",
            "/v1/messages",
            json!({"max_tokens": 2, "messages": [user[0], {"role": "assistant", "content": tool_uses()},
                                             {"role": "user", "content": "ok"}]}),
            200,
            "",
        ),
        (
            "count_tokens tool_use",
            "/v1/messages/count_tokens",
            json!({"messages": [user[0], {"role": "assistant", "content": tool_uses()},
                             {"role": "user", "content": "ok"}]}),
            200,
            "",
        ),
        (
            "responses tools",
            "/v1/responses",
            json!({"input": "hi", "tools": filling(|i| json!({"type": "function", "name": format!("f{i}")}))}),
            400,
            "tools",
        ),
        (
            "responses items",
            "/v1/responses",
            json!({"input": filling(|_| json!({"type": "message", "role": "user", "content": "x"}))}),
            400,
            "input",
        ),
        (
            "responses metadata",
            "/v1/responses",
            json!({"input": "hi", "metadata": metadata}),
            400,
            "metadata",
        ),
        (
            "completion n=128 long stops",
            "/v1/completions",
            json!({"prompt": "hi", "n": 128, "max_tokens": 2, "stop": long_stops}),
            200,
            "",
        ),
    ];
    for (name, path, body, want, says) in cases {
        let size = serde_json::to_vec(&body).unwrap().len();
        assert!(size <= 8 << 20, "{name}: {size} bytes");
        let start = Instant::now();
        let small = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let t = Instant::now();
            let r = post(
                &s,
                "/v1/completions",
                json!({"prompt": "Hi", "max_tokens": 2}),
            )
            .await;
            (r, t.elapsed())
        };
        let ((st, r), ((small_st, _), small_took)) = tokio::join!(post(&s, path, body), small);
        let took = start.elapsed();
        assert_eq!(st, want, "{name}: {r:.300}");
        if want != 200 {
            let e = &r["error"];
            let said = format!("{} {}", e["message"], e["param"]);
            assert!(said.contains(says), "{name}: {said}");
        }
        assert_eq!(small_st, 200, "{name}");
        // Linear work takes well under a second; pairwise work took 11-19 s.
        assert!(took < Duration::from_secs(5), "{name}: {took:?}");
        assert!(
            small_took < Duration::from_secs(5),
            "{name}: the small request took {small_took:?}"
        );
    }
    // 128 copies of the stop strings would have been 2 GiB.
    let peak = s.peak_rss();
    assert!(peak < 1536 << 20, "peak RSS {} MiB", peak >> 20);
}

/// A stored response costs about the JSON it is (parsed, it cost twelve
/// times that), and GETs of a large one, sixteen at once, neither differ
/// from it nor hold up a probe.
#[tokio::test(flavor = "multi_thread")]
async fn stored_responses_cost_what_they_hold() {
    // One malloc arena: memory freed by one request is what the next
    // reuses, whichever thread runs it, so RSS tracks what is held.
    let s = Server::start_with(
        &[],
        &[("RUST_LOG", "warn"), ("MALLOC_ARENA_MAX", "1")],
        std::process::Stdio::inherit(),
    );
    // 128 tools of 4,400 small properties each: about 6 MB echoed.
    let props: serde_json::Map<String, Value> =
        (0..4400).map(|i| (format!("p{i}"), json!({}))).collect();
    let tools: Vec<Value> = (0..128)
        .map(|t| {
            json!({"type": "function", "name": format!("f{t}"),
                        "parameters": {"type": "object", "properties": props}})
        })
        .collect();
    let body = |store: bool| {
        json!({"input": "Hi", "max_output_tokens": 1, "tools": tools, "tool_choice": "none",
               "store": store})
    };
    let client = reqwest::Client::new();
    let create = |store: bool| {
        let r = client
            .post(s.url("/v1/responses"))
            .json(&body(store))
            .send();
        async move {
            let r = r.await.unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap()
        }
    };
    // The same requests unkept first, so the allocator has grown to them.
    for _ in 0..8 {
        create(false).await;
    }
    let before = s.rss();
    let mut kept = Vec::new();
    for _ in 0..8 {
        kept.push(create(true).await);
    }
    let grown = s.rss().saturating_sub(before) as f64;
    let json: usize = kept.iter().map(|k| k.len()).sum();
    assert!(json > 40 << 20, "{json} bytes kept");
    assert!(
        grown < 3.0 * json as f64,
        "{} MiB grown for {} MiB kept",
        grown / 1048576.0,
        json >> 20
    );

    let id = serde_json::from_slice::<Value>(&kept[0]).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let gets: Vec<_> = (0..16)
        .map(|_| {
            let r = client.get(s.url(&format!("/v1/responses/{id}"))).send();
            tokio::spawn(async move { r.await.unwrap().bytes().await.unwrap() })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    while !gets.iter().all(|g| g.is_finished()) {
        let t = Instant::now();
        assert_eq!(reqwest::get(s.url("/health")).await.unwrap().status(), 200);
        slowest = slowest.max(t.elapsed());
    }
    for g in gets {
        assert_eq!(g.await.unwrap(), kept[0]);
    }
    assert!(slowest < Duration::from_secs(1), "/health took {slowest:?}");
}
