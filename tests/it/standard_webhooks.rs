//! An http destination's deliveries verify at a Standard Webhooks receiver (issue 12, "Real
//! receivers"). The receiver here is a real HTTP server that answers 204 only to a request
//! that verifies exactly as the reference library does (standard-webhooks/standard-webhooks,
//! libraries/python/standardwebhooks/webhooks.py, `Webhook.__init__` and `verify`, read for
//! this test and implemented independently below), and 401 otherwise:
//!
//! * a string secret loses its `whsec_` prefix and is base64-decoded, padding optional;
//! * `webhook-id`, `webhook-timestamp` and `webhook-signature` are required (any case);
//! * the timestamp is within five minutes of now, either way;
//! * the signed content is `<id>.<floor(timestamp)>.<body as UTF-8>`, HMAC-SHA256;
//! * the signature header holds space-separated `<version>,<base64>` entries; only `v1`
//!   entries count, and one must equal the expected MAC (compared in constant time).
//!
//! The secret comes from `hookspool secret new`, the delivery from the real `hookspool run`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{KeyInit, Mac};

use super::bin;
use super::intake::{raw, request};
use super::receiver::{Answer, Receiver, Recorded};
use super::run_e2e::{RunProc, free_port};

const SOURCE_SECRET: &str = "standard-webhooks-source-secret";
/// The reference library's tolerance.
const TOLERANCE_S: f64 = 300.0;

/// Why a request does not verify, as the reference library would raise.
#[derive(Debug, PartialEq)]
enum Refused {
    MissingHeaders,
    BadTimestamp,
    TooOld,
    TooNew,
    NoMatchingSignature,
    BadSecret,
}

/// The reference's base64 decoding of a string secret: non-alphabet characters are
/// discarded (Python's non-validating `b64decode`) and padding is optional.
fn reference_key(secret: &str) -> Result<Vec<u8>, Refused> {
    let s = secret.strip_prefix("whsec_").unwrap_or(secret);
    let kept: String = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '+' || *c == '/')
        .collect();
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    let key = lenient.decode(kept).map_err(|_| Refused::BadSecret)?;
    if key.is_empty() {
        return Err(Refused::BadSecret);
    }
    Ok(key)
}

