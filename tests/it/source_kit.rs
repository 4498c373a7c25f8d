//! The source kit on a real socket (spec 9, 10, 14.1 "The intake calls, in order"; issue 4):
//! every kit in `kit::signer::all_kits` (THE one list; nothing here picks kits by hand)
//! is configured as a `[sources.<label>]` with its secrets in files, and its requests are
//! turned into real HTTP requests against the intake:
//!
//! signed -> 200 queued and the event stored as the source classifies it; the same again ->
//! 200 duplicate (or queued again when the kit does not dedup); unsigned, wrong secret,
//! tampered (body-signed schemes), stale and future (timestamped schemes) -> 401 with an empty
//! body and nothing stored; a body at max_body_bytes -> 200, one byte over -> 413; chunked ->
//! 411; a signed handshake answered exactly as the source answers it and a badly signed one
//! 401; an unauthenticated handshake answered 200 with every secret file of the source gone
//! (and, as the control, a signed POST then 503); a request the source cannot classify after
//! verify -> 202 quarantined with the raw body and without the auth headers; a spool that
//! cannot take the write -> 503; no secret in any answer or anywhere in the database files;
//! and no secret, body or header sentinel in any log line.
//!
//! Two runs of the same matrix: in-process (one intake per kit, the kit's Plaid key served by
//! an installed fetcher, low free space for the 503, logs captured as JSON through a global
//! subscriber) and the real binary (every kit in one `hookspool intake`, Plaid's key fetched
//! by the real HTTP fetcher from a local stub, HOOKSPOOL_LOG=json at trace level, ENOSPC
//! through HOOKSPOOL_INJECT_FULL). Each (kit, case)
//! prints one line, so a failure names its kit.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hookspool::kit::signer::{Handshake, Kit, all_kits, kit_plaid_jwk};
use hookspool::observe::logging::{LineLayer, SharedBuf, Sink};
use hookspool::sources::plaid::{StaticJwkFetcher, set_fetcher};
use hookspool::sources::{Accepted, Request, SecretSource, SecretsNeeded, Verdict, evaluate};
use hookspool::store::{BatchFilter, BatchRow, EventRow, StoredRequest};
use serde_json::{Value, json};

use super::intake::{Resp, raw, start_in};
use super::intake_proc::Proc;
use super::open;

/// Every kit source gets this cap, so the oversized case stays cheap.
const MAX_BODY: usize = 8192;
/// The configured destination (nothing is delivered here).
const ACTION: &str = "hermes:kit";
const SECRET_SENTINEL: &str = "SENTINEL-SECRET";
const BODY_SENTINEL: &str = "SENTINEL-BODY";
const HEADER_SENTINEL: &str = "SENTINEL-HEADER";
/// Free space no filesystem has: the intake's low-space 503.
const MIN_FREE_UNREACHABLE: &str = "9000000000000000000";

/// Kit `n`'s secret: unique per kit and carrying the sentinel.
fn secret(n: usize) -> String {
    format!("{SECRET_SENTINEL}-{n}-kit")
}

/// Every kit of the one list, each built with its own secret.
fn kits() -> Vec<(usize, Kit)> {
    let count = all_kits(b"count").expect("kits build").len();
    assert!(
        count >= 19,
        "9 built-ins, the v1a-only standard-webhooks, 9 template variants; got {count}"
    );
    (0..count)
        .map(|n| {
            let kit = all_kits(secret(n).as_bytes())
                .expect("kits build")
                .into_iter()
                .nth(n)
                .expect("same list");
            (n, kit)
        })
        .collect()
}

fn wall_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// The kit's sample body with the body sentinel, padded to `size` bytes when asked (the
/// sentinel goes in every body the matrix sends): a JSON object, or for a form kit the form
/// with `note` and `pad` parameters.
fn body(kit: &Kit, n: usize, size: Option<usize>) -> Vec<u8> {
    if kit.content_type == hookspool::sources::body::FORM_MEDIA_TYPE {
        let form = |pad: &str| {
            let mut s = form_urlencoded::Serializer::new(String::new());
            for (k, v) in form_urlencoded::parse(&kit.sample_body) {
                s.append_pair(&k, &v);
            }
            s.append_pair("note", &format!("{BODY_SENTINEL}-{n}"));
            if size.is_some() {
                s.append_pair("pad", pad);
            }
            s.finish().into_bytes()
        };
        let Some(size) = size else {
            return form("");
        };
        let base = form("").len();
        assert!(size >= base, "{}: sample body over {size} bytes", kit.label);
        let out = form(&"p".repeat(size - base));
        assert_eq!(out.len(), size);
        return out;
    }
    let mut v: Value = if kit.sample_body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&kit.sample_body).expect("kit sample bodies are JSON")
    };
    let Value::Object(m) = &mut v else {
        panic!("{}: the harness pads JSON object bodies only", kit.label);
    };
    m.insert("note".into(), Value::from(format!("{BODY_SENTINEL}-{n}")));
    if let Some(size) = size {
        m.insert("pad".into(), Value::from(""));
        let base = v.to_string().len();
        assert!(size >= base, "{}: sample body over {size} bytes", kit.label);
        v["pad"] = Value::from("p".repeat(size - base));
    }
    let out = v.to_string().into_bytes();
    if let Some(size) = size {
        assert_eq!(out.len(), size);
    }
    out
}

