//! The `playground` example. Its JSON API over HTTP: malformed requests get 400 and the server keeps
//! serving, sessions are bounded, the page is self-contained. And the page driven in headless
//! Chromium through WebDriver, as a person would use it: it loads without console errors, the automatic stream runs at load, pause stops it, five
//! clicks on "hit" add exactly five decisions to every panel, and each panel's admitted count is what
//! the same limiters decide for the same request times. The chat tab throttles the spammer. A
//! screenshot is written to `target/playground/playground.png`.
//!
//! The browser test needs Debian's `chromium` and `chromium-driver` (`scripts/test.sh` installs
//! them). Without them it says so and passes, except under `CI=true`, where it fails.
//!
//! Run: `cargo build --all-features --examples && cargo test --all-features --test http playground::`
//! (a plain `cargo test` builds the examples itself; `--test NAME` alone does not).

use crate::examples::example;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use tollgate::{ManualClock, RateLimiter, Strategy};

/// A child process stopped by its PID when dropped (also when the test fails).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `name` on `PATH`.
fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One HTTP/1.1 request over a fresh connection; returns the status and the body.
fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    // Reads the head, then Content-Length bytes (some servers keep the connection open anyway).
    let mut reader = BufReader::new(s);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).expect("read the head") == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP response from {addr}: {head:?}"));
    let lower = head.to_ascii_lowercase();
    let length = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let mut raw = Vec::new();
    match length {
        Some(n) => {
            raw.resize(n, 0);
            reader.read_exact(&mut raw).expect("read the body");
        }
        None => {
            reader.read_to_end(&mut raw).expect("read the body");
        }
    }
    let rest = String::from_utf8_lossy(&raw).into_owned();
    let body = if lower.contains("transfer-encoding: chunked") {
        dechunk(&rest)
    } else {
        rest
    };
    (status, body)
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

/// Polls `f` every 100 ms until it returns `Some`, for at most `within`.
async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every panel's `(strategy, allowed, blocked)` read from its data attributes.
async fn counts(c: &Client) -> Vec<(String, u64, u64)> {
    let v = c
        .execute(
            "return [...document.querySelectorAll('[data-strategy]')].map(p => \
             [p.dataset.strategy, Number(p.dataset.allowed), Number(p.dataset.blocked)]);",
            vec![],
        )
        .await
        .expect("read the panels");
    v.as_array()
        .expect("an array")
        .iter()
        .map(|p| {
            (
                p[0].as_str().expect("name").to_owned(),
                p[1].as_u64().expect("allowed"),
                p[2].as_u64().expect("blocked"),
            )
        })
        .collect()
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click {css}: {e}"));
}