fn reference_verify(secret: &str, r: &Recorded, now: f64) -> Result<(), Refused> {
    let key = reference_key(secret)?;
    let (Some(id), Some(ts), Some(sigs)) = (
        r.header("webhook-id"),
        r.header("webhook-timestamp"),
        r.header("webhook-signature"),
    ) else {
        return Err(Refused::MissingHeaders);
    };
    if id.is_empty() || ts.is_empty() || sigs.is_empty() {
        return Err(Refused::MissingHeaders);
    }
    let t: f64 = ts.trim().parse().map_err(|_| Refused::BadTimestamp)?;
    if t < now - TOLERANCE_S {
        return Err(Refused::TooOld);
    }
    if t > now + TOLERANCE_S {
        return Err(Refused::TooNew);
    }
    let body = std::str::from_utf8(&r.body).map_err(|_| Refused::NoMatchingSignature)?;
    let signed = format!("{id}.{}.{body}", t.floor() as i64);
    for entry in sigs.split(' ') {
        let Some((version, sig)) = entry.split_once(',') else {
            continue;
        };
        if version != "v1" {
            continue;
        }
        let Ok(given) = base64::engine::general_purpose::STANDARD.decode(sig) else {
            continue;
        };
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
        mac.update(signed.as_bytes());
        if mac.verify_slice(&given).is_ok() {
            return Ok(());
        }
    }
    Err(Refused::NoMatchingSignature)
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn hs(home: &Path, args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .output()
        .unwrap()
}

fn write_config(home: &Path, port: u16, url: &str, dest_secret: &Path) {
    std::fs::write(home.join("source.secret"), SOURCE_SECRET).unwrap();
    let text = format!(
        r#"
[intake]
listen = "127.0.0.1:{port}"
[limits]
min_free_bytes = 0
[dispatch]
poll_s = 0.2
[alerts]
argv = ["/bin/true"]
[sources.hooks]
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.topic"
action = "http-recv"
secrets.secret = {{ file = "{home}/source.secret" }}
[destinations.http-recv]
type = "http"
url = "{url}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
timeout_s = 10
secret = {{ file = "{secret}" }}
"#,
        home = home.display(),
        secret = dest_secret.display()
    );
    std::fs::write(home.join("config.toml"), text).unwrap();
}

#[test]
fn a_reference_receiver_accepts_what_hookspool_signs_with_a_secret_from_secret_new() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let secret = home.join("dest.secret");

    // `secret new`: a whsec_ secret of 32 bytes, mode 0600, never replaced.
    let out = hs(&home, &["secret", "new", &secret.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value = std::fs::read_to_string(&secret).unwrap();
    let value = value.trim_end();
    assert!(value.starts_with("whsec_"), "a Standard Webhooks secret");
    assert_eq!(reference_key(value).unwrap().len(), 32);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(value),
        "the secret is never printed"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let again = hs(&home, &["secret", "new", &secret.display().to_string()]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("is kept as it is"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(std::fs::read_to_string(&secret).unwrap().trim_end(), value);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let rx = rt.block_on(Receiver::start());
    let receiver_secret = value.to_string();
    rx.set_rule(move |r| {
        Some(match reference_verify(&receiver_secret, r, now_s()) {
            Ok(()) => Answer::status(204),
            Err(_) => Answer::status(401),
        })
    });
    let port = free_port();
    write_config(&home, port, &rx.url(), &secret);
    let check = hs(&home, &["check"]);
    assert!(
        check.status.success(),
        "check passes a secret from secret new:\n{}",
        String::from_utf8_lossy(&check.stdout)
    );

    let mut run = RunProc::start(&home, format!("127.0.0.1:{port}").parse().unwrap(), &[]);
    let body = br#"{"topic":"t1","n":1}"#;
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(SOURCE_SECRET.as_bytes()).unwrap();
    m.update(body);
    let sig = format!("sha256={}", hex::encode(m.finalize().into_bytes()));
    let r = raw(
        run.addr,
        &request(
            "POST",
            "/hooks/hooks",
            &[("X-Signature", &sig), ("Content-Type", "application/json")],
            body,
        ),
    );
    assert_eq!(r.status, 200, "{}", run.log());
    let got = rt.block_on(rx.wait_for(1, Duration::from_secs(20)));
    assert_eq!(got.len(), 1, "one delivery; log:\n{}", run.log());
    assert_eq!(reference_verify(value, &got[0], now_s()), Ok(()));
    // The receiver's check means something: another secret, or a stale clock, is refused.
    let other = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    assert_eq!(
        reference_verify(other, &got[0], now_s()),
        Err(Refused::NoMatchingSignature)
    );
    assert_eq!(
        reference_verify(value, &got[0], now_s() + 3600.0),
        Err(Refused::TooOld)
    );
    // The 204 was taken as delivered: no second attempt.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(rx.requests().len(), 1, "log:\n{}", run.log());
    run.sigterm();
    assert!(run.wait_exit(Duration::from_secs(20)).success());

    // A secret that is not one (the README's old `openssl rand -hex 32`) is refused by
    // check, with the command that makes one.
    std::fs::write(home.join("hex.secret"), "3f".repeat(32)).unwrap();
    write_config(&home, port, &rx.url(), &home.join("hex.secret"));
    let check = hs(&home, &["check"]);
    assert_eq!(check.status.code(), Some(2));
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(
        text.contains("destinations.\"http-recv\".secret: not a Standard Webhooks secret")
            && text.contains("hookspool secret new <file>"),
        "{text}"
    );
    // And the reference receiver would have refused its signatures: it decodes the hex
    // text as base64 into another key.
    assert_ne!(
        reference_key(&"3f".repeat(32)).unwrap(),
        "3f".repeat(32).into_bytes()
    );
}