fn secrets_dir(home: &Path, kit: &Kit) -> PathBuf {
    home.join("secrets").join(&kit.label)
}

/// Writes the kit's secrets as files (mode 0600) and returns its `[sources.<label>]` table.
fn source_section(home: &Path, kit: &Kit) -> String {
    let name = &kit.label;
    let dir = secrets_dir(home, kit);
    std::fs::create_dir_all(&dir).unwrap();
    let kind = kit.source.declared().kind;
    let mut s = format!("\n[sources.{name}]\ntype = \"{kind}\"\n");
    // The kit carries its source's options, so a new source needs no edit here.
    // Inline values: a nested table (attrs) must not open a section of its own.
    for (k, v) in &kit.options {
        s.push_str(&format!("{k} = {v}\n"));
    }
    for secret_name in kit.source.declared().secrets {
        // A source that needs any one of its secrets (Standard Webhooks) is configured with
        // those its kit holds; every other kit holds every secret its source names.
        let Ok(mut values) = kit.secrets.candidates(secret_name) else {
            assert_eq!(
                kit.source.declared().secrets_needed,
                SecretsNeeded::AnyOne,
                "{name}: the kit holds every secret its source needs"
            );
            continue;
        };
        let value = values.remove(0);
        let path = dir.join(secret_name);
        std::fs::write(&path, &value).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        s.push_str(&format!(
            "secrets.{secret_name} = {{ file = \"{}\" }}\n",
            path.display()
        ));
    }
    s.push_str(&format!(
        "action = \"{ACTION}\"\nmax_body_bytes = {MAX_BODY}\n"
    ));
    s
}

fn write_config(home: &Path, kits: &[&Kit], min_free: &str) {
    let mut cfg =
        format!("[intake]\nlisten = [\"127.0.0.1:0\"]\n\n[limits]\nmin_free_bytes = {min_free}\n");
    for kit in kits {
        cfg.push_str(&source_section(home, kit));
    }
    std::fs::write(home.join("config.toml"), cfg).unwrap();
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The kit's request as bytes on the wire: method, path, query, headers (plus a header
/// sentinel), and the body with Content-Length, or chunked.
fn wire(req: &Request, chunked: bool) -> Vec<u8> {
    let mut target = req.path.clone();
    if !req.query.is_empty() {
        let q: Vec<String> = req
            .query
            .iter()
            .map(|(k, v)| format!("{}={}", pct(k), pct(v)))
            .collect();
        target = format!("{target}?{}", q.join("&"));
    }
    let mut head = format!(
        "{} {target} HTTP/1.1\r\nHost: hooks.test\r\nConnection: close\r\n",
        req.method
    );
    for (k, v) in &req.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("X-Kit-Note: {HEADER_SENTINEL}\r\n"));
    let mut out;
    if chunked {
        head.push_str("Transfer-Encoding: chunked\r\n\r\n");
        out = head.into_bytes();
        out.extend_from_slice(format!("{:x}\r\n", req.body.len()).as_bytes());
        out.extend_from_slice(&req.body);
        out.extend_from_slice(b"\r\n0\r\n\r\n");
    } else {
        head.push_str(&format!("Content-Length: {}\r\n\r\n", req.body.len()));
        out = head.into_bytes();
        out.extend_from_slice(&req.body);
    }
    out
}

/// Sends a HEAD request and reads its answer to EOF: the head only (a HEAD answer's
/// Content-Length describes a body that is never sent).
fn raw_head(addr: SocketAddr, bytes: &[u8]) -> Resp {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(bytes).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer head in {text:?}"));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    Resp {
        status,
        headers: lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect(),
        body: rest.as_bytes().to_vec(),
    }
}

/// An intake the matrix talks to.
struct Target<'a> {
    mode: &'static str,
    addr: SocketAddr,
    db: PathBuf,
    home: &'a Path,
}

