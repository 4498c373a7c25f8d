//! The Google processors end to end through `hookspool run` (issue 15): the real intake
//! takes the bobbin's own signed capture (and pushes made from it), the dispatcher starts
//! `hookspool processor <instance>` in the script sandbox, the processor asks a stub Google
//! (`processor_google::Fake`, a real server on 127.0.0.1:0 answering with Google's documented
//! shapes; its base reaches the child through HOOKSPOOL_TEST_PROVIDER_BASE, passed only in
//! failpoints builds), and the items reach a real receiver through an http destination: once,
//! in order, one document per processor run. Also: access tokens refreshed and a rotated
//! refresh token kept, 5xx and 429 retried with backoff, a 403 for a missing scope held as
//! a config issue until the grant and a reload, resyncs that announce nothing, an emit that
//! never joins the instance's own open batch (the emit route collision), and a processor
//! spawn after the binary's file was replaced (a package upgrade).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hookspool::sources::Request;
use serde_json::{Value, json};

use super::bin;
use super::bobbins_run::{capture, wire};
use super::intake::raw;
use super::processor_google::{
    CLIENT_ID, CLIENT_SECRET, Fake, REFRESH, calendar_api, drive_api, gmail_api_of, google_error,
};
use super::processor_stub::{Req, Resp};
use super::receiver::{Receiver, Recorded};
use super::run_e2e::{RunProc, free_port, reserved_port};

/// The mailbox of the gmail capture (`push.http`'s emailAddress), the instance's owner.
const MAILBOX: &str = "user@example.com";
const PUSH_TOKEN: &str = "hookspool-kit-gmail-push-token";
/// The channel token of Google's documentation example, in the calendar and drive captures.
const CHANNEL_TOKEN: &str = "398348u3tu83ut8uu38";
const DEST_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwMfKQ9r8GKYo=";
const WAIT: Duration = Duration::from_secs(30);

struct Env {
    home: tempfile::TempDir,
    fake: Fake,
    rx: Receiver,
    p: RunProc,
    cred: PathBuf,
    product: &'static str,
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

/// The config of one Google instance whose outputs all go to the receiver; `instance` is
/// the rest of its `[bobbins.<product>]` table (settings, outputs, window).
fn config(home: &Path, port: u16, product: &str, instance: &str, url: &str) -> (String, PathBuf) {
    let (name, value) = match product {
        "gmail" => ("push_token", PUSH_TOKEN),
        _ => ("channel_token", CHANNEL_TOKEN),
    };
    let t = write_secret(home, "source", value);
    let cred = write_secret(
        home,
        "cred",
        &json!({"type": "authorized_user", "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET, "refresh_token": REFRESH})
        .to_string(),
    );
    let d = write_secret(home, "receiver", DEST_SECRET);
    let text = format!(
        r#"[intake]
listen = "127.0.0.1:{port}"

[limits]
min_free_bytes = 0

[dispatch]
poll_s = 0.2
backoff_base_s = 1

[bobbins.{product}]
bobbin = "google.{product}"
secrets.{name} = {{ file = "{t}" }}
secrets.cred_owner = {{ file = "{c}" }}
{instance}

[destinations.receiver]
type = "http"
url = "{url}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{d}" }}
"#,
        t = t.display(),
        c = cred.display(),
        d = d.display()
    );
    (text, cred)
}

impl Env {
    async fn start(product: &'static str, instance: &str, api: fn(&Req) -> Resp) -> Env {
        let fake = Fake::start();
        fake.api(api);
        Env::start_with(product, instance, fake, &super::bin()).await
    }

    async fn start_with(product: &'static str, instance: &str, fake: Fake, program: &Path) -> Env {
        let home = tempfile::tempdir().unwrap();
        let rx = Receiver::start().await;
        let port = reserved_port();
        let (text, cred) = config(home.path(), port, product, instance, &rx.url());
        std::fs::write(home.path().join("config.toml"), text).unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let base = fake.stub.base.clone();
        let p = tokio::task::block_in_place(|| {
            RunProc::start_program(
                program,
                home.path(),
                addr,
                &[("HOOKSPOOL_TEST_PROVIDER_BASE", &base)],
            )
        });
        Env {
            home,
            fake,
            rx,
            p,
            cred,
            product,
        }
    }

