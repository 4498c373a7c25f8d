//! Bobbin instances through the real binary (spec 14.3.3): a `[bobbins.github]` table is a
//! working source under `hookspool run` (a real capture in, the batch delivered); a broken
//! instance makes `hookspool check` exit 2 with the key and the fix; a reload into a broken
//! instance keeps serving the old one; a processor instance starts `hookspool processor
//! <instance>` in the sandbox after materialising its bobbin, and `check --explain-sandbox`
//! shows exactly what it may read.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hookspool::sources::Request;

use super::bin;
use super::intake::{Resp, raw};
use super::receiver::Receiver;
use super::run_e2e::{RunProc, free_port, reserved_port};

use super::skip::skip_or_fail;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A capture file of a built-in bobbin, and its request at `now`.
pub fn capture(rel: &str) -> (String, hookspool::kit::capture::Capture) {
    let path = repo().join("bobbins").join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let cap = hookspool::kit::capture::Capture::parse(rel, &text)
        .unwrap_or_else(|e| panic!("{rel}: {e:?}"));
    (text, cap)
}

/// The bytes of `req` on the wire: its method, path and query, every header it was captured
/// with except the framing ones (Content-Length, Connection, Transfer-Encoding), which are
/// set here, and its body byte for byte.
pub fn wire(req: &Request) -> Vec<u8> {
    let mut target = req.path.clone();
    if !req.query.is_empty() {
        let q: Vec<String> = req
            .query
            .iter()
            .map(|(k, v)| format!("{}={}", pct(k), pct(v)))
            .collect();
        target = format!("{target}?{}", q.join("&"));
    }
    let mut head = format!("{} {target} HTTP/1.1\r\n", req.method);
    let framing = ["content-length", "connection", "transfer-encoding"];
    let mut host = false;
    for (k, v) in &req.headers {
        if framing.contains(&k.to_ascii_lowercase().as_str()) {
            continue;
        }
        host |= k.eq_ignore_ascii_case("host");
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !host {
        head.push_str("Host: hooks.test\r\n");
    }
    head.push_str(&format!(
        "Connection: close\r\nContent-Length: {}\r\n\r\n",
        req.body.len()
    ));
    let mut out = head.into_bytes();
    out.extend_from_slice(&req.body);
    out
}

fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `hookspool --home <home> <args>`.
fn hs(home: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .output()
        .expect("run hookspool")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn write_secret(home: &Path, name: &str, value: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = home.join("secrets");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, value).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// GitHub's documented example secret, which the github.repo captures are signed with.
const GITHUB_SECRET: &str = "It's a Secret to Everybody";
/// A Standard Webhooks secret (whsec_ and the base64 of 32 bytes) for the http destination.
const DEST_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwMfKQ9r8GKYo=";

fn github_config(home: &Path, port: u16, url: &str) -> String {
    let s = write_secret(home, "github", GITHUB_SECRET);
    let d = write_secret(home, "receiver", DEST_SECRET);
    format!(
        r#"[intake]
listen = "127.0.0.1:{port}"

[limits]
min_free_bytes = 0

[dispatch]
poll_s = 0.2

[bobbins.github]
bobbin = "github.repo"
secrets.secret = {{ file = "{s}" }}
outputs = {{ "*" = "receiver" }}
span = "immediate"

[destinations.receiver]
type = "http"
url = "{url}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{d}" }}
"#,
        s = s.display(),
        d = d.display()
    )
}

fn send(addr: SocketAddr, rel: &str) -> Resp {
    let (_, cap) = capture(rel);
    let at = cap.at.map(|a| a as f64).unwrap_or(0.0);
    let req = hookspool::sources::parse_capture(&cap.request, at).expect("capture request");
    raw(addr, &wire(&req))
}