/// What the database holds for one source.
struct Stored {
    normal: Vec<(BatchRow, EventRow)>,
    quarantine: Vec<(BatchRow, StoredRequest)>,
}

fn stored(db: &Path, source: &str) -> Stored {
    let s = open(db);
    let mut out = Stored {
        normal: Vec::new(),
        quarantine: Vec::new(),
    };
    let batches = s
        .list_batches(&BatchFilter {
            source: Some(source.to_string()),
            limit: 100_000,
            ..Default::default()
        })
        .unwrap();
    for b in batches {
        if b.destination == "quarantine" {
            for r in s.quarantined_requests(b.id).unwrap() {
                out.quarantine.push((b.clone(), r));
            }
        } else {
            for e in s.events(b.id, true).unwrap() {
                out.normal.push((b.clone(), e));
            }
        }
    }
    out.normal.sort_by_key(|(_, e)| e.id);
    out.quarantine.sort_by_key(|(_, r)| r.event_id);
    out
}

/// One kit's run of the matrix against one intake.
struct Run<'a> {
    t: &'a Target<'a>,
    kit: &'a Kit,
    n: usize,
    secret: String,
    /// Dedup ids the intake has seen for this source, and the events it should hold.
    seen: BTreeSet<String>,
    events: usize,
    quarantined: usize,
}

impl<'a> Run<'a> {
    fn new(t: &'a Target<'a>, kit: &'a Kit, n: usize) -> Self {
        let s = stored(&t.db, &kit.label);
        Run {
            t,
            kit,
            n,
            secret: secret(n),
            seen: BTreeSet::new(),
            events: s.normal.len(),
            quarantined: s.quarantine.len(),
        }
    }

    fn label(&self) -> &str {
        &self.kit.label
    }

    fn send(&self, req: &Request, chunked: bool) -> Resp {
        assert_eq!(
            req.path,
            format!("/hooks/{}", self.kit.label),
            "kit requests go to /hooks/<label>"
        );
        let r = if req.method == "HEAD" {
            raw_head(self.t.addr, &wire(req, chunked))
        } else {
            raw(self.t.addr, &wire(req, chunked))
        };
        // No answer ever carries a secret (a handshake answer is derived, never the value).
        let answer = format!("{:?} {}", r.headers, String::from_utf8_lossy(&r.body));
        assert!(
            !answer.contains(&self.secret),
            "[{}] {}: an answer carries the secret",
            self.t.mode,
            self.label()
        );
        r
    }

    /// Prints the case's line and checks status, the status word and the stored counts.
    fn check(&self, case: &str, r: &Resp, status: u16, word: Option<&str>) {
        let got_word = r.json()["status"].as_str().unwrap_or_default().to_string();
        println!(
            "[{}] {:<18} {:<30} -> {} {}",
            self.t.mode,
            self.label(),
            case,
            r.status,
            got_word
        );
        let ctx = format!("[{}] {} / {case}", self.t.mode, self.label());
        assert_eq!(
            r.status,
            status,
            "{ctx}: {r:?} {}",
            String::from_utf8_lossy(&r.body)
        );
        if let Some(w) = word {
            assert_eq!(got_word, w, "{ctx}: {r:?}");
        }
        if status == 401 {
            assert!(r.body.is_empty(), "{ctx}: a 401 has an empty body: {r:?}");
        }
        let s = stored(&self.t.db, &self.kit.label);
        assert_eq!(s.normal.len(), self.events, "{ctx}: stored events");
        assert_eq!(
            s.quarantine.len(),
            self.quarantined,
            "{ctx}: quarantined requests"
        );
    }

    /// What the source itself makes of a request (the intake must agree).
    fn offline(&self, req: &Request) -> Verdict {
        evaluate(self.kit.source.as_ref(), req, &self.kit.secrets)
    }

    /// A verified, classifiable request: 200 queued (and the event stored as the source
    /// classified it) or 200 duplicate for a dedup id already seen.
    fn accepted(&mut self, case: &str, req: &Request) {
        let Verdict::Accept(a) = self.offline(req) else {
            panic!(
                "{}: the kit's {case} request is not accepted by its own source",
                self.label()
            );
        };
        let duplicate = a.dedup_id.as_ref().is_some_and(|d| self.seen.contains(d));
        let r = self.send(req, false);
        if duplicate {
            self.check(case, &r, 200, Some("duplicate"));
            return;
        }
        if let Some(d) = &a.dedup_id {
            self.seen.insert(d.clone());
        }
        self.events += 1;
        self.check(case, &r, 200, Some("queued"));
        self.check_event(case, &a);
    }

