//! Issue 31: the dashboard in a real browser. Debian's `chromium` driven through
//! `chromedriver` over WebDriver (plain HTTP on loopback, no client crate) against a real
//! `hookspool run`: sign in with the token once, send signed webhooks to the intake and
//! watch them appear on the batches page without a reload (the live stream), see them die
//! on a receiver answering 422, open a dead batch, replay it with the confirmation, and see
//! it delivered once the receiver answers 200. Every page is screenshotted (laptop and
//! phone width) under target/admin-screenshots/ for review; no page shows the token or a
//! payload until asked.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use super::intake::read_response;
use super::receiver::{Answer, Receiver};
use super::run_e2e::{RunProc, free_port};
use super::skip::skip_or_fail;

const TOKEN: &str = "BROWSERTOKENSENTINEL-0123456789abcdef";
const SECRET: &str = "browser-source-secret";

/// chromedriver on a loopback port, and one browser session.
struct Driver {
    child: Child,
    addr: SocketAddr,
    session: String,
}

impl Driver {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        call(
            self.addr,
            method,
            &format!("/session/{}{path}", self.session),
            body,
        )
    }

    fn go(&self, url: &str) {
        self.call("POST", "/url", Some(json!({"url": url})));
    }

    fn script(&self, js: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({"script": js, "args": []})),
        )["value"]
            .clone()
    }

    fn source(&self) -> String {
        self.call("GET", "/source", None)["value"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    fn wait(&self, what: &str, within: Duration, mut f: impl FnMut(&Driver) -> bool) {
        let deadline = Instant::now() + within;
        while !f(self) {
            assert!(
                Instant::now() < deadline,
                "{what} (within {within:?}); page:\n{}",
                self.source()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn screenshot(&self, dir: &Path, name: &str) {
        let v = self.call("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(v["value"].as_str().unwrap_or(""))
            .expect("a PNG");
        assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    fn click(&self, css: &str) {
        let el = self.call(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        let id = el["value"]
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {el}"))
            .to_string();
        self.call("POST", &format!("/element/{id}/click"), Some(json!({})));
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            call(
                self.addr,
                "DELETE",
                &format!("/session/{}", self.session),
                None,
            )
        });
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One WebDriver command (chromedriver accepts a loopback Host only).
fn call(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Value {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        addr.port(),
        body.len()
    );
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let r = read_response(&mut s);
    serde_json::from_slice(&r.body).unwrap_or(Value::Null)
}

fn which(names: &[&str]) -> Option<PathBuf> {
    names.iter().find_map(|n| {
        let p = Path::new(n);
        if p.is_absolute() {
            return p.exists().then(|| p.to_path_buf());
        }
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(n))
                .find(|c| c.exists())
        })
    })
}

fn start_driver(chromedriver: &Path, chromium: &Path) -> Driver {
    let port = free_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen");
        std::thread::sleep(Duration::from_millis(100));
    }
    let v = call(
        addr,
        "POST",
        "/session",
        Some(json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": {
                "binary": chromium.to_string_lossy(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"],
            },
        }}})),
    );
    let session = v["value"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("no WebDriver session: {v}"))
        .to_string();
    Driver {
        child,
        addr,
        session,
    }
}

fn write_config(home: &Path, intake: u16, admin: u16, url: &str) {
    std::fs::write(home.join("source.secret"), SECRET).unwrap();
    std::fs::write(home.join("admin.token"), TOKEN).unwrap();
    std::fs::write(home.join("dest.secret"), "browser-destination-secret").unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"
[intake]
listen = "127.0.0.1:{intake}"

[limits]
min_free_bytes = 0

[dispatch]
poll_s = 0.5

[admin]
listen = "127.0.0.1:{admin}"
token = {{ file = "{home}/admin.token" }}

[sources.shop]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.order"
dedup = "payload.id"
event_type = "payload.type"
quiet_s = 0
max_s = 0
action = "recv"
secrets.secret = {{ file = "{home}/source.secret" }}

[destinations.recv]
type = "http"
url = "{url}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
timeout_s = 5
secret = {{ file = "{home}/dest.secret" }}
"#,
            home = home.display()
        ),
    )
    .unwrap();
}

fn rows(d: &Driver) -> i64 {
    d.script("return document.querySelectorAll('tr[data-batch]').length;")
        .as_i64()
        .unwrap_or(0)
}