    fn hs(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .arg("--home")
            .arg(self.home.path())
            .args(args)
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .output()
            .unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let o = self.hs(&all);
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&o.stderr)))
    }

    /// The batches delivered to (or waiting for) `destination`, oldest first.
    fn batches(&self, destination: &str) -> Vec<Value> {
        let v = self.json(&["list", "--destination", destination]);
        let mut rows = v.as_array().cloned().unwrap_or_default();
        rows.sort_by_key(|r| r["id"].as_i64());
        rows
    }

    /// Waits until the processor destination has `n` batches and all are delivered.
    fn processed(&self, n: usize) -> Vec<Value> {
        let dest = format!("script:{}", self.product);
        let until = Instant::now() + WAIT;
        loop {
            let rows = self.batches(&dest);
            if rows.len() >= n && rows.iter().all(|r| r["state"] == "delivered") {
                return rows;
            }
            assert!(
                Instant::now() < until,
                "{n} processed batches expected: {rows:#?}\nlog:\n{}",
                self.p.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn attempts(&self, batch: i64) -> Vec<Value> {
        self.json(&["show", &batch.to_string(), "--attempts"])["attempts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn send(&self, req: &Request) -> u16 {
        raw(self.p.addr, &wire(req)).status
    }

    /// Nothing more reaches the receiver for a while (no duplicate, no late copy).
    async fn settled(&self, n: usize) -> Vec<Recorded> {
        let got = self.rx.wait_for(n, WAIT).await;
        assert_eq!(got.len(), n, "log:\n{}", self.p.log());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let later = self.rx.requests();
        assert_eq!(later.len(), n, "delivered once: {:#?}", docs(&later));
        later
    }

    /// No run's log line or stored attempt detail carries a token, the client secret or a
    /// message subject.
    fn assert_no_sentinel(&self) {
        let log = self.p.log();
        assert!(!log.contains("SENTINEL"), "{log}");
        for b in self.batches(&format!("script:{}", self.product)) {
            let a = serde_json::to_string(&self.attempts(b["id"].as_i64().unwrap())).unwrap();
            assert!(!a.contains("SENTINEL"), "{a}");
        }
    }
}

fn docs(r: &[Recorded]) -> Vec<Value> {
    r.iter().map(Recorded::json).collect()
}

/// The (event type, id) of each item a delivered document carries.
fn items(doc: &Value, id: &str) -> Vec<(String, String)> {
    let types = doc["event_meta"].as_array().unwrap();
    doc["events"]
        .as_array()
        .unwrap()
        .iter()
        .zip(types)
        .map(|(e, m)| {
            (
                m["event_type"].as_str().unwrap().to_string(),
                e[id].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// A capture of a built-in bobbin as a request.
fn captured(rel: &str) -> Request {
    let (_, cap) = capture(rel);
    hookspool::sources::parse_capture(&cap.request, 0.0).expect("capture request")
}

/// The gmail capture's push with another history id and message id (Gmail "Push
/// notifications": message.data is base64 JSON {emailAddress, historyId}).
fn gmail_push(history: u64) -> Request {
    let mut req = captured("google/gmail/captures/push.http");
    let data = base64::engine::general_purpose::STANDARD
        .encode(json!({"emailAddress": MAILBOX, "historyId": history.to_string()}).to_string());
    req.body = json!({"message": {"data": data, "messageId": format!("e2e-{history}"),
            "publishTime": "2026-05-01T09:00:00Z"},
        "subscription": "projects/myproject/subscriptions/mysubscription"})
    .to_string()
    .into_bytes();
    req
}

/// A calendar or drive capture with another message number (a new notification).
fn channel_push(rel: &str, number: u64) -> Request {
    let mut req = captured(rel);
    for (k, v) in req.headers.iter_mut() {
        if k.eq_ignore_ascii_case("X-Goog-Message-Number") {
            *v = number.to_string();
        }
    }
    req
}

fn gmail_api(r: &Req) -> Resp {
    gmail_api_of(MAILBOX, r)
}

const GMAIL_INSTANCE: &str = r#"settings = { owner = "user@example.com", tz = "Europe/Berlin", horizon_days = 2 }
outputs = { mail = "receiver", scheduling = "receiver" }
span = "immediate""#;

fn is_history(r: &Req) -> bool {
    r.path.ends_with("/gmail/v1/users/me/history")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_run_gmail_capture_pages_to_the_receiver_once_in_order_and_tokens_refresh() {
    let e = Env::start("gmail", GMAIL_INSTANCE, gmail_api).await;
    let cred_before = std::fs::read(&e.cred).unwrap();
    // An earlier push at history 1000 sets the baseline silently.
    assert_eq!(
        tokio::task::block_in_place(|| e.send(&gmail_push(1000))),
        200
    );
    tokio::task::block_in_place(|| e.processed(1));
    assert!(e.rx.requests().is_empty(), "the baseline announces nothing");
    assert!(e.fake.stub.requests().is_empty(), "and asks nothing");
    {
        let mut t = e.fake.tokens.lock().unwrap();
        t.expires_in = 2;
        t.rotate_next = Some("SENTINEL-rotated-1".into());
    }
    // The bobbin's own capture (history 1234567890): history since 1000, over two pages.
    let (_, cap) = capture("google/gmail/captures/push.http");
    let req = hookspool::sources::parse_capture(&cap.request, 0.0).unwrap();
    assert_eq!(tokio::task::block_in_place(|| e.send(&req)), 200);
    let got = e.settled(1).await;
    let doc = got[0].json();
    assert_eq!(
        items(&doc, "id"),
        [
            ("mail".to_string(), "m1".to_string()),
            ("scheduling".to_string(), String::new()),
            ("mail".to_string(), "m2".to_string())
        ],
        "m1 once although two history records name it, in order; m3 is gone: {doc:#}"
    );
    assert_eq!(
        doc["events"][0]["subject"],
        "Are you free for a call on Thursday?"
    );
    assert_eq!(doc["events"][1]["message"]["id"], "m1");
    assert!(doc["events"][1]["free_windows"].is_array(), "{doc:#}");
    assert_eq!(doc["source"], "gmail");
    assert_eq!(doc["route"], "gmail>receiver", "the emits' own route");
    assert_eq!(doc["key"], MAILBOX, "the batch key (spec 14.3.4)");
    let pages: Vec<Req> = e
        .fake
        .stub
        .requests()
        .into_iter()
        .filter(is_history)
        .collect();
    assert_eq!(pages.len(), 2, "two pages");
    assert_eq!(pages[1].q("pageToken"), Some("page-2"));
    let tokens = e.fake.token_requests();
    assert_eq!(tokens.len(), 1, "one refresh serves the whole run");
    assert_eq!(tokens[0].form("refresh_token").as_deref(), Some(REFRESH));

    // The access token lasted two seconds: the next run refreshes, with the rotated token.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        tokio::task::block_in_place(|| e.send(&gmail_push(1234567999))),
        200
    );
    tokio::task::block_in_place(|| e.processed(3));
    let tokens = e.fake.token_requests();
    assert_eq!(tokens.len(), 2, "the expired access token was refreshed");
    assert_eq!(
        tokens[1].form("refresh_token").as_deref(),
        Some("SENTINEL-rotated-1"),
        "the rotated refresh token is kept and used"
    );
    assert_eq!(
        std::fs::read(&e.cred).unwrap(),
        cred_before,
        "never written back"
    );
    e.settled(1).await;
    e.assert_no_sentinel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_run_gmail_5xx_and_429_are_retried_with_backoff_and_a_too_old_history_resyncs() {
    let e = Env::start("gmail", GMAIL_INSTANCE, gmail_api).await;
    assert_eq!(
        tokio::task::block_in_place(|| e.send(&gmail_push(1000))),
        200
    );
    tokio::task::block_in_place(|| e.processed(1));
    e.fake.force(
        "/history",
        google_error(503, "backendError", "Backend Error", "UNAVAILABLE"),
    );
    e.fake.force(
        "/history",
        google_error(
            429,
            "rateLimitExceeded",
            "Rate Limit Exceeded",
            "RESOURCE_EXHAUSTED",
        ),
    );
    let req = captured("google/gmail/captures/push.http");
    assert_eq!(tokio::task::block_in_place(|| e.send(&req)), 200);
    let got = e.settled(1).await;
    assert_eq!(items(&got[0].json(), "id").len(), 3);
    let rows = tokio::task::block_in_place(|| e.processed(2));
    let batch = rows[1]["id"].as_i64().unwrap();
    let a = e.attempts(batch);
    let shape: Vec<(String, Value, Value)> = a
        .iter()
        .map(|x| {
            (
                x["outcome"].as_str().unwrap().to_string(),
                x["status"].clone(),
                x["klass"].clone(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("retry".to_string(), json!(75), json!("transport")),
            ("retry".to_string(), json!(75), json!("transport")),
            ("ok".to_string(), json!(0), Value::Null)
        ],
        "{a:#?}"
    );
    // Backoff: base 1 s, then 2 s (plus up to 25 % jitter), not at once.
    let gap =
        |i: usize| a[i + 1]["started_at"].as_f64().unwrap() - a[i]["finished_at"].as_f64().unwrap();
    assert!(gap(0) >= 0.9 && gap(1) >= 1.9, "{a:#?}");
    assert!(
        a[0]["error"]
            .as_str()
            .unwrap()
            .contains("provider API answered 503"),
        "{a:#?}"
    );
    assert!(
        a[1]["error"]
            .as_str()
            .unwrap()
            .contains("Google API rate limit (429"),
        "{a:#?}"
    );

    // A stored history id Gmail no longer has (404): resynchronised to the profile's,
    // nothing announced.
    e.fake.force(
        "/history",
        google_error(
            404,
            "notFound",
            "Requested entity was not found.",
            "NOT_FOUND",
        ),
    );
    assert_eq!(
        tokio::task::block_in_place(|| e.send(&gmail_push(1234568000))),
        200
    );
    tokio::task::block_in_place(|| e.processed(3));
    let state: Value = serde_json::from_slice(
        &std::fs::read(e.home.path().join("bobbins/gmail/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        state["values"]["history_id"], "5000",
        "the profile's history id"
    );
    e.settled(1).await;
    e.assert_no_sentinel();
}

/// The Gmail stub with the scope missing until `granted` is set.
fn gated_scope(granted: Arc<Mutex<bool>>) -> impl Fn(&Req) -> Resp + Send + Sync + 'static {
    move |r: &Req| {
        if is_history(r) && !*granted.lock().unwrap() {
            return google_error(
                403,
                "insufficientPermissions",
                "Request had insufficient authentication scopes.",
                "PERMISSION_DENIED",
            );
        }
        gmail_api(r)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_run_gmail_403_missing_scope_is_a_config_issue_until_granted_and_reloaded() {
    let e = Env::start("gmail", GMAIL_INSTANCE, gmail_api).await;
    assert_eq!(
        tokio::task::block_in_place(|| e.send(&gmail_push(1000))),
        200
    );
    tokio::task::block_in_place(|| e.processed(1));
    let granted = Arc::new(Mutex::new(false));
    e.fake.api(gated_scope(granted.clone()));
    let req = captured("google/gmail/captures/push.http");
    assert_eq!(tokio::task::block_in_place(|| e.send(&req)), 200);
    // The processor exits 78: a config-class retry, uncounted, and an issue that names the
    // destination; the batch waits (retry, not dead), so nothing needs a replay.
    let until = Instant::now() + WAIT;
    let (batch, issue) = loop {
        // The issue opens after the attempt's mark commits, so the batch is read after it.
        let issues = e.json(&["issues"]);
        let issue = issues
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["fingerprint"] == "config:delivery:script:gmail")
            .cloned();
        let rows = e.batches("script:gmail");
        if let (Some(b), Some(i)) = (rows.get(1), issue) {
            break (b.clone(), i);
        }
        assert!(
            Instant::now() < until,
            "no config issue; log:\n{}",
            e.p.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let id = batch["id"].as_i64().unwrap();
    assert_eq!(
        batch["state"],
        "retry",
        "{batch:#}\n{:#?}\n{}",
        e.attempts(id),
        e.p.log()
    );
    let id = batch["id"].as_i64().unwrap();
    let a = e.attempts(id);
    assert_eq!(a[0]["status"], 78, "{a:#?}");
    assert_eq!(a[0]["klass"], "config", "{a:#?}");
    assert_eq!(a[0]["counted"], false, "{a:#?}");
    assert!(
        a[0]["error"]
            .as_str()
            .unwrap()
            .contains("403 insufficientPermissions"),
        "{a:#?}"
    );
    assert_eq!(issue["destination"], "script:gmail", "{issue:#}");
    assert!(
        issue["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("credential or grant"),
        "{issue:#}"
    );
    let shown = e.json(&["show", &id.to_string()]);
    assert_eq!(shown["batch"]["attempts"], 0, "uncounted: {shown:#}");
    assert!(e.rx.requests().is_empty());
    // The operator grants the scope and reloads: the waiting batch is due at once (the
    // backoff cap is 300 s), delivers, and the issue resolves.
    *granted.lock().unwrap() = true;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(e.p.child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let got = e.settled(1).await;
    assert_eq!(items(&got[0].json(), "id").len(), 3);
    let issues = e.json(&["issues"]);
    assert!(
        !issues
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["fingerprint"] == "config:delivery:script:gmail"),
        "resolved by the delivery: {issues:#}"
    );
    e.assert_no_sentinel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_run_emit_route_collision_items_never_join_the_instances_open_push_batch() {
    // A quiet window keeps the next push's batch open while the processor runs; its history
    // call waits until that push is queued.
    let instance = r#"settings = { owner = "user@example.com", tz = "Europe/Berlin", horizon_days = 2 }
outputs = { mail = "receiver", scheduling = "receiver" }
quiet_s = 3
max_s = 20"#;
    let fake = Fake::start();
    let gate = Arc::new((Mutex::new((false, false)), Condvar::new()));
    let g = gate.clone();
    fake.api(move |r: &Req| {
        if is_history(r) && r.q("pageToken").is_none() && r.q("startHistoryId") == Some("1000") {
            let (lock, cv) = &*g;
            let mut s = lock.lock().unwrap();
            s.0 = true;
            cv.notify_all();
            let (s, _) = cv
                .wait_timeout_while(s, Duration::from_secs(20), |s| !s.1)
                .unwrap();
            drop(s);
        }
        gmail_api(r)
    });
    let e = Env::start_with("gmail", instance, fake, &bin()).await;
    assert_eq!(
        tokio::task::block_in_place(|| e.send(&gmail_push(1000))),
        200
    );
    tokio::task::block_in_place(|| e.processed(1));
    let req = captured("google/gmail/captures/push.http");
    assert_eq!(tokio::task::block_in_place(|| e.send(&req)), 200);
    // The processor is inside history.list: push again, then let it finish.
    tokio::task::block_in_place(|| {
        let (lock, cv) = &*gate;
        let s = lock.lock().unwrap();
        let (s, timeout) = cv.wait_timeout_while(s, WAIT, |s| !s.0).unwrap();
        assert!(
            !timeout.timed_out(),
            "the processor never asked; log:\n{}",
            e.p.log()
        );
        drop(s);
        assert_eq!(e.send(&gmail_push(1234567999)), 200);
        lock.lock().unwrap().1 = true;
        cv.notify_all();
    });
    let got = e.settled(1).await;
    assert_eq!(
        items(&got[0].json(), "id").len(),
        3,
        "the items reached their output"
    );
    assert_eq!(got[0].json()["route"], "gmail>receiver");
    // The third push's batch holds that push alone, and goes to the processor.
    let rows = tokio::task::block_in_place(|| e.processed(3));
    let third = e.json(&["show", &rows[2]["id"].to_string(), "--events"]);
    assert_eq!(third["batch"]["count"], 1, "{third:#}");
    assert_eq!(third["batch"]["route"], "gmail", "{third:#}");
    assert_eq!(third["events"][0]["event_type"], "push", "{third:#}");
}

#[test]
fn processor_run_emit_route_collision_enqueue_with_a_destination_gets_a_route_of_its_own() {
    let home = tempfile::tempdir().unwrap();
    let (text, _) = config(
        home.path(),
        free_port(),
        "gmail",
        "settings = { owner = \"user@example.com\" }\noutputs = { mail = \"receiver\" }\nquiet_s = 600\nmax_s = 3600",
        "http://127.0.0.1:9/hook",
    );
    std::fs::write(home.path().join("config.toml"), text).unwrap();
    let enqueue = |extra: &[&str]| -> Value {
        let mut args = vec![
            "--json",
            "enqueue",
            "--source",
            "gmail",
            "--key",
            MAILBOX,
            "--event-type",
            "mail",
        ];
        args.extend_from_slice(extra);
        let mut c = Command::new(bin())
            .arg("--home")
            .arg(home.path())
            .args(&args)
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        c.stdin
            .take()
            .unwrap()
            .write_all(b"{\"id\":\"m1\"}")
            .unwrap();
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    // A sweep through the source's own route opens the instance's batch (to its processor).
    let destination = |v: &Value| -> Value {
        let o = Command::new(bin())
            .arg("--home")
            .arg(home.path())
            .args(["--json", "show", &v["copies"][0]["batch"].to_string()])
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&o.stdout).unwrap()["batch"]["destination"].clone()
    };
    let own = enqueue(&[]);
    assert_eq!(own["copies"][0]["route"], "gmail", "{own:#}");
    assert_eq!(destination(&own), "script:gmail", "{own:#}");
    // The same key to a named destination: its own route and batch, not the open one.
    let named = enqueue(&["--destination", "receiver"]);
    assert_eq!(named["copies"][0]["route"], "gmail>receiver", "{named:#}");
    assert_ne!(
        named["copies"][0]["batch"], own["copies"][0]["batch"],
        "{named:#}"
    );
    assert_eq!(destination(&named), "receiver", "{named:#}");
    let again = enqueue(&["--destination", "receiver"]);
    assert_eq!(
        again["copies"][0]["batch"], named["copies"][0]["batch"],
        "it coalesces"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_run_calendar_capture_pages_retries_a_500_and_resyncs_on_410() {
    // The calendar the stub serves (and the capture's X-Goog-Resource-URI names).
    let instance = r#"settings = { owner = "owner@example.com", tz = "Europe/Berlin" }
outputs = { changed = "receiver" }
span = "immediate""#;
    let e = Env::start("calendar", instance, calendar_api).await;
    // The bobbin's own capture is the first notification: a silent full sync (two pages).
    let req = captured("google/calendar/captures/events-exists.http");
    assert_eq!(tokio::task::block_in_place(|| e.send(&req)), 200);
    tokio::task::block_in_place(|| e.processed(1));
    assert!(e.rx.requests().is_empty(), "the baseline announces nothing");
    assert_eq!(e.fake.api_requests().len(), 2, "the full sync's two pages");
    // A sync message is acknowledged at the intake and never reaches the processor.
    let sync = captured("google/calendar/captures/sync.http");
    assert_eq!(tokio::task::block_in_place(|| e.send(&sync)), 200);
    // The next one meets a backend error first: retried with backoff, then two pages.
    e.fake.force(
        "/events",
        google_error(500, "backendError", "Backend Error", "INTERNAL"),
    );
    let next = channel_push("google/calendar/captures/events-exists.http", 11);
    assert_eq!(tokio::task::block_in_place(|| e.send(&next)), 200);
    let got = e.settled(1).await;
    let doc = got[0].json();
    assert_eq!(
        items(&doc, "id"),
        [
            ("changed".to_string(), "e1".to_string()),
            ("changed".to_string(), "e2".to_string()),
            ("changed".to_string(), "e3".to_string())
        ],
        "{doc:#}"
    );
    assert_eq!(doc["events"][1]["status"], "cancelled");
    let rows = tokio::task::block_in_place(|| e.processed(2));
    assert_eq!(rows.len(), 2, "the sync message made no batch: {rows:#?}");
    let a = e.attempts(rows[1]["id"].as_i64().unwrap());
    assert_eq!(
        (a.len(), &a[0]["status"], &a[1]["status"]),
        (2, &json!(75), &json!(0)),
        "{a:#?}"
    );
    // From s2 Calendar answers 410: a full resync, nothing announced.
    let gone = channel_push("google/calendar/captures/events-exists.http", 12);
    assert_eq!(tokio::task::block_in_place(|| e.send(&gone)), 200);
    tokio::task::block_in_place(|| e.processed(3));
    let state: Value = serde_json::from_slice(
        &std::fs::read(e.home.path().join("bobbins/calendar/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["values"]["sync_token"], "s1", "the new baseline");
    e.settled(1).await;
    e.assert_no_sentinel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_run_drive_capture_pages_retries_a_429_and_resyncs_a_rejected_token() {
    let instance = r#"settings = { owner = "user@example.com" }
outputs = { changed = "receiver" }
span = "immediate""#;
    let e = Env::start("drive", instance, drive_api).await;
    let req = captured("google/drive/captures/files-update.http");
    assert_eq!(tokio::task::block_in_place(|| e.send(&req)), 200);
    tokio::task::block_in_place(|| e.processed(1));
    assert!(e.rx.requests().is_empty(), "the start page token, silently");
    e.fake.force(
        "/changes",
        google_error(
            429,
            "rateLimitExceeded",
            "Rate Limit Exceeded",
            "RESOURCE_EXHAUSTED",
        ),
    );
    let next = channel_push("google/drive/captures/files-update.http", 11);
    assert_eq!(tokio::task::block_in_place(|| e.send(&next)), 200);
    let got = e.settled(1).await;
    let doc = got[0].json();
    assert_eq!(
        items(&doc, "fileId"),
        [
            ("changed".to_string(), "f1".to_string()),
            ("changed".to_string(), "f2".to_string()),
            ("changed".to_string(), "f3".to_string())
        ],
        "file changes only, in order, over two pages: {doc:#}"
    );
    assert_eq!(doc["events"][1]["removed"], true);
    let rows = tokio::task::block_in_place(|| e.processed(2));
    let a = e.attempts(rows[1]["id"].as_i64().unwrap());
    assert_eq!(
        (a.len(), &a[0]["status"], &a[1]["status"]),
        (2, &json!(75), &json!(0)),
        "{a:#?}"
    );
    // 105 is refused (Drive's 400 naming pageToken): a new start token, nothing announced.
    let rejected = channel_push("google/drive/captures/files-update.http", 12);
    assert_eq!(tokio::task::block_in_place(|| e.send(&rejected)), 200);
    tokio::task::block_in_place(|| e.processed(3));
    let state: Value = serde_json::from_slice(
        &std::fs::read(e.home.path().join("bobbins/drive/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["values"]["page_token"], "100");
    e.settled(1).await;
    e.assert_no_sentinel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_spawn_after_the_running_binary_was_replaced_runs_the_installed_one() {
    // The binary under test, linked to a path of its own (as /usr/bin/hookspool would be).
    let dir = tempfile::tempdir().unwrap();
    let installed = dir.path().join("hookspool");
    if std::fs::hard_link(bin(), &installed).is_err() {
        std::fs::copy(bin(), &installed).unwrap();
    }
    let fake = Fake::start();
    fake.api(gmail_api);
    let e = Env::start_with("gmail", GMAIL_INSTANCE, fake, &installed).await;
    // dpkg's upgrade: the new file is renamed over the old one, whose inode the running
    // process keeps; /proc/<pid>/exe then reads "<path> (deleted)".
    let staged = dir.path().join("hookspool.dpkg-new");
    if std::fs::hard_link(bin(), &staged).is_err() {
        std::fs::copy(bin(), &staged).unwrap();
    }
    std::fs::remove_file(&installed).unwrap();
    std::fs::rename(&staged, &installed).unwrap();
    let exe = std::fs::read_link(format!("/proc/{}/exe", e.p.child.id())).unwrap();
    assert!(
        exe.to_string_lossy().ends_with(" (deleted)"),
        "the precondition: {}",
        exe.display()
    );
    assert_eq!(
        tokio::task::block_in_place(|| e.send(&gmail_push(1000))),
        200
    );
    let rows = tokio::task::block_in_place(|| e.processed(1));
    let a = e.attempts(rows[0]["id"].as_i64().unwrap());
    assert_eq!(a[0]["status"], 0, "{a:#?}");
    let req = captured("google/gmail/captures/push.http");
    assert_eq!(tokio::task::block_in_place(|| e.send(&req)), 200);
    let got = e.settled(1).await;
    assert_eq!(items(&got[0].json(), "id").len(), 3);
}

/// What the Gmail tests prove for Gmail, for Calendar and Drive through `hookspool run`: an
/// expired access token is refreshed, a rotated refresh token is kept and used (the
/// credential file never rewritten), and a 403 from the API is a config-class retry with an
/// issue until the operator's reload, after which the batch is delivered.
async fn google_tokens_rotate_and_a_403_waits_for_the_operator(
    product: &'static str,
    instance: &str,
    api: fn(&Req) -> Resp,
    capture: &str,
    api_path: &str,
) {
    let e = Env::start(product, instance, api).await;
    let cred_before = std::fs::read(&e.cred).unwrap();
    // Access tokens last two seconds, and the first refresh rotates the refresh token.
    {
        let mut t = e.fake.tokens.lock().unwrap();
        t.expires_in = 2;
        t.rotate_next = Some("SENTINEL-rotated-1".into());
    }
    // The baseline (its token fetched with the configured refresh token), then the changes.
    assert_eq!(
        tokio::task::block_in_place(|| e.send(&captured(capture))),
        200
    );
    tokio::task::block_in_place(|| e.processed(1));
    let tokens = e.fake.token_requests();
    assert_eq!(
        tokens
            .first()
            .and_then(|t| t.form("refresh_token"))
            .as_deref(),
        Some(REFRESH),
        "{product}"
    );
    let next = channel_push(capture, 11);
    assert_eq!(tokio::task::block_in_place(|| e.send(&next)), 200);
    e.settled(1).await;
    let first_refresh = e.fake.token_requests().len();
    // Expired by now; the API refuses the next call with 403.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    e.fake.force(
        api_path,
        google_error(
            403,
            "insufficientPermissions",
            "Request had insufficient authentication scopes.",
            "PERMISSION_DENIED",
        ),
    );
    let refused = channel_push(capture, 12);
    assert_eq!(tokio::task::block_in_place(|| e.send(&refused)), 200);
    let fingerprint = format!("config:delivery:script:{product}");
    let until = Instant::now() + WAIT;
    let batch = loop {
        let issues = e.json(&["issues"]);
        let open = issues
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["fingerprint"] == fingerprint.as_str());
        let rows = e.batches(&format!("script:{product}"));
        if let (true, Some(b)) = (open, rows.get(2)) {
            break b.clone();
        }
        assert!(
            Instant::now() < until,
            "{product}: no config issue; log:\n{}",
            e.p.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let id = batch["id"].as_i64().unwrap();
    assert_eq!(batch["state"], "retry", "{product}: {batch:#}");
    let a = e.attempts(id);
    assert_eq!(
        (&a[0]["status"], &a[0]["klass"], &a[0]["counted"]),
        (&json!(78), &json!("config"), &json!(false)),
        "{product}: {a:#?}"
    );
    let tokens = e.fake.token_requests();
    assert!(
        tokens.len() > first_refresh,
        "{product}: the expired access token was refreshed"
    );
    assert_eq!(
        tokens
            .last()
            .and_then(|t| t.form("refresh_token"))
            .as_deref(),
        Some("SENTINEL-rotated-1"),
        "{product}: the rotated refresh token is kept and used"
    );
    // The operator fixes the grant and reloads: the batch is delivered, the issue resolves.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(e.p.child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    tokio::task::block_in_place(|| e.processed(3));
    let issues = e.json(&["issues"]);
    assert!(
        !issues
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["fingerprint"] == fingerprint.as_str()),
        "{product}: resolved by the delivery: {issues:#}"
    );
    assert_eq!(
        std::fs::read(&e.cred).unwrap(),
        cred_before,
        "{product}: the credential file is never written back"
    );
    e.assert_no_sentinel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_run_calendar_tokens_refresh_and_rotate_and_a_403_is_a_config_issue() {
    google_tokens_rotate_and_a_403_waits_for_the_operator(
        "calendar",
        r#"settings = { owner = "owner@example.com", tz = "Europe/Berlin" }
outputs = { changed = "receiver" }
span = "immediate""#,
        calendar_api,
        "google/calendar/captures/events-exists.http",
        "/events",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_run_drive_tokens_refresh_and_rotate_and_a_403_is_a_config_issue() {
    google_tokens_rotate_and_a_403_waits_for_the_operator(
        "drive",
        r#"settings = { owner = "user@example.com" }
outputs = { changed = "receiver" }
span = "immediate""#,
        drive_api,
        "google/drive/captures/files-update.http",
        "/changes",
    )
    .await;
}

/// Issue 29, spec 14.3.6: a deployment's hooks program runs under `hookspool run`, inside
/// the processor's sandbox (which may read and execute that one file): gmail's `classify`
/// answer is the message's first match in the delivered document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_run_gmail_hooks_classify_runs_in_the_sandbox() {
    use std::os::unix::fs::PermissionsExt;
    let hooks = tempfile::tempdir().unwrap();
    let program = hooks.path().join("gmail-hooks.sh");
    std::fs::write(
        &program,
        "#!/bin/sh\ninput=$(cat)\ncase \"$input\" in *ann@example.com*) printf '{\"values\":{\"who\":\"ann\"}}' ;; *) printf null ;; esac\n",
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let instance = GMAIL_INSTANCE.replace(
        "horizon_days = 2 }",
        &format!("horizon_days = 2, hooks = \"{}\" }}", program.display()),
    );
    let e = Env::start("gmail", &instance, gmail_api).await;
    assert_eq!(
        tokio::task::block_in_place(|| e.send(&gmail_push(1000))),
        200
    );
    tokio::task::block_in_place(|| e.processed(1));
    let (_, cap) = capture("google/gmail/captures/push.http");
    let req = hookspool::sources::parse_capture(&cap.request, 0.0).unwrap();
    assert_eq!(tokio::task::block_in_place(|| e.send(&req)), 200);
    let got = e.settled(1).await;
    let doc = got[0].json();
    assert_eq!(doc["events"][0]["id"], "m1", "{doc:#}");
    assert_eq!(
        doc["events"][0]["rules"][0],
        json!({"rule": "hooks/classify", "values": {"who": "ann"}}),
        "{doc:#}\nlog:\n{}",
        e.p.log()
    );
}