    fn check_event(&self, case: &str, a: &Accepted) {
        let s = stored(&self.t.db, &self.kit.label);
        let (b, e) = s.normal.last().expect("an event");
        let ctx = format!("[{}] {} / {case}", self.t.mode, self.label());
        assert_eq!(b.destination, ACTION, "{ctx}");
        assert_eq!(b.route, self.kit.label, "{ctx}: the implicit route");
        assert_eq!(b.key, a.key, "{ctx}: key");
        assert_eq!(e.source, self.kit.label, "{ctx}");
        assert_eq!(e.event_type, a.event_type, "{ctx}: event type");
        assert_eq!(e.dedup_id, a.dedup_id, "{ctx}: dedup id");
        let payload: Value =
            serde_json::from_str(e.payload.as_deref().expect("payload stored")).unwrap();
        assert_eq!(payload, a.payload, "{ctx}: payload");
    }

    fn refused(&self, case: &str, req: &Request) {
        assert!(
            matches!(self.offline(req), Verdict::Unauthorized),
            "{}: the kit's {case} request is not refused by its own source",
            self.label()
        );
        let r = self.send(req, false);
        self.check(case, &r, 401, None);
    }

    /// A signed request the source fails on after verify, found by trying candidates
    /// through the source (non-JSON body, JSON without the source's fields, each of the
    /// kit's non-auth headers removed).
    fn quarantine_probe(&self, now: f64) -> Option<(Request, &'static str)> {
        let n = self.n;
        let mut candidates = vec![
            self.kit
                .signed(format!("not json {BODY_SENTINEL}-{n}").as_bytes(), now),
            self.kit.signed(
                json!({"note": format!("{BODY_SENTINEL}-{n}")})
                    .to_string()
                    .as_bytes(),
                now,
            ),
        ];
        let auth = &self.kit.source.declared().auth_headers;
        for (h, _) in &self.kit.extra_headers {
            if auth.iter().any(|a| a.eq_ignore_ascii_case(h)) {
                continue;
            }
            let mut r = self.kit.signed(&body(self.kit, n, None), now);
            r.remove_header(h);
            candidates.push(r);
        }
        candidates.into_iter().find_map(|r| match self.offline(&r) {
            Verdict::Quarantine { class } => Some((r, class)),
            _ => None,
        })
    }

    fn hide_secrets(&self) -> PathBuf {
        let dir = secrets_dir(self.t.home, self.kit);
        let away = dir.with_extension("away");
        std::fs::rename(&dir, &away).unwrap();
        away
    }

    fn restore_secrets(&self, away: &Path) {
        std::fs::rename(away, secrets_dir(self.t.home, self.kit)).unwrap();
    }

    /// The whole matrix on a writable spool.
    fn matrix(&mut self) {
        let kit = self.kit;
        let n = self.n;
        let now = wall_now();
        let b = body(kit, n, None);

        // Refused before anything is stored.
        self.refused("unsigned", &kit.unsigned(&b, now));
        self.refused("wrong secret", &kit.wrong_secret(&b, now));
        // Not skips: where the scheme does not cover the body or carries no timestamp, the
        // same requests are accepted, which proves the kit's flag (a source whose credential
        // did cover them would fail here instead of hiding the case).
        if kit.flags.body_signed {
            self.refused("tampered body", &kit.tampered(&b, now));
        } else {
            self.accepted("tampered body, token only", &kit.tampered(&b, now));
        }
        if kit.flags.has_timestamp {
            self.refused("stale", &kit.stale(&b, now));
            self.refused("future-dated", &kit.future(&b, now));
        } else {
            self.accepted("signed long ago, no timestamp", &kit.stale(&b, now));
        }

        // Signed, then the same again.
        let signed = kit.signed(&b, now);
        self.accepted("signed", &signed);
        let before = self.events;
        self.accepted("duplicate", &kit.signed(&b, now));
        assert_eq!(
            self.events > before,
            !kit.flags.dedups,
            "{}: the same request again is a duplicate exactly when the kit dedups",
            self.label()
        );

        // Body cap: at the cap is fine, one byte over is 413 before any source code.
        self.accepted(
            "body at max_body_bytes",
            &kit.signed(&body(kit, n, Some(MAX_BODY)), now),
        );
        let over = kit.signed(&body(kit, n, Some(MAX_BODY + 1)), now);
        let r = self.send(&over, false);
        self.check("oversized (max + 1)", &r, 413, None);
        let r = self.send(&signed, true);
        self.check("chunked", &r, 411, None);

        // Handshakes.
        match kit.flags.handshake {
            Handshake::Signed => {
                let good = kit.handshake(true, now).expect("handshake");
                let Verdict::Answer(want) = self.offline(&good) else {
                    panic!(
                        "{}: the good handshake is not answered offline",
                        self.label()
                    );
                };
                let r = self.send(&good, false);
                self.check("handshake, good signature", &r, want.status, None);
                assert_eq!(r.body, want.body, "{}: the source's answer", self.label());
                let bad = kit.handshake(false, now).expect("handshake");
                self.refused("handshake, bad signature", &bad);
            }
            Handshake::Unauthenticated => {
                let head = kit.handshake(true, now).expect("handshake");
                let away = self.hide_secrets();
                let r = self.send(&head, false);
                self.check("HEAD handshake, no secrets", &r, 200, None);
                assert!(
                    r.body.is_empty(),
                    "{}: a constant, empty answer",
                    self.label()
                );
                // Control: the secrets really are unreadable now.
                let r = self.send(&signed, false);
                self.check("signed POST, no secrets (503)", &r, 503, None);
                self.restore_secrets(&away);
                let r = self.send(&head, false);
                self.check("HEAD handshake, secrets back", &r, 200, None);
            }
            Handshake::None => {}
        }
        if kit.flags.handshake != Handshake::Unauthenticated {
            let mut head = kit.signed(b"", now);
            head.method = "HEAD".into();
            let r = self.send(&head, false);
            self.check("HEAD, no handshake (405)", &r, 405, None);
        }

        // A source error after verify: quarantined with the raw body, minus auth headers.
        match self.quarantine_probe(now) {
            Some((probe, class)) => {
                self.quarantined += 1;
                let r = self.send(&probe, false);
                self.check(
                    &format!("source error ({class})"),
                    &r,
                    202,
                    Some("quarantined"),
                );
                self.check_quarantine(&probe, class);
            }
            // Every source fails on some verified request (a body or a header it needs):
            // a kit without one would hide the quarantine case.
            None => panic!(
                "{}: no signed request this source fails on after verify",
                self.label()
            ),
        }
    }