#[test]
fn the_dashboard_in_chromium_shows_webhooks_live_and_replays_a_dead_batch() {
    let (Some(chromedriver), Some(chromium)) = (
        which(&["chromedriver", "/usr/bin/chromedriver"]),
        which(&["chromium", "chromium-browser", "/usr/bin/chromium"]),
    ) else {
        skip_or_fail(
            "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)",
        );
        return;
    };
    let shots = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("admin-screenshots");
    std::fs::create_dir_all(&shots).unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let recv = rt.block_on(Receiver::start());
    recv.set_default(Answer::status(422));
    let home = tempfile::tempdir().unwrap();
    let (intake, admin) = (free_port(), free_port());
    write_config(home.path(), intake, admin, &recv.url());
    let run = RunProc::start(home.path(), ([127, 0, 0, 1], intake).into(), &[]);
    let base = format!("http://127.0.0.1:{admin}");
    let d = start_driver(&chromedriver, &chromium);

    // Sign in once with the token: the cookie, then the address without it.
    d.go(&format!("{base}/?token={TOKEN}"));
    d.wait("the overview", Duration::from_secs(20), |d| {
        d.source().contains("Recent batches")
    });
    let here = d.call("GET", "/url", None)["value"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert_eq!(here, format!("{base}/"), "the token left the address bar");
    d.screenshot(&shots, "01-overview-empty");

    // The batches page, open while webhooks arrive: they appear without a reload.
    d.go(&format!("{base}/batches"));
    d.wait("the batches page", Duration::from_secs(10), |d| {
        d.source().contains("<h1>Batches</h1>")
    });
    d.wait("the live stream is open", Duration::from_secs(10), |d| {
        d.script("return document.getElementById('live-dot').classList.contains('on');")
            == json!(true)
    });
    d.script("window.__noReload = 42; return 1;");
    for i in 0..3 {
        let body = format!(
            r#"{{"id":"evt-{i}","order":"order-{i}","type":"order.paid","card":"PAYLOADSENTINEL{i}"}}"#
        );
        let r = run.post("shop", SECRET.as_bytes(), body.as_bytes(), &[]);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    d.wait("three batches appear live", Duration::from_secs(20), |d| {
        rows(d) == 3
    });
    assert_eq!(
        d.script("return window.__noReload;"),
        json!(42),
        "no reload: the live update swapped the table"
    );
    d.screenshot(&shots, "02-batches-live");

    // The receiver answers 422: the batches die, and the dead letters page lists them.
    d.go(&format!("{base}/dead"));
    d.wait("three dead batches", Duration::from_secs(30), |d| {
        d.script("return document.querySelectorAll('tr[data-state=dead]').length;") == json!(3)
    });
    d.screenshot(&shots, "03-dead-letters");
    let page = d.source();
    assert!(!page.contains("PAYLOADSENTINEL"), "no payload on the list");
    assert!(!page.contains(TOKEN), "no token in a page");

    // Open one, replay it with the confirmation, once the receiver accepts.
    let id = d
        .script("return document.querySelector('tr[data-state=dead]').dataset.batch;")
        .as_str()
        .unwrap()
        .to_string();
    d.click(&format!("a[href='/batches/{id}']"));
    d.wait("the batch page", Duration::from_secs(10), |d| {
        d.source().contains(&format!("Batch {id}"))
    });
    let page = d.source();
    assert!(page.contains(&format!("journalctl BATCH={id}")));
    assert!(page.contains(&format!("hookspool replay {id}")));
    assert!(
        !page.contains("PAYLOADSENTINEL"),
        "payloads only on request"
    );
    d.screenshot(&shots, "04-batch-dead");
    recv.set_default(Answer::status(200));
    d.click("#replay");
    let alert = d.call("GET", "/alert/text", None);
    assert!(
        alert["value"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("Replay batch {id}")),
        "the confirmation: {alert}"
    );
    d.call("POST", "/alert/accept", Some(json!({})));
    d.wait("the batch delivered", Duration::from_secs(30), |d| {
        d.script("var s = document.getElementById('batch-state'); return s && s.textContent;")
            == json!("delivered")
    });
    d.screenshot(&shots, "05-batch-delivered");
    assert!(
        recv.requests().len() >= 4,
        "three failed deliveries and the replayed one"
    );

    // The payloads behind the explicit link.
    d.click("#show-payloads");
    d.wait(
        "the payload shown on request",
        Duration::from_secs(10),
        |d| d.source().contains("PAYLOADSENTINEL"),
    );

    // Every page renders (screenshots for review), at laptop and phone width.
    for (name, path) in [
        ("06-overview", "/"),
        ("07-destinations", "/destinations"),
        ("08-sources", "/sources"),
        ("09-issues", "/issues?all=1"),
        ("10-polls", "/polls"),
        (
            "11-batches-filtered",
            "/batches?state=delivered&event_type=order.paid",
        ),
    ] {
        d.go(&format!("{base}{path}"));
        d.wait(name, Duration::from_secs(10), |d| {
            d.source().contains("</main>")
        });
        let page = d.source();
        assert!(
            !page.contains(TOKEN) && !page.contains("PAYLOADSENTINEL"),
            "{name}"
        );
        d.screenshot(&shots, name);
    }
    let filtered = rows(&d);
    assert_eq!(
        filtered, 1,
        "the bookmarkable filter shows the replayed batch only"
    );
    d.call(
        "POST",
        "/window/rect",
        Some(json!({"width": 390, "height": 844})),
    );
    d.go(&format!("{base}/"));
    d.wait("the phone overview", Duration::from_secs(10), |d| {
        d.source().contains("</main>")
    });
    let overflow =
        d.script("return document.documentElement.scrollWidth <= window.innerWidth + 1;");
    d.screenshot(&shots, "12-overview-phone");
    assert_eq!(overflow, json!(true), "the page fits a phone's width");
    assert!(!run.log().contains(TOKEN), "the token is never logged");
    println!("screenshots in {}", shots.display());
}
