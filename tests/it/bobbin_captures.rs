//! Every capture of every built-in bobbin through the real binary: one config with an
//! instance of each bobbin (its captures/kit.toml, the test secrets in files) under
//! `hookspool run`, each capture sent over a real socket at its own time, and the answer
//! each `# expect:` line says; a copy of each accepted capture with one byte changed where
//! its credential covers it is refused 401. Also the documents' frontmatter and the
//! provider URL rule, checked independently of the kit.
//!
//! Time: a timestamped capture (Slack, Stripe, Zoom, Plaid, Standard Webhooks) was signed
//! at its `# at:` time and cannot be re-signed (the capture must stay the provider's), so
//! the binary runs with `HOOKSPOOL_TEST_CLOCK_OFFSET_FILE` (honoured only in `failpoints`
//! builds): the test writes `at - now` there before sending each capture. Plaid's key
//! service is a local stub serving the bobbin's own `[stub.webhook_verification_key]`
//! (`HOOKSPOOL_TEST_PLAID_BASE_URL`, failpoints builds only).
//!
//! Must not: read anything outside the checkout.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use hookspool::kit::capture::{Capture, Expect, KitFile, Verdict as Want};
use hookspool::kit::signer::Kit as Signer;
use hookspool::sources::{self, Request};

use super::bobbins_run::wire;
use super::intake::{Resp, raw};
use super::run_e2e::{RunProc, reserved_port};

fn bobbins_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/bobbins"))
}

/// Every bobbin directory (`<vendor>/<product>/` holding a bobbin.toml), sorted.
/// Every built-in webhook bobbin. A poll bobbin (spec 14.4: `[poll]`) has no URL and no
/// request captures; its kit rows are tested in `polls.rs`.
fn bobbin_dirs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for vendor in sorted_dirs(&bobbins_root()) {
        for product in sorted_dirs(&vendor) {
            let manifest = product.join("bobbin.toml");
            if manifest.is_file() && !read_toml(&manifest).contains_key("poll") {
                out.push(product);
            }
        }
    }
    out
}

fn sorted_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    v
}

fn read_toml(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read_kit(captures: &Path) -> KitFile {
    let file = captures.join("kit.toml");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    KitFile::parse("kit.toml", &text).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The `.http` captures directly in a kit's directory, parsed.
fn captures(dir: &Path) -> Vec<(String, Capture)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("http"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let name = p
                .strip_prefix(bobbins_root())
                .unwrap()
                .display()
                .to_string();
            let text = std::fs::read_to_string(p).unwrap();
            let cap = Capture::parse(&name, &text).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            (name, cap)
        })
        .collect()
}

fn wall_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Where a capture's credential is, as the source kit knows it (for the tamper copy).
struct Credential {
    body_signed: bool,
    auth_headers: Vec<String>,
    /// JSON body fields holding the credential (a signature inside the body).
    auth_fields: Vec<String>,
    /// The source answers its handshake before verification (a constant or the sender's
    /// own text): such an answer has no credential to tamper with.
    challenge_unauthenticated: bool,
}

/// The credential facts of the source `instance` of the expanded config.
fn credential(config: &hookspool::config::Config, instance: &str) -> Credential {
    let sc = &config.sources[instance];
    let signer = if sc.kind == "template" {
        Signer::template(instance, &toml::to_string(&sc.options).unwrap(), b"flags")
    } else {
        Signer::builtin(&sc.kind, b"flags")
    }
    .unwrap_or_else(|e| panic!("{instance}: {e}"));
    Credential {
        body_signed: signer.flags.body_signed,
        auth_headers: signer.source.declared().auth_headers.clone(),
        auth_fields: signer.source.declared().auth_fields.clone(),
        challenge_unauthenticated: signer.source.declared().challenge_unauthenticated,
    }
}