    fn check_quarantine(&self, probe: &Request, class: &str) {
        let s = stored(&self.t.db, &self.kit.label);
        let (b, q) = s.quarantine.last().expect("a quarantined request");
        let ctx = format!("[{}] {} / quarantine", self.t.mode, self.label());
        assert_eq!(
            (b.state.as_str(), b.key.as_str()),
            ("dead", "quarantine"),
            "{ctx}"
        );
        assert_eq!(
            b.last_class.map(|k| k.as_str()),
            Some("quarantine"),
            "{ctx}"
        );
        assert_eq!(
            b.last_error.as_deref(),
            Some(format!("plugin error: {class}").as_str()),
            "{ctx}"
        );
        assert_eq!(q.raw.as_deref(), Some(probe.body.as_slice()), "{ctx}: raw");
        let headers: serde_json::Map<String, Value> =
            serde_json::from_str(&q.headers).expect("stored headers are a JSON object");
        for name in headers.keys() {
            assert!(
                !self
                    .kit
                    .source
                    .declared()
                    .auth_headers
                    .iter()
                    .any(|a| a.eq_ignore_ascii_case(name)),
                "{ctx}: auth header {name} stored"
            );
        }
        assert!(
            headers.keys().any(|k| k.eq_ignore_ascii_case("x-kit-note")),
            "{ctx}: the other headers are kept: {headers:?}"
        );
        assert!(!q.headers.contains(&self.secret), "{ctx}: secret stored");
        let carried = self
            .kit
            .source
            .declared()
            .auth_headers
            .iter()
            .filter(|a| probe.header(a).is_some())
            .count();
        println!(
            "[{}] {:<18} {:<30} -> {carried} auth header(s) sent, none stored",
            self.t.mode,
            self.label(),
            "quarantine headers"
        );
    }

    /// The spool cannot take the write: a verified request is 503 (never 2xx, never
    /// stored), and so is a quarantine; verification still comes first.
    fn spool_unwritable(&mut self, retry_after: Option<&str>) {
        let kit = self.kit;
        let now = wall_now();
        let b = body(kit, self.n, None);
        let r = self.send(&kit.signed(&b, now), false);
        self.check("spool unwritable: signed", &r, 503, Some("spool_full"));
        assert_eq!(r.header("retry-after"), retry_after, "{}", self.label());
        self.refused("spool unwritable: unsigned", &kit.unsigned(&b, now));
        if let Some((probe, _)) = self.quarantine_probe(now) {
            let r = self.send(&probe, false);
            self.check("spool unwritable: quarantine", &r, 503, Some("spool_full"));
        }
        if kit.flags.handshake == Handshake::Unauthenticated {
            let head = kit.handshake(true, now).expect("handshake");
            let r = self.send(&head, false);
            self.check("spool unwritable: HEAD handshake", &r, 200, None);
        }
    }
}