fn wait_log(p: &RunProc, needle: &str, count: usize, within: Duration) {
    let until = Instant::now() + within;
    while p.log().matches(needle).count() < count {
        assert!(
            Instant::now() < until,
            "no {needle:?} x{count} in the log:\n{}",
            p.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bobbin_instance_under_run_takes_a_real_capture_and_delivers_it() {
    let rx = Receiver::start().await;
    let home = tempfile::tempdir().unwrap();
    let port = reserved_port();
    std::fs::write(
        home.path().join("config.toml"),
        github_config(home.path(), port, &rx.url()),
    )
    .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let p = tokio::task::block_in_place(|| RunProc::start(home.path(), addr, &[]));
    let r = tokio::task::block_in_place(|| send(addr, "github/repo/captures/push.http"));
    assert_eq!(r.status, 200, "{:?}\n{}", r.json(), p.log());
    assert_eq!(r.json()["status"], "queued");
    let got = rx.wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1, "delivered once; log:\n{}", p.log());
    let doc = got[0].json();
    assert_eq!(doc["source"], "github", "{doc:#}");
    assert_eq!(doc["key"], "Codertocat/Hello-World:push", "{doc:#}");
    let (_, cap) = capture("github/repo/captures/push.http");
    let body = cap.request.split_once("\n\n").unwrap().1;
    let sent: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(doc["events"][0], sent, "the captured payload");
    // A wrongly signed capture of the same bobbin is refused at the same URL.
    let r = tokio::task::block_in_place(|| send(addr, "github/repo/captures/wrong-secret.http"));
    assert_eq!(r.status, 401);
}

#[test]
fn bobbin_check_on_a_broken_instance_exits_2_with_the_key_and_the_fix() {
    let home = tempfile::tempdir().unwrap();
    let good = github_config(home.path(), 8651, "http://127.0.0.1:9/hook");
    let cases = [
        (
            good.replace("bobbin = \"github.repo\"\n", ""),
            "bobbins.github.bobbin: required (did you mean bobbin = \"github.repo\"?)",
        ),
        (
            good.replace("secrets.secret = ", "secrets.token = "),
            "bobbins.github.secrets.token: github.repo has no secret token; remove it",
        ),
        (
            good.replace("span = \"immediate\"", "span = \"soon\""),
            "bobbins.github.span: no span preset \"soon\"; write one of",
        ),
    ];
    for (config, needle) in cases {
        std::fs::write(home.path().join("config.toml"), &config).unwrap();
        let o = hs(home.path(), &["check"]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let out = text(&o);
        assert!(out.contains("config.toml"), "the file is named: {out}");
        assert!(out.contains(needle), "{needle} not in:\n{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bobbin_reload_into_a_broken_instance_keeps_serving_the_old_one() {
    let rx = Receiver::start().await;
    let home = tempfile::tempdir().unwrap();
    let port = reserved_port();
    let config = home.path().join("config.toml");
    let good = github_config(home.path(), port, &rx.url());
    std::fs::write(&config, &good).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let p = tokio::task::block_in_place(|| RunProc::start(home.path(), addr, &[]));
    // A setting github.repo does not declare: the instance no longer expands.
    let broken = good.replace(
        "span = \"immediate\"",
        "span = \"immediate\"\nsettings = { colour = \"red\" }",
    );
    // The mtime must move for the reload to notice (a coarse clock could keep it equal).
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(&config, broken).unwrap();
    tokio::task::block_in_place(|| {
        wait_log(&p, "config reload failed", 2, Duration::from_secs(20))
    });
    let log = p.log();
    assert!(log.contains("bobbins.github.settings.colour"), "{log}");
    let r = tokio::task::block_in_place(|| send(addr, "github/repo/captures/push.http"));
    assert_eq!(r.status, 200, "the old instance still serves: {}", p.log());
    let got = rx.wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1, "and still delivers; log:\n{}", p.log());
}

const GMAIL_TOKEN: &str = "hookspool-kit-gmail-push-token";

fn gmail_config(home: &Path, port: u16) -> String {
    let token = write_secret(home, "gmail_push", GMAIL_TOKEN);
    let cred = write_secret(home, "gmail_cred", "{}");
    format!(
        r#"[intake]
listen = "127.0.0.1:{port}"

[limits]
min_free_bytes = 0

[dispatch]
poll_s = 0.2
backoff_base_s = 3600

[bobbins.gmail]
bobbin = "google.gmail"
secrets.push_token = {{ file = "{t}" }}
secrets.cred_owner = {{ file = "{c}" }}
settings = {{ owner = "user@example.com" }}
outputs = {{ mail = "hermes:mail" }}
span = "immediate"
"#,
        t = token.display(),
        c = cred.display()
    )
}

#[test]
fn bobbin_processor_instance_explains_its_sandbox() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        gmail_config(home.path(), free_port()),
    )
    .unwrap();
    let o = hs(home.path(), &["check", "--explain-sandbox", "script:gmail"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = text(&o);
    let program = format!("program: {} processor gmail", bin().display());
    assert!(out.contains(&program), "{program} not in:\n{out}");
    let bobbin_dir = home.path().join("builtin-bobbins/google/gmail");
    assert!(
        out.contains(&format!("read+execute: {}", bobbin_dir.display())),
        "{out}"
    );
    // The processor secret is readable; the source-only push token is not.
    let cred = home.path().join("secrets/gmail_cred");
    assert!(out.contains(&cred.display().to_string()), "{out}");
    assert!(!out.contains("gmail_push"), "{out}");
    // Gmail's processor calls the Gmail API ([provider] api_docs): network on.
    assert!(out.contains("network: on"), "{out}");
    for name in hookspool::destinations::script::PROCESSOR_ENV {
        assert!(out.contains(name), "{name} not in:\n{out}");
    }
    let check = hs(home.path(), &["check"]);
    let said = text(&check);
    assert!(
        !said.contains("processor runtime"),
        "this build has the runtime: {said}"
    );
}

#[test]
fn bobbin_processor_instance_spawns_the_runtime_after_materialising_its_bobbin() {
    let home = tempfile::tempdir().unwrap();
    let port = reserved_port();
    std::fs::write(
        home.path().join("config.toml"),
        gmail_config(home.path(), port),
    )
    .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let p = RunProc::start(home.path(), addr, &[]);
    let r = send(addr, "google/gmail/captures/push.http");
    assert_eq!(r.status, 200, "{:?}\n{}", r.json(), p.log());
    let dir = home.path().join("builtin-bobbins/google/gmail");
    let until = Instant::now() + Duration::from_secs(20);
    let attempt = loop {
        let o = hs(home.path(), &["--json", "show", "1", "--attempts"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        if let Some(a) = v["attempts"].as_array().and_then(|a| a.first())
            && !a["finished_at"].is_null()
        {
            break a.clone();
        }
        assert!(Instant::now() < until, "no attempt; log:\n{}", p.log());
        std::thread::sleep(Duration::from_millis(100));
    };
    // The bobbin's directory was written from the binary before the spawn.
    let manifest = std::fs::read(dir.join("bobbin.toml")).expect("materialised bobbin.toml");
    assert_eq!(
        manifest,
        std::fs::read(repo().join("bobbins/google/gmail/bobbin.toml")).unwrap()
    );
    // The stored detail (the stderr tail), never logged.
    let reason = attempt["error"].as_str().unwrap_or_default().to_string();
    for never in [
        "cannot start script",
        "bobbin directory unusable",
        "script env name invalid",
    ] {
        assert!(!reason.contains(never), "{attempt:#}");
    }
    // What was started is the runtime itself (`hookspool processor <instance>`).
    assert!(!reason.contains("unrecognized subcommand"), "{attempt:#}");
}

#[test]
fn bobbin_expand_prints_references_and_never_a_secret_value() {
    let home = tempfile::tempdir().unwrap();
    let config = gmail_config(home.path(), 8652)
        + &github_config(home.path(), 8652, "http://127.0.0.1:9/hook")
            .split_once("[bobbins.github]")
            .map(|(_, rest)| format!("[bobbins.github]{rest}"))
            .unwrap();
    // Every secret file holds a sentinel, which must never be printed.
    const SENTINEL: &str = "SENTINEL-bobbin-expand-7f3a";
    for name in ["gmail_push", "gmail_cred", "github", "receiver"] {
        write_secret(home.path(), name, &format!("{SENTINEL}-{name}"));
    }
    std::fs::write(home.path().join("config.toml"), &config).unwrap();
    let o = hs(home.path(), &["bobbin", "expand"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = text(&o);
    assert!(
        !out.contains(SENTINEL),
        "a secret value was printed:\n{out}"
    );
    // The tables as the loader sees them, the source's references as references.
    for want in [
        "[sources.gmail]",
        "[sources.github]",
        "[destinations.\"script:gmail\"]",
        "processor = \"gmail\"",
        &format!(
            "file = \"{}\"",
            home.path().join("secrets/gmail_cred").display()
        ),
        "HOOKSPOOL_SECRET_REFS = '{\"cred_owner\":\"<reference>\"}'",
    ] {
        assert!(out.contains(want), "{want} not in:\n{out}");
    }
    // HOOKSPOOL_SECRET_REFS names its secrets only: no reference inside it.
    let refs_line = out
        .lines()
        .find(|l| l.starts_with("HOOKSPOOL_SECRET_REFS"))
        .unwrap();
    assert!(!refs_line.contains("file"), "{refs_line}");
    // One instance; JSON; an unknown one; a broken one.
    let o = hs(home.path(), &["bobbin", "expand", "github"]);
    assert!(!text(&o).contains("[sources.gmail]"), "{}", text(&o));
    assert!(text(&o).contains("[sources.github]"));
    let o = hs(home.path(), &["--json", "bobbin", "expand", "gmail"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["gmail"]["sources"]["gmail"]["type"], "gmail", "{v:#}");
    assert!(
        !o.stdout
            .windows(SENTINEL.len())
            .any(|w| w == SENTINEL.as_bytes())
    );
    let o = hs(home.path(), &["bobbin", "expand", "nope"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    std::fs::write(
        home.path().join("config.toml"),
        config.replace("bobbin = \"github.repo\"", "bobbin = \"github.nope\""),
    )
    .unwrap();
    let o = hs(home.path(), &["bobbin", "expand"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("bobbins.github.bobbin: no bobbin github.nope is installed"),
        "{}",
        text(&o)
    );
}

#[test]
fn starter_demo_is_a_bobbin_instance_and_its_printed_curl_is_delivered() {
    if Command::new("curl").arg("--version").output().is_err() {
        skip_or_fail("curl is not installed (the starter prints a curl command to run)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let port = free_port();
    let mut child = Command::new(bin())
        .arg("--home")
        .arg(&home)
        .arg("run")
        .env("HOOKSPOOL_PORT", port.to_string())
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .env_remove("LISTEN_FDS")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn hookspool run");
    let err = super::capture_stderr(&mut child);
    let log = || String::from_utf8_lossy(&err.lock().unwrap()).to_string();
    let until = Instant::now() + Duration::from_secs(30);
    let curl = loop {
        if let Some(line) = log().lines().find(|l| l.trim_start().starts_with("curl ")) {
            break line.trim().to_string();
        }
        assert!(Instant::now() < until, "no curl printed:\n{}", log());
        std::thread::sleep(Duration::from_millis(50));
    };
    while !log().contains("ready status=serving") {
        assert!(
            Instant::now() < until,
            "the intake never served:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let config = std::fs::read_to_string(home.join("config.toml")).unwrap();
    assert!(
        config.contains("[bobbins.demo]\nbobbin = \"hookspool.webhook\""),
        "{config}"
    );
    assert!(
        !config.lines().any(|l| l.starts_with("[sources.")),
        "{config}"
    );
    // The printed command, run as a person pastes it.
    let out = Command::new("sh").arg("-c").arg(&curl).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"status\":\"queued\"}",
        "{curl}\n{}",
        log()
    );
    let batch = home.join("outbox/batch-1.json");
    while !batch.exists() {
        assert!(Instant::now() < until, "no batch in the outbox:\n{}", log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let doc: serde_json::Value = loop {
        // The script may still be writing it.
        if let Ok(v) = serde_json::from_slice(&std::fs::read(&batch).unwrap()) {
            break v;
        }
        assert!(Instant::now() < until);
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(doc["source"], "demo", "{doc:#}");
    assert_eq!(doc["events"][0]["text"], "my first webhook", "{doc:#}");
    let again = Command::new("sh").arg("-c").arg(&curl).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        "{\"status\":\"duplicate\"}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn bobbin_check_refuses_a_processor_state_dir_others_can_read() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let state = home.path().join("gmail-state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = gmail_config(home.path(), 8653).replace(
        "span = \"immediate\"",
        &format!("span = \"immediate\"\nstate_dir = \"{}\"", state.display()),
    );
    std::fs::write(home.path().join("config.toml"), config).unwrap();
    let o = hs(home.path(), &["check"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let want = format!(
        "bobbins.gmail.state_dir: {} has mode 0755: the processor keeps OAuth tokens there in clear text; run chmod 700",
        state.display()
    );
    assert!(text(&o).contains(&want), "{want} not in:\n{}", text(&o));
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let o = hs(home.path(), &["check"]);
    assert!(!text(&o).contains("state_dir"), "{}", text(&o));
    // A relative override is refused by the expansion itself, on every path.
    let config = std::fs::read_to_string(home.path().join("config.toml"))
        .unwrap()
        .replace(
            &format!("state_dir = \"{}\"", state.display()),
            "state_dir = \"state\"",
        );
    std::fs::write(home.path().join("config.toml"), config).unwrap();
    let o = hs(home.path(), &["check"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("bobbins.gmail.state_dir: an absolute directory"),
        "{}",
        text(&o)
    );
}