async fn session_id(c: &Client) -> String {
    c.execute("return document.body.dataset.session || '';", vec![])
        .await
        .expect("session")
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Types the settings into the form, applies them, and waits for the new session's id.
async fn apply_settings(c: &Client, limit: &str, period: &str, burst: &str) -> String {
    let old = session_id(c).await;
    for (id, value) in [("limit", limit), ("period", period), ("burst", burst)] {
        let input = c.find(Locator::Id(id)).await.expect("input");
        input.clear().await.expect("clear");
        input.send_keys(value).await.expect("type");
    }
    click(c, "[data-action=apply]").await;
    wait_for("a new session", Duration::from_secs(10), || async {
        let s = session_id(c).await;
        (s != old && !s.is_empty()).then_some(s)
    })
    .await
}

/// Starts the playground on port 0 with `extra` flags; returns it, its URL and its address from its
/// one stdout line.
fn start_playground(extra: &[&str]) -> (Proc, String, String) {
    let mut child = Command::new(example("playground"))
        .args(["--addr", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the playground");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let proc = Proc(child);
    let mut line = String::new();
    out.read_line(&mut line).expect("read the listening line");
    let url = line
        .strip_suffix('\n')
        .and_then(|l| l.strip_prefix("listening on "))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let addr = url.trim_start_matches("http://").to_owned();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    // Keeps the pipe open (and drained) while the playground runs.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (proc, url, addr)
}

#[test]
fn playground_api_answers_malformed_requests_with_400_and_bounds_its_sessions() {
    let (_playground, _url, addr) = start_playground(&[]);
    let (status, page) = http(&addr, "GET", "/", None);
    assert_eq!(status, 200);
    for action in ["hit", "pause", "play"] {
        assert!(
            page.contains(&format!("data-action=\"{action}\"")),
            "{action}"
        );
    }
    for asset in ["/", "/style.css", "/app.js", "/favicon.svg"] {
        let (status, body) = http(&addr, "GET", asset, None);
        assert_eq!(status, 200, "{asset}");
        let links = body.replace("http://www.w3.org/2000/svg", "");
        assert!(
            !links.contains("http://") && !links.contains("https://"),
            "{asset} loads nothing from elsewhere (it works offline)"
        );
    }

    let (status, body) = http(&addr, "POST", "/api/session", Some(""));
    assert_eq!(status, 200, "{body}");
    let first: Value = serde_json::from_str(&body).expect("JSON");
    let id = first["session"].as_str().expect("session id").to_owned();
    assert_eq!(
        first["settings"],
        json!({"limit": 5, "period_s": 10, "burst": 5}),
        "the default quota"
    );
    let hit = format!(r#"{{"session":"{id}","count":2}}"#);
    let hits = [
        "garbage".to_owned(),
        String::new(),
        format!(r#"{{"session":"{id}","count":0}}"#),
        format!(r#"{{"session":"{id}","count":51}}"#),
        format!(r#"{{"session":"{id}","count":-1}}"#),
        format!(r#"{{"session":"{id}","extra":1}}"#),
    ];
    let sessions = [
        r#"{"limit":0,"period_s":10,"burst":5}"#.to_owned(),
        r#"{"limit":5,"period_s":99999,"burst":5}"#.to_owned(),
        r#"{"limit":"5"}"#.to_owned(),
    ];
    let chats = [
        format!(r#"{{"session":"{id}","user":""}}"#),
        format!(r#"{{"session":"{id}","user":"{}"}}"#, "x".repeat(33)),
    ];
    let mut bad: Vec<(&str, &str, Option<String>)> = vec![("GET", "/api/state", None)];
    bad.extend(hits.into_iter().map(|b| ("POST", "/api/hit", Some(b))));
    bad.extend(
        sessions
            .into_iter()
            .map(|b| ("POST", "/api/session", Some(b))),
    );
    bad.extend(chats.into_iter().map(|b| ("POST", "/api/chat", Some(b))));
    for (method, path, body) in &bad {
        let (status, answer) = http(&addr, method, path, body.as_deref());
        assert_eq!(status, 400, "{method} {path} {body:?}: {answer}");
        assert!(answer.contains("\"error\""), "a JSON error: {answer}");
    }
    let (status, body) = http(&addr, "POST", "/api/hit", Some(&hit));
    assert_eq!(status, 200, "still serving: {body}");
    let state: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        state["decisions"].as_array().map(Vec::len),
        Some(12),
        "2 requests x 6 strategies"
    );
    let (status, _) = http(&addr, "POST", "/api/hit", Some(r#"{"session":"nope"}"#));
    assert_eq!(status, 404, "an unknown session");

    // More sessions than the cap: the least recently used go, the newest stay.
    let mut last = String::new();
    for _ in 0..300 {
        let (status, body) = http(&addr, "POST", "/api/session", Some(""));
        assert_eq!(status, 200);
        let v: Value = serde_json::from_str(&body).expect("JSON");
        last = v["session"].as_str().expect("id").to_owned();
    }
    let (status, _) = http(&addr, "GET", &format!("/api/state?session={id}"), None);
    assert_eq!(status, 404, "the oldest session was evicted at the cap");
    let (status, _) = http(&addr, "GET", &format!("/api/state?session={last}"), None);
    assert_eq!(status, 200, "the newest session is kept");
}

#[test]
fn playground_sessions_expire_after_the_idle_time() {
    let (_playground, _url, addr) = start_playground(&["--session-idle", "1"]);
    let new_session = || {
        let (status, body) = http(&addr, "POST", "/api/session", Some(""));
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        v["session"].as_str().expect("id").to_owned()
    };
    let kept = new_session();
    let idle = new_session();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(500));
        let (status, _) = http(&addr, "GET", &format!("/api/state?session={kept}"), None);
        assert_eq!(status, 200, "a session in use is kept");
    }
    let (status, _) = http(&addr, "GET", &format!("/api/state?session={idle}"), None);
    assert_eq!(status, 404, "a session idle for 1.5 s is gone");
    let hit = format!(r#"{{"session":"{idle}"}}"#);
    let (status, _) = http(&addr, "POST", "/api/hit", Some(&hit));
    assert_eq!(status, 404);
    let (status, _) = http(
        &addr,
        "GET",
        &format!("/api/state?session={}", new_session()),
        None,
    );
    assert_eq!(status, 200, "new sessions still open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn playground_in_headless_chromium_decides_on_the_server() {
    let (Some(chromium), Some(driver)) = (find_tool("chromium"), find_tool("chromedriver")) else {
        let msg = "chromium or chromedriver is missing (apt-get install chromium chromium-driver; \
                   scripts/test.sh installs them)";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
        eprintln!("SKIPPED: {msg}");
        return;
    };

    let (_playground, url, addr) = start_playground(&[]);
    let (status, _) = http(&addr, "GET", "/favicon.ico", None);
    assert_eq!(status, 200, "a favicon is served");
    let (status, _) = http(&addr, "POST", "/api/hit", Some("{not json"));
    assert_eq!(status, 400, "malformed API requests get 400");

    // chromedriver on a free port.
    let port = free_port();
    let _driver = Proc(
        Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver"),
    );
    let driver_addr = format!("127.0.0.1:{port}");
    wait_for("chromedriver", Duration::from_secs(20), || {
        let a = driver_addr.clone();
        async move {
            TcpStream::connect(&a)
                .ok()
                .map(|_| http(&a, "GET", "/status", None))
                .filter(|(s, _)| *s == 200)
        }
    })
    .await;
    let caps = json!({
        "goog:chromeOptions": {
            "binary": chromium.to_str().expect("utf-8 path"),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", "--hide-scrollbars"],
        },
        "goog:loggingPrefs": { "browser": "ALL" },
    });
    let mut builder = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new());
    builder.capabilities(caps.as_object().expect("object").clone());
    let c = builder
        .connect(&format!("http://{driver_addr}"))
        .await
        .expect("a WebDriver session");

    let result = drive(&c, &url, &addr, &driver_addr).await;
    let _ = c.close().await;
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// The clicks and checks; a panic here is caught so the browser is closed first.
async fn drive(
    c: &Client,
    url: &str,
    addr: &str,
    driver_addr: &str,
) -> Result<(), Box<dyn std::any::Any + Send>> {
    use futures_like::catch;
    catch(async {
        c.goto(url).await.expect("load the page");
        let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
        let panels = wait_for("six panels", Duration::from_secs(10), || async {
            let p = counts(c).await;
            (p.len() == 6).then_some(p)
        })
        .await;
        let got: Vec<&str> = panels.iter().map(|p| p.0.as_str()).collect();
        assert_eq!(got, names, "exactly one element per strategy, in CLI order");

        // The automatic stream runs at load.
        wait_for("the automatic stream", Duration::from_secs(10), || async {
            counts(c).await.iter().all(|p| p.1 + p.2 > 0).then_some(())
        })
        .await;

        // Pause, then change the settings: counts restart at 0 and the stream stays paused.
        click(c, "[data-action=pause]").await;
        let session = apply_settings(c, "3", "10", "3").await;
        wait_for("counts reset", Duration::from_secs(5), || async {
            counts(c).await.iter().all(|p| p.1 + p.2 == 0).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            counts(c).await.iter().all(|p| p.1 + p.2 == 0),
            "paused: the stream sends nothing"
        );

        // Five clicks on hit: exactly five decisions per panel.
        for _ in 0..5 {
            click(c, "[data-action=hit]").await;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        wait_for(
            "five decisions per panel",
            Duration::from_secs(10),
            || async { counts(c).await.iter().all(|p| p.1 + p.2 == 5).then_some(()) },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let after = counts(c).await;
        assert!(
            after.iter().all(|p| p.1 + p.2 == 5),
            "exactly five: {after:?}"
        );

        // The same limiters, on a manual clock, at the times the server saw the hits.
        let (status, body) = http(addr, "GET", &format!("/api/state?session={session}"), None);
        assert_eq!(status, 200, "{body}");
        let state: Value = serde_json::from_str(&body).expect("state JSON");
        let hits: Vec<u64> = state["hits"]
            .as_array()
            .expect("hits")
            .iter()
            .map(|h| h.as_str().and_then(|s| s.parse().ok()).expect("a time"))
            .collect();
        assert_eq!(hits.len(), 5);
        for (strategy, (name, allowed, _)) in Strategy::ALL.iter().zip(&after) {
            let clock = ManualClock::default();
            let limiter = RateLimiter::<&str>::builder()
                .strategy(*strategy)
                .quotas("3/10s")
                .expect("quota")
                .burst(NonZeroU32::new(3).expect("non-zero"))
                .clock(clock.clone())
                .build()
                .expect("limiter");
            let want = hits
                .iter()
                .filter(|&&t| {
                    clock.set_nanos(t);
                    limiter.check_now(&"you", 1).is_allowed()
                })
                .count() as u64;
            assert_eq!(
                *allowed, want,
                "{name}: the panel shows what tollgate decides"
            );
        }

        // The chat tab: the spammer is throttled, blocked messages are struck out.
        click(c, "#tab-chat").await;
        wait_for("a blocked chat message", Duration::from_secs(8), || async {
            let v = c
                .execute(
                    "const b = document.querySelector('#chat-log li.blocked .text');\
                     return b ? getComputedStyle(b).textDecorationLine : null;",
                    vec![],
                )
                .await
                .expect("chat");
            v.as_str().map(str::to_owned)
        })
        .await
        .contains("line-through")
        .then_some(())
        .expect("struck out");
        let in_chat = c
            .execute(
                "return document.querySelectorAll('#chat [data-strategy]').length;",
                vec![],
            )
            .await
            .expect("chat");
        assert_eq!(in_chat, json!(0), "the chat tab carries no data-strategy");

        // Back to the strategies with the default settings and the stream running, for the picture.
        click(c, "#tab-strategies").await;
        apply_settings(c, "5", "10", "5").await;
        click(c, "[data-action=play]").await;
        tokio::time::sleep(Duration::from_millis(5000)).await;
        let running = counts(c).await;
        assert!(
            running.iter().all(|p| p.1 + p.2 >= 3),
            "play resumes the stream in the new session: {running:?}"
        );
        let limits = c
            .execute(
                "return [...document.querySelectorAll('[data-strategy] .state')].map(e => e.textContent);",
                vec![],
            )
            .await
            .expect("states");
        for text in limits.as_array().expect("array") {
            let text = text.as_str().expect("text");
            assert!(text.contains(" of 5"), "the panels show the new settings: {text}");
        }
        for _ in 0..3 {
            click(c, "[data-action=hit]").await;
        }
        tokio::time::sleep(Duration::from_millis(800)).await;
        let png = c.screenshot().await.expect("screenshot");
        let dir = target_dir().join("playground");
        std::fs::create_dir_all(&dir).expect("target/playground");
        std::fs::write(dir.join("playground.png"), &png).expect("write the screenshot");
        assert!(png.len() > 10_000, "a real picture");

        // No console errors since load.
        let (status, body) = http(
            driver_addr,
            "POST",
            &format!(
                "/session/{}/se/log",
                c.session_id().await.expect("id").expect("id")
            ),
            Some(r#"{"type":"browser"}"#),
        );
        assert_eq!(status, 200, "browser log: {body}");
        let log: Value = serde_json::from_str(&body).expect("log JSON");
        let severe: Vec<&Value> = log["value"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| e["level"] == "SEVERE")
            .collect();
        assert!(severe.is_empty(), "console errors: {severe:?}");
    })
    .await
}

/// Catching a panic in an async block without extra crates.
mod futures_like {
    use std::future::Future;
    use std::panic::AssertUnwindSafe;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    pub(crate) struct Catch<F>(Pin<Box<F>>);

    impl<F: Future<Output = ()>> Future for Catch<F> {
        type Output = Result<(), Box<dyn std::any::Any + Send>>;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let fut = self.0.as_mut();
            match std::panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
                Ok(Poll::Ready(())) => Poll::Ready(Ok(())),
                Ok(Poll::Pending) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            }
        }
    }

    pub(crate) fn catch<F: Future<Output = ()>>(f: F) -> Catch<F> {
        Catch(Box::pin(f))
    }
}