/// No secret in the database files, while the body sentinels are there (the scan works).
fn assert_no_secret_in_db(db: &Path, kits: &[(usize, &Kit)]) {
    let mut bytes = Vec::new();
    for suffix in ["", "-wal"] {
        let p = PathBuf::from(format!("{}{suffix}", db.display()));
        if let Ok(b) = std::fs::read(&p) {
            bytes.extend_from_slice(&b);
        }
    }
    let has = |needle: &str| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(has(BODY_SENTINEL), "bodies are stored: the scan sees data");
    for (n, kit) in kits {
        assert!(
            !has(&secret(*n)),
            "{}: its secret was written to the database",
            kit.label
        );
    }
}

/// No sentinel in any log line; and the capture holds lines for every source (it works).
fn assert_clean_log(mode: &str, log: &str, kits: &[(usize, &Kit)]) {
    let leaked: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains(SECRET_SENTINEL) || l.contains(BODY_SENTINEL) || l.contains(HEADER_SENTINEL)
        })
        .collect();
    assert!(
        leaked.is_empty(),
        "[{mode}] a sentinel reached the log:\n{}",
        leaked.join("\n")
    );
    for (_, kit) in kits {
        let tag = format!("\"source\":\"{}\"", kit.label);
        let lines = log.lines().filter(|l| l.contains(&tag)).count();
        assert!(
            lines >= 5,
            "[{mode}] {}: only {lines} log lines captured",
            kit.label
        );
    }
    println!("[{mode}] log: {} lines, no sentinel", log.lines().count());
}

/// Every `tracing` record of this test process, as the intake's JSON lines. Installed once,
/// globally, so the intake's writer thread and runtime threads are captured too; lines of
/// other tests running alongside only add to what is checked.
fn captured_logs() -> SharedBuf {
    static BUF: OnceLock<SharedBuf> = OnceLock::new();
    BUF.get_or_init(|| {
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        let buf = SharedBuf::default();
        let filter = tracing_subscriber::filter::Targets::new()
            .with_target("hookspool", tracing::Level::TRACE)
            .with_default(tracing::Level::INFO);
        let layer = LineLayer::new("intake", Sink::Json, Box::new(buf.clone())).with_filter(filter);
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("no other global subscriber in the test binary");
        buf
    })
    .clone()
}

/// The kit's Plaid key, served to every Plaid source built from config. `start_in` lets the
/// intake install its network fetcher first (a process-wide once), so calling this after
/// an intake is ready is final: nothing replaces it later.
fn serve_kit_plaid_key() {
    set_fetcher(Arc::new(StaticJwkFetcher::new(vec![kit_plaid_jwk()])));
}

fn start_in_process(kit: &Kit, min_free: &str) -> super::intake::Running {
    let home = tempfile::tempdir().unwrap();
    write_config(home.path(), &[kit], min_free);
    let running = start_in(home);
    serve_kit_plaid_key();
    running
}

#[test]
fn every_kit_through_the_intake_in_process() {
    let logs = captured_logs();
    let started = Instant::now();
    let kits = kits();
    for (n, kit) in &kits {
        let i = start_in_process(kit, "0");
        let t = Target {
            mode: "in-process",
            addr: i.addr,
            db: i.db(),
            home: i.home.path(),
        };
        Run::new(&t, kit, *n).matrix();
        assert_no_secret_in_db(&t.db, &[(*n, kit)]);
        drop(i);

        let full = start_in_process(kit, MIN_FREE_UNREACHABLE);
        let t = Target {
            mode: "in-process",
            addr: full.addr,
            db: full.db(),
            home: full.home.path(),
        };
        Run::new(&t, kit, *n).spool_unwritable(Some("60"));
    }
    let refs: Vec<(usize, &Kit)> = kits.iter().map(|(n, k)| (*n, k)).collect();
    assert_clean_log("in-process", &logs.text(), &refs);
    println!(
        "[in-process] {} kits in {:?}",
        kits.len(),
        started.elapsed()
    );
}

/// A real HTTP server on 127.0.0.1 that answers every POST with the kit's Plaid key, as
/// Plaid's /webhook_verification_key/get does. Returns its base URL.
fn plaid_key_stub() -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let k = kit_plaid_jwk();
    let body = serde_json::json!({"key": {"kid": k.kid, "alg": k.alg, "kty": k.kty, "crv": k.crv,
        "x": k.x, "y": k.y, "created_at": k.created_at, "expired_at": k.expired_at}})
    .to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = vec![0u8; 16 * 1024];
            let mut got = Vec::new();
            // Read the request head and its Content-Length body.
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got);
                if let Some(end) = text.find("\r\n\r\n") {
                    let len = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if got.len() >= end + 4 + len {
                        break;
                    }
                }
            }
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(resp.as_bytes());
        }
    });
    format!("http://{addr}")
}