/// A copy with one byte changed where the credential covers it: the body for a signature,
/// else the token (an auth header's value, or the query's values).
fn tampered(req: &Request, c: &Credential) -> Request {
    let mut r = req.clone();
    let flip = |v: &mut String| {
        let last = v.pop().unwrap_or('x');
        v.push(if last == 'x' { 'y' } else { 'x' });
    };
    if c.body_signed {
        let mid = r.body.len() / 2;
        r.body[mid] ^= 0x01;
        return r;
    }
    let mut changed = false;
    for (k, v) in r.headers.iter_mut() {
        if c.auth_headers.iter().any(|a| a.eq_ignore_ascii_case(k)) {
            flip(v);
            changed = true;
        }
    }
    // A signature inside the JSON body (Mailgun): one hex digit of that field's value.
    if !changed && let Some(path) = c.auth_fields.first() {
        let value = serde_json::from_slice::<serde_json::Value>(&r.body)
            .ok()
            .and_then(|d| {
                path.split('.')
                    .try_fold(&d, |v, s| v.get(s))
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| panic!("no {path} field in the body"));
        let quoted = format!("\"{value}\"");
        let at = r
            .body
            .windows(quoted.len())
            .position(|w| w == quoted.as_bytes())
            .expect("the field's value in the body");
        let i = at + 1;
        r.body[i] = if r.body[i] == b'0' { b'1' } else { b'0' };
        changed = true;
    }
    if !changed {
        for (_, v) in r.query.iter_mut() {
            flip(v);
        }
    }
    r
}

/// A real HTTP server on 127.0.0.1 answering every POST with `key`, as Plaid's
/// /webhook_verification_key/get does. Returns its base URL.
fn plaid_key_stub(key: serde_json::Value) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let body = serde_json::json!({ "key": key }).to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut got = Vec::new();
            let mut buf = [0u8; 8192];
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
                                .and_then(|v| v.trim().parse::<usize>().ok())
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

/// Checks one answer against a capture's `# expect:` lines (the intake-level ones: verdict
/// as the answer shows it, status, body members).
fn check_answer(name: &str, cap: &Capture, r: &Resp) {
    for (e, line) in &cap.expects {
        let at = format!("{name}:{line}");
        match e {
            Expect::Status(s) => assert_eq!(r.status, *s, "{at}: status; {:?}", r.json()),
            Expect::Verdict(Want::Accepted) => {
                assert_eq!(r.status, 200, "{at}: {:?}", r.json());
                let word = r.json()["status"].as_str().unwrap_or_default().to_string();
                // A source with an accepted_reply (Discord's deferred response) answers its
                // own body once stored; such a capture says what, in body.* lines.
                let own_reply = cap
                    .expects
                    .iter()
                    .any(|(e, _)| matches!(e, Expect::Body(..)))
                    && r.json().get("status").is_none();
                assert!(
                    word == "queued" || word == "duplicate" || own_reply,
                    "{at}: accepted, answered {word:?}"
                );
            }
            Expect::Verdict(Want::Unauthorized) => assert_eq!(r.status, 401, "{at}"),
            Expect::Verdict(Want::Ignored) => {
                assert_eq!(r.json()["status"], "ignored", "{at}: {:?}", r.json())
            }
            Expect::Verdict(Want::Quarantined) => assert_eq!(r.status, 202, "{at}"),
            Expect::Body(path, want) => {
                let doc = r.json();
                let got = path.iter().try_fold(&doc, |d, k| d.get(k));
                let want = serde_json::to_value(want).unwrap();
                assert_eq!(got, Some(&want), "{at}: body.{}", path.join("."));
            }
            // What the source classified (key, event_type, dedup_id, attrs) is not in an
            // answer: the kit's source-kit row checks those through the same source.
            _ => {}
        }
    }
}

#[test]
fn every_builtin_capture_through_the_real_binary_at_its_own_time() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let secrets = dir.path().join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    let port = reserved_port();
    let mut text = format!(
        "[intake]\nlisten = \"127.0.0.1:{port}\"\n\n[limits]\nmin_free_bytes = 0\n\n[dispatch]\npoll_s = 60\n\n"
    );
    let mut kits = Vec::new();
    let mut plaid_key = None;
    for bobbin in bobbin_dirs() {
        let kit = read_kit(&bobbin.join("captures"));
        let mut instance = kit.bobbin.clone();
        let mut refs = toml::Table::new();
        for (name, value) in &kit.secrets {
            let file = secrets.join(format!("{}_{name}", kit.instance));
            std::fs::write(&file, value).unwrap();
            let mut r = toml::Table::new();
            r.insert("file".into(), file.display().to_string().into());
            refs.insert(name.clone(), toml::Value::Table(r));
        }
        instance.insert("secrets".into(), toml::Value::Table(refs));
        let mut root = toml::Table::new();
        let mut bobbins = toml::Table::new();
        bobbins.insert(kit.instance.clone(), toml::Value::Table(instance));
        root.insert("bobbins".into(), toml::Value::Table(bobbins));
        text.push_str(&toml::to_string(&root).unwrap());
        text.push('\n');
        if let Some(k) = &kit.stub.webhook_verification_key {
            plaid_key = Some(serde_json::to_value(k).unwrap());
        }
        kits.push((bobbin, kit));
    }
    assert!(kits.len() >= 15, "found {} bobbins", kits.len());
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("config.toml"), &text).unwrap();
    // The binary's own config pipeline decides the sources; the same one tells the test
    // where each credential is.
    let inputs = hookspool::config::PathInputs {
        home_flag: Some(home.clone()),
        ..Default::default()
    };
    let (config, _) = hookspool::config::parse(&text, None, &inputs, false)
        .unwrap_or_else(|e| panic!("the kits' config: {e:?}"));
    let offset = dir.path().join("clock-offset");
    std::fs::write(&offset, "0").unwrap();
    let stub = plaid_key_stub(plaid_key.expect("plaid.items has a stub key"));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let p = RunProc::start(
        &home,
        addr,
        &[
            ("HOOKSPOOL_TEST_CLOCK_OFFSET_FILE", offset.to_str().unwrap()),
            ("HOOKSPOOL_TEST_PLAID_BASE_URL", &stub),
        ],
    );
    let mut sent = 0;
    for (bobbin, kit) in &kits {
        let cred = credential(&config, &kit.instance);
        let mut accepted = 0;
        for (name, cap) in captures(&bobbin.join("captures")) {
            // Sent at its own time: the intake's clock reads the wall clock plus this.
            let at = cap.at.map(|a| a as f64);
            std::fs::write(
                &offset,
                format!("{}", at.map(|a| a - wall_now()).unwrap_or(0.0)),
            )
            .unwrap();
            let req = sources::parse_capture(&cap.request, at.unwrap_or(0.0))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(req.path, format!("/hooks/{}", kit.instance), "{name}");
            let r = raw(addr, &wire(&req));
            check_answer(&name, &cap, &r);
            let signed_answer =
                cap.verdict() == Some(Want::Challenge) && !cred.challenge_unauthenticated;
            if cap.verdict() == Some(Want::Accepted) || signed_answer {
                let t = raw(addr, &wire(&tampered(&req, &cred)));
                assert_eq!(
                    t.status,
                    401,
                    "{name}: a one-byte-tampered copy; {}",
                    p.log()
                );
                accepted += usize::from(cap.verdict() == Some(Want::Accepted));
            }
            sent += 1;
        }
        assert!(accepted >= 1, "{}: no accepted capture", bobbin.display());
    }
    assert!(sent >= 50, "only {sent} captures");
}

