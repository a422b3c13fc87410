//! The chat page at `/`, in a real browser: headless Chromium driven
//! through chromedriver (Debian's `chromium` and `chromium-driver`, which
//! `.ci/run` installs) against the real binary on the default model. The
//! browser tests skip, saying so, where no chromedriver is installed.
//!
//! `WICK_WEBUI_SCREENSHOT=PATH` saves the page after its first answer
//! (`docs/img/webui.png` is one).

mod common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{metric, Server};
use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

/// A chromedriver of its own, on a free port; killed on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chromedriver() -> Option<Driver> {
    let bin = std::env::var("WICK_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = match Command::new(&bin)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("skipping: no chromedriver ({bin}: {e}); install chromium-driver");
            return None;
        }
    };
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(driver)
}

async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    let mut chrome = json!({"args": [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--window-size=1280,860", "--force-device-scale-factor=1",
    ]});
    if let Some(bin) = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    {
        chrome["binary"] = json!(bin);
    }
    caps.insert("goog:chromeOptions".into(), chrome);
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a Chromium session")
}

/// Runs `script` in the page (its `return` value, as JSON).
async fn js(c: &Client, script: &str) -> Value {
    c.execute(script, Vec::new()).await.unwrap()
}

/// Polls `script` until it returns true, for up to `limit`.
async fn wait_until(c: &Client, script: &str, limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    while js(c, script).await != json!(true) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

const STREAMING: &str = "return document.querySelector('.msg.assistant.streaming') !== null";
const IDLE: &str = "return document.querySelector('.msg.assistant.streaming') === null \
                    && !document.getElementById('send').hidden";

async fn type_into(c: &Client, css: &str, text: &str) {
    let e = c.find(Locator::Css(css)).await.unwrap();
    e.clear().await.unwrap();
    e.send_keys(text).await.unwrap();
}

/// Sets the open conversation's settings through the settings panel.
async fn settings(c: &Client, max_tokens: &str, extra: &str) {
    if js(c, "return document.getElementById('settings').hidden").await == json!(true) {
        click(c, "#toggle-settings").await;
    }
    type_into(c, "#set-max-tokens", max_tokens).await;
    type_into(c, "#set-extra", extra).await;
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

const CURRENT_TITLE: &str =
    "return document.querySelector('#conversations .current .open').textContent";

/// Types `text` in the message box and presses Enter.
async fn say(c: &Client, text: &str) {
    let input = c.find(Locator::Id("input")).await.unwrap();
    input.send_keys(text).await.unwrap();
    input
        .send_keys(&char::from(Key::Enter).to_string())
        .await
        .unwrap();
}

/// Presses `key` wherever the focus is: the element it acts on may be
/// gone by the time the key comes up, which fails `send_keys`.
async fn press(c: &Client, key: Key) {
    let key = char::from(key);
    let actions = KeyActions::new("keys".into())
        .then(KeyAction::Down { value: key })
        .then(KeyAction::Up { value: key });
    c.perform_actions(actions).await.unwrap();
}

fn last_answer() -> &'static str {
    "const m = document.querySelectorAll('.msg.assistant .body'); \
     return m.length ? m[m.length - 1].textContent : ''"
}

#[tokio::test]
async fn the_page_streams_stops_keeps_and_renders_replies_as_text() {
    let Some(driver) = chromedriver() else { return };
    let server = Server::start(&[]);
    let c = browser(&driver).await;
    c.goto(&server.url("/")).await.unwrap();
    wait_until(
        &c,
        "return document.getElementById('model').textContent.length > 0",
        Duration::from_secs(20),
        "the model's name",
    )
    .await;
    let model = js(&c, "return document.getElementById('model').textContent").await;
    assert_eq!(model, json!("SmolLM2-135M-Instruct.Q4_1"));

    // A reply streams in: text shows while the answer is still streaming,
    // and grows to the whole answer.
    settings(&c, "120", "").await;
    say(&c, "Write a short poem about a candle.").await;
    wait_until(
        &c,
        STREAMING,
        Duration::from_secs(20),
        "the stream to start",
    )
    .await;
    let mut partial = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while js(&c, STREAMING).await == json!(true) {
        let text = js(&c, last_answer()).await;
        if partial.is_empty() && js(&c, STREAMING).await == json!(true) {
            partial = text.as_str().unwrap_or_default().to_string();
        }
        assert!(Instant::now() < deadline, "the answer never ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_until(&c, IDLE, Duration::from_secs(10), "the page to settle").await;
    let answer = js(&c, last_answer()).await.as_str().unwrap().to_string();
    assert!(!partial.is_empty(), "no text showed while streaming");
    assert!(
        answer.len() > partial.len(),
        "the answer did not grow past {partial:?}: {answer:?}"
    );
    let stats = js(
        &c,
        "return document.querySelector('.msg.assistant .stats').textContent",
    )
    .await;
    let stats = stats.as_str().unwrap();
    assert!(
        stats.contains("tokens") && stats.contains("first token") && stats.contains("tok/s"),
        "{stats}"
    );
    if let Ok(path) = std::env::var("WICK_WEBUI_SCREENSHOT") {
        click(&c, "#toggle-settings").await;
        std::fs::write(&path, c.screenshot().await.unwrap()).unwrap();
    }

    // Reloaded, the conversation is still there, title and all.
    c.refresh().await.unwrap();
    wait_until(
        &c,
        "return document.querySelectorAll('.msg').length === 2",
        Duration::from_secs(10),
        "the kept conversation",
    )
    .await;
    assert_eq!(js(&c, last_answer()).await, json!(answer));
    let title = js(&c, CURRENT_TITLE).await;
    assert_eq!(title, json!("Write a short poem about a candle."));

    // Regenerate the last answer: still two turns, a new answer.
    click(&c, ".regenerate").await;
    wait_until(
        &c,
        STREAMING,
        Duration::from_secs(20),
        "the regenerated answer",
    )
    .await;
    wait_until(
        &c,
        IDLE,
        Duration::from_secs(60),
        "the regenerated answer to end",
    )
    .await;
    assert_eq!(
        js(&c, "return document.querySelectorAll('.msg').length").await,
        json!(2)
    );

    // Edit the user turn: the conversation restarts from it.
    click(&c, ".msg.user .edit-turn").await;
    type_into(&c, ".msg.user .edit textarea", "Name three colours.").await;
    click(&c, ".save-edit").await;
    wait_until(
        &c,
        IDLE,
        Duration::from_secs(60),
        "the edited turn's answer",
    )
    .await;
    let turns = js(
        &c,
        "return [...document.querySelectorAll('.msg .body')].map(b => b.textContent)",
    )
    .await;
    assert_eq!(turns.as_array().unwrap().len(), 2, "{turns}");
    assert_eq!(turns[0], json!("Name three colours."));

    // Stop mid-stream (Esc): the server sees the disconnect, counts the
    // request aborted and runs nothing more.
    let aborted = "wick:request_success_total{finished_reason=\"abort\"}";
    let before = metric(&server, aborted).await;
    click(&c, "#new-chat").await;
    settings(&c, "3000", r#"{"ignore_eos": true}"#).await;
    say(&c, "Count to ten thousand.").await;
    wait_until(
        &c,
        "return document.querySelector('.msg.assistant.streaming .body')?.textContent.length > 20",
        Duration::from_secs(20),
        "a long answer to start",
    )
    .await;
    c.find(Locator::Css("body"))
        .await
        .unwrap()
        .send_keys(&char::from(Key::Escape).to_string())
        .await
        .unwrap();
    wait_until(&c, IDLE, Duration::from_secs(5), "the stop").await;
    let stats = js(
        &c,
        "return document.querySelector('.msg.assistant .stats').textContent",
    )
    .await;
    assert!(stats.as_str().unwrap().contains("stopped"), "{stats}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(&server, aborted).await < before + 1.0
        || metric(&server, "wick:num_requests_running").await != 0.0
    {
        assert!(
            Instant::now() < deadline,
            "the server never freed the stopped request"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        js(
            &c,
            "return document.querySelectorAll('#conversations li').length"
        )
        .await,
        json!(2)
    );
    // Settings belong to their conversation: the first kept its own.
    click(&c, "#conversations li:last-child .open").await;
    let kept = "return [document.getElementById('set-max-tokens').value, document.getElementById('set-extra').value]";
    assert_eq!(js(&c, kept).await, json!(["120", ""]));

    // Model output is text, never markup: a stored answer carrying script,
    // an image with a handler and a javascript: link, reloaded.
    let planted = json!([{
        "id": "planted", "title": "planted", "settings": {},
        "messages": [
            {"role": "user", "content": "<b>hi</b>"},
            {"role": "assistant", "reasoning": "thinking <b>aloud</b>",
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"<i>Paris</i>\"}"}}],
             "content":
                "<script>window.pwned = 1</script>\n\n<img src=x onerror=\"window.pwned = 2\">\n\n**bold** and [click](javascript:window.pwned=3)\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```\ncode <i>x</i>\n```"}
        ]
    }]);
    js(
        &c,
        &format!(
            "localStorage.setItem('wick.conversations', {}); localStorage.setItem('wick.current', 'planted'); return true",
            serde_json::to_string(&planted.to_string()).unwrap()
        ),
    )
    .await;
    c.refresh().await.unwrap();
    wait_until(
        &c,
        "return document.querySelectorAll('.msg').length === 2",
        Duration::from_secs(10),
        "the planted conversation",
    )
    .await;
    let seen = js(
        &c,
        "const m = document.getElementById('messages'); return {
           text: m.textContent,
           markup: m.querySelectorAll('script, img, b, i, [onerror]').length,
           links: [...m.querySelectorAll('a')].map(a => a.getAttribute('href')),
           strong: m.querySelectorAll('strong').length,
           cells: m.querySelectorAll('td').length,
           code: m.querySelectorAll('pre code').length,
           thinking: [...m.querySelectorAll('details.thinking')].map(d => d.open),
           tools: [...m.querySelectorAll('.tool-call .name')].map(n => n.textContent),
           pwned: window.pwned === undefined ? null : window.pwned }",
    )
    .await;
    assert_eq!(seen["markup"], json!(0), "{seen}");
    assert_eq!(seen["pwned"], Value::Null, "{seen}");
    assert_eq!(seen["links"], json!([]), "{seen}");
    assert_eq!(seen["strong"], json!(1), "{seen}");
    assert_eq!(seen["cells"], json!(2), "{seen}");
    assert_eq!(seen["code"], json!(1), "{seen}");
    assert_eq!(seen["thinking"], json!([false]), "collapsed: {seen}");
    assert_eq!(seen["tools"], json!(["get_weather"]), "{seen}");
    let text = seen["text"].as_str().unwrap();
    for shown in [
        "<b>hi</b>",
        "<script>window.pwned = 1</script>",
        "onerror=",
        "code <i>x</i>",
        "thinking <b>aloud</b>",
        "<i>Paris</i>",
    ] {
        assert!(text.contains(shown), "{shown:?} not shown as text: {text}");
    }

    // And the CSP is a second wall: markup with an inline handler, were
    // it ever inserted, is blocked by the browser.
    js(
        &c,
        "window.violations = [];
         document.addEventListener('securitypolicyviolation',
             e => window.violations.push(e.effectiveDirective));
         const d = document.createElement('div');
         d.innerHTML = '<img src=\"/missing.png\" onerror=\"window.pwned = 4\">';
         document.body.appendChild(d);
         return true",
    )
    .await;
    wait_until(
        &c,
        "return window.violations.some(v => v.startsWith('script-src'))",
        Duration::from_secs(10),
        "the CSP to block an inline handler",
    )
    .await;
    assert_eq!(
        js(&c, "return window.pwned === undefined").await,
        json!(true)
    );

    // Rename, then delete, the planted conversation.
    click(&c, "#conversations .current .rename").await;
    // The old name starts selected: typing replaces it.
    let name = c.find(Locator::Css("#conversations input")).await.unwrap();
    name.send_keys("renamed").await.unwrap();
    press(&c, Key::Enter).await;
    let title = js(&c, CURRENT_TITLE).await;
    assert_eq!(title, json!("renamed"));
    click(&c, "#conversations .current .delete").await;
    c.accept_alert().await.unwrap();
    assert_eq!(
        js(
            &c,
            "return document.querySelectorAll('#conversations li').length"
        )
        .await,
        json!(0)
    );

    // At a phone's width nothing runs off the side, and the conversation
    // list opens from its button.
    c.set_window_size(390, 800).await.unwrap();
    let wide = "return document.documentElement.scrollWidth <= window.innerWidth";
    assert_eq!(js(&c, wide).await, json!(true));
    let list_shown = "return document.getElementById('sidebar').getBoundingClientRect().right > 0";
    let list_hidden =
        "return document.getElementById('sidebar').getBoundingClientRect().right <= 0";
    wait_until(
        &c,
        list_hidden,
        Duration::from_secs(2),
        "the list to slide away",
    )
    .await;
    click(&c, "#toggle-sidebar").await;
    wait_until(
        &c,
        list_shown,
        Duration::from_secs(2),
        "the conversation list",
    )
    .await;
    c.close().await.unwrap();
}

#[tokio::test]
async fn with_an_api_key_the_page_asks_for_it_once() {
    let Some(driver) = chromedriver() else { return };
    let server = Server::start(&["--api-key", "sekret"]);
    let c = browser(&driver).await;
    c.goto(&server.url("/")).await.unwrap();
    let asked = "return !document.getElementById('key-dialog').hidden";
    wait_until(&c, asked, Duration::from_secs(20), "the key prompt").await;
    type_into(
        &c,
        "#key-input",
        &format!("wrong{}", char::from(Key::Enter)),
    )
    .await;
    wait_until(
        &c,
        "return !document.getElementById('key-error').hidden && !document.getElementById('key-dialog').hidden",
        Duration::from_secs(10),
        "the refusal",
    )
    .await;
    type_into(
        &c,
        "#key-input",
        &format!("sekret{}", char::from(Key::Enter)),
    )
    .await;
    wait_until(
        &c,
        "return document.getElementById('model').textContent === 'SmolLM2-135M-Instruct.Q4_1'",
        Duration::from_secs(10),
        "the model list with the key",
    )
    .await;
    // Shift+Enter is a new line, not a send.
    let input = c.find(Locator::Id("input")).await.unwrap();
    let shift = char::from(Key::Shift);
    input
        .send_keys(&format!("a{shift}{}{shift}b", char::from(Key::Enter)))
        .await
        .unwrap();
    assert_eq!(
        js(&c, "return document.getElementById('input').value").await,
        json!("a\nb")
    );
    assert_eq!(
        js(&c, "return document.querySelectorAll('.msg').length").await,
        json!(0)
    );
    input.clear().await.unwrap();
    settings(&c, "8", "").await;
    say(&c, "Hi").await;
    wait_until(&c, IDLE, Duration::from_secs(60), "the answer").await;
    let failed = js(&c, "return document.querySelectorAll('.msg .error').length").await;
    assert_eq!(failed, json!(0));
    // A refused request shows the server's own message.
    settings(&c, "8", r#"{"bogus_field": 1}"#).await;
    say(&c, "Hi again").await;
    wait_until(
        &c,
        "return document.querySelectorAll('.msg .error').length === 1",
        Duration::from_secs(10),
        "the refusal",
    )
    .await;
    let shown = js(
        &c,
        "return document.querySelector('.msg .error').textContent",
    )
    .await;
    let shown = shown.as_str().unwrap();
    assert!(
        shown.contains("refused") && shown.contains("bogus_field"),
        "{shown}"
    );
    assert_eq!(js(&c, asked).await, json!(false), "asked twice");
    // Kept for the session only, never in localStorage.
    let stored = js(
        &c,
        "return [sessionStorage.getItem('wick.apiKey'), JSON.stringify(localStorage).includes('sekret')]",
    )
    .await;
    assert_eq!(stored, json!(["sekret", false]));
    c.close().await.unwrap();
}

#[tokio::test]
async fn the_page_has_a_strict_csp_the_host_check_and_an_off_switch() {
    let server = Server::start(&["--allowed-hosts", "localhost,127.0.0.1"]);
    let http = reqwest::Client::new();
    for path in ["/", "/webui/app.js", "/webui/style.css", "/webui/icon.svg"] {
        let r = http.get(server.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let csp = r.headers()["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("default-src 'none'"), "{csp}");
        assert!(csp.contains("script-src 'self';"), "{csp}");
        assert!(csp.contains("connect-src 'self';"), "{csp}");
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    }
    let page = http
        .get(server.url("/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !page.contains("<script>") && page.contains("<script src=\"/webui/app.js\""),
        "the page's script must be a file of its own"
    );
    // The API's Host check covers the page.
    let r = http
        .get(server.url("/"))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error(), "{}", r.status());

    let off = Server::start(&["--no-webui"]);
    for path in ["/", "/webui/app.js"] {
        let r = http.get(off.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }
}