#[test]
fn every_kit_through_the_real_binary_with_enospc_and_json_logs() {
    let started = Instant::now();
    let kits = kits();
    // The binary fetches Plaid's key over HTTP: a real local stub answers as Plaid's key
    // endpoint would (HOOKSPOOL_TEST_PLAID_BASE_URL, honoured only in failpoints builds).
    let plaid_stub = plaid_key_stub();
    let served: Vec<(usize, &Kit)> = kits.iter().map(|(n, k)| (*n, k)).collect();
    let home = tempfile::tempdir().unwrap();
    let only: Vec<&Kit> = served.iter().map(|(_, k)| *k).collect();
    write_config(home.path(), &only, "0");
    let flag_dir = tempfile::tempdir().unwrap();
    let full = flag_dir.path().join("full");
    let mut p = Proc::start_in(
        home,
        &[
            ("HOOKSPOOL_LOG", "json".into()),
            ("HOOKSPOOL_LOG_LEVEL", "trace".into()),
            ("HOOKSPOOL_INJECT_FULL", full.display().to_string()),
            ("HOOKSPOOL_TEST_PLAID_BASE_URL", plaid_stub.clone()),
        ],
    );
    p.wait_serving();
    let t = Target {
        mode: "binary",
        addr: p.tcp,
        db: p.db(),
        home: p.home.path(),
    };
    for (n, kit) in &served {
        Run::new(&t, kit, *n).matrix();
    }
    // ENOSPC from the spool for every source, then the same request once it clears. A
    // write that fails for space says when to retry, as the free-space guard does.
    std::fs::write(&full, "").unwrap();
    for (n, kit) in &served {
        Run::new(&t, kit, *n).spool_unwritable(Some("60"));
    }
    std::fs::remove_file(&full).unwrap();
    for (n, kit) in &served {
        let r = raw(
            t.addr,
            &wire(&kit.signed(&body(kit, *n, None), wall_now()), false),
        );
        println!(
            "[binary] {:<18} {:<30} -> {}",
            kit.label, "spool writable again", r.status
        );
        assert_eq!(r.status, 200, "{}: {r:?}", kit.label);
    }
    assert_no_secret_in_db(&t.db, &served);
    p.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(15)).success());
    let log = p.log();
    for line in log.lines() {
        assert!(
            serde_json::from_str::<Value>(line).is_ok(),
            "HOOKSPOOL_LOG=json writes one JSON object per line: {line}"
        );
    }
    assert_clean_log("binary", &log, &served);
    println!("[binary] {} kits in {:?}", served.len(), started.elapsed());
}