/// The YAML frontmatter a document opens with (spec 14.3.2), as (key, value) lines.
fn frontmatter(text: &str) -> Vec<(String, String)> {
    let Some(rest) = text.strip_prefix("---\n") else {
        return Vec::new();
    };
    let Some((head, _)) = rest.split_once("\n---\n") else {
        return Vec::new();
    };
    head.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A provider page: https on a public host, not an example/test host, an IP or a placeholder.
fn provider_url_ok(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("https://") else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let reserved = [
        ".example",
        ".test",
        ".invalid",
        ".localhost",
        "example.com",
        "example.org",
        "example.net",
    ];
    !host.is_empty()
        && host.contains('.')
        && !host
            .split('.')
            .all(|p| p.bytes().all(|b| b.is_ascii_digit()))
        && !reserved
            .iter()
            .any(|r| host.ends_with(r) || host == &r[1..])
        && !url.contains("TODO")
        && !url.contains('<')
        && !url.contains("...")
}

#[test]
fn every_bobbin_documents_itself() {
    for dir in bobbin_dirs() {
        let manifest = read_toml(&dir.join("bobbin.toml"));
        let name = manifest["name"].as_str().expect("name");
        let provider = manifest["provider"].as_table().expect("[provider]");
        let field = |k: &str| provider.get(k).and_then(toml::Value::as_str);
        for k in ["homepage", "webhook_docs", "signature_docs", "api_docs"] {
            if let Some(url) = field(k) {
                assert!(provider_url_ok(url), "{name}: provider.{k} = {url}");
            }
        }
        assert!(field("signature_docs").is_some(), "{name}: signature_docs");
        if manifest.get("processor").is_some() {
            assert!(
                field("api_docs").is_some(),
                "{name}: a processor needs api_docs"
            );
        }
        let want = vec![
            ("bobbin".to_string(), name.to_string()),
            (
                "provider".to_string(),
                format!(
                    "{} {}",
                    field("vendor").expect("vendor"),
                    field("product").expect("product")
                ),
            ),
            (
                "webhook_docs".to_string(),
                field("webhook_docs").expect("webhook_docs").to_string(),
            ),
        ];
        let instance = read_kit(&dir.join("captures")).instance;
        let secrets: Vec<String> = manifest
            .get("secrets")
            .and_then(toml::Value::as_table)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        let required: Vec<String> = manifest
            .get("settings")
            .and_then(toml::Value::as_table)
            .map(|t| {
                t.iter()
                    .filter(|(_, v)| v.get("required").and_then(toml::Value::as_bool) == Some(true))
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default();
        for doc in ["README.md", "SETUP.md", "AGENTS.md"] {
            let path = dir.join(doc);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(frontmatter(&text), want, "{}: frontmatter", path.display());
            if doc == "README.md" {
                assert!(
                    text.contains("## Captures"),
                    "{}: no Captures section",
                    path.display()
                );
                continue;
            }
            assert!(
                text.contains(&format!("[bobbins.{instance}]")),
                "{}: no [bobbins.{instance}] table",
                path.display()
            );
            for s in secrets.iter().chain(&required) {
                assert!(
                    text.contains(&format!("`{s}`"))
                        || text.contains(&format!("{s} ="))
                        || text.contains(&format!("secrets.{s}")),
                    "{}: {s} not mentioned",
                    path.display()
                );
            }
            if doc == "AGENTS.md" {
                assert!(
                    text.contains("## Needs from the human"),
                    "{}",
                    path.display()
                );
                assert!(
                    text.contains("\n1. **"),
                    "{}: no numbered steps",
                    path.display()
                );
                assert!(
                    text.contains("(outward)"),
                    "{}: no outward step",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn provider_url_rule_refuses_what_spec_14_3_2_refuses() {
    assert!(provider_url_ok("https://docs.github.com/en/webhooks"));
    for bad in [
        "http://docs.github.com/en/webhooks",
        "https://example.com/webhooks",
        "https://docs.example.org/x",
        "https://hooks.test/x",
        "https://192.0.2.1/docs",
        "https://localhost/docs",
        "https://TODO/docs",
        "https://<vendor>.com/docs",
    ] {
        assert!(!provider_url_ok(bad), "{bad}");
    }
}