/// The vectors the repository carries (tests/vectors).
fn vector(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vectors")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `kit.signed(body)` sent as a form, as GitHub (content type `form`) and Slack send it.
fn signed_form(kit: &Kit, body: &[u8]) -> Request {
    let mut r = kit.signed(body, wall_now());
    r.remove_header("Content-Type");
    r.with_header("Content-Type", hookspool::sources::body::FORM_MEDIA_TYPE)
}

/// Regression: a form-encoded body whose signature verifies was quarantined (202, plugin
/// error BadPayload). Through the real binary: GitHub's `payload=<json>` form (a real
/// delivery's bytes, tests/vectors/github/form-ping.http, under a `push` event) and Slack's
/// slash-command form (Slack's signing example) into a template with `body = "form"` are
/// queued with the decoded payload; a form that is not UTF-8 is quarantined with its raw
/// bytes, never decoded lossily.
#[test]
fn form_encoded_bodies_are_queued_not_quarantined_by_the_real_binary() {
    let mut github = Kit::builtin("github", format!("{SECRET_SENTINEL}-gh").as_bytes()).unwrap();
    github.extra_headers = vec![
        ("X-GitHub-Event".into(), "push".into()),
        ("X-GitHub-Delivery".into(), "form-delivery-1".into()),
    ];
    let slack = Kit::template(
        "slack",
        "scheme = \"hmac-sha256-hex\"\nheader = \"X-Signature\"\nbody = \"form\"\n\
         key = [\"payload.team_id\", \"payload.channel_id\"]\nevent_type = \"payload.command\"",
        format!("{SECRET_SENTINEL}-slack").as_bytes(),
    )
    .unwrap();
    let home = tempfile::tempdir().unwrap();
    let mut cfg = String::from("[intake]\nlisten = [\"127.0.0.1:0\"]\n");
    for kit in [&github, &slack] {
        // The real GitHub form is 9 KiB: above the matrix's cap.
        cfg.push_str(&source_section(home.path(), kit).replace(
            &format!("max_body_bytes = {MAX_BODY}"),
            "max_body_bytes = 65536",
        ));
    }
    std::fs::write(home.path().join("config.toml"), cfg).unwrap();
    let p = Proc::start_in(home, &[]);
    p.wait_serving();
    let db = p.db();

    let capture = vector("github/form-ping.http");
    let (_, gh_body) = capture.split_once("\r\n\r\n").expect("capture body");
    let r = raw(
        p.tcp,
        &wire(&signed_form(&github, gh_body.as_bytes()), false),
    );
    assert_eq!(
        (r.status, r.json()["status"].clone()),
        (200, json!("queued")),
        "{r:?}"
    );
    let s = stored(&db, "github");
    assert!(s.quarantine.is_empty(), "nothing quarantined");
    let (b, e) = s.normal.last().expect("the event");
    assert_eq!(b.key, "meejah/AutobahnPython:push");
    let payload: Value = serde_json::from_str(e.payload.as_deref().unwrap()).unwrap();
    assert_eq!(payload["zen"], "Approachable is better than simple.");
    assert_eq!(e.dedup_id.as_deref(), Some("form-delivery-1"));

    let slack_vec: Value = serde_json::from_str(&vector("slack/vectors.json")).unwrap();
    let slack_body = slack_vec["vectors"][0]["body"].as_str().unwrap();
    let r = raw(
        p.tcp,
        &wire(&signed_form(&slack, slack_body.as_bytes()), false),
    );
    assert_eq!(
        (r.status, r.json()["status"].clone()),
        (200, json!("queued")),
        "{r:?}"
    );
    let s = stored(&db, "slack");
    let (b, e) = s.normal.last().expect("the event");
    assert_eq!(b.key, "T1DC2JH3J:G8PSS9T3V");
    assert_eq!(e.event_type, "/webhook-collect");
    let payload: Value = serde_json::from_str(e.payload.as_deref().unwrap()).unwrap();
    assert_eq!(payload["user_name"], "roadrunner");
    assert_eq!(payload["text"], "");

    // Not UTF-8 once decoded: quarantined with the raw bytes.
    let bad = b"team_id=T1&channel_id=%FF";
    let r = raw(p.tcp, &wire(&signed_form(&slack, bad), false));
    assert_eq!(
        (r.status, r.json()["status"].clone()),
        (202, json!("quarantined")),
        "{r:?}"
    );
    let s = stored(&db, "slack");
    let (b, q) = s.quarantine.last().expect("quarantined");
    assert_eq!(b.last_error.as_deref(), Some("plugin error: BadForm"));
    assert_eq!(q.raw.as_deref(), Some(&bad[..]));
    println!("[binary] github form, slack form -> 200 queued; non-UTF-8 form -> 202 quarantined");
}

/// `hookspool check` on the sources whose secrets are each optional (standard-webhooks:
/// `secret` for v1, `public_key` for v1a): one of them is enough, none is an error that
/// names both and what to write; an ordinary source still needs its secret.
#[test]
fn check_takes_a_v1a_only_standard_webhooks_source_and_refuses_one_with_no_secret() {
    let home = tempfile::tempdir().unwrap();
    let key = home.path().join("public_key");
    std::fs::write(&key, hookspool::kit::signer::kit_v1a_public_key(b"check")).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cfg = format!(
        "[sources.v1a]\ntype = \"standard-webhooks\"\nsecrets.public_key = {{ file = \"{}\" }}\naction = \"{ACTION}\"\n\n\
         [sources.neither]\ntype = \"standard-webhooks\"\naction = \"{ACTION}\"\n\n\
         [sources.chat]\ntype = \"slack\"\naction = \"{ACTION}\"\n",
        key.display()
    );
    std::fs::write(home.path().join("config.toml"), cfg).unwrap();
    let out = std::process::Command::new(super::bin())
        .arg("--home")
        .arg(home.path())
        .arg("check")
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("error:") && l.contains("sources.v1a")),
        "one secret is enough: {text}"
    );
    assert!(
        text.contains(
            "sources.neither.secrets: the standard-webhooks source needs at least one of the secrets secret, public_key; write secrets.secret = {"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "sources.chat.secrets.signing_secret: the slack source needs secret signing_secret"
        ),
        "{text}"
    );
}
