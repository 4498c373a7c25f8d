//! Google Pub/Sub push with its OIDC ID token, through the real `hookspool intake` binary:
//! the `gmail` source with `audience` set fetches Google's published keys (here a stub JWKS
//! server on 127.0.0.1 answering the documented shape of
//! https://www.googleapis.com/oauth2/v3/certs, admitted through the egress policy with
//! `jwks_allow_private`), checks the RS256 signature, `iss`, `aud`, `email` and
//! `email_verified`, `exp` and `iat`. Google publishes no signed token to use as a vector:
//! the key pair is generated here and every token is CONSTRUCTED (see
//! tests/vectors/google-pubsub/SOURCE.md).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::signature::KeyPair as _;
use base64::Engine as _;

use super::intake::{config, events, request};
use super::intake_proc::Proc;

fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// An RSA key pair as Google's token signer has one, with its kid.
pub(super) struct GoogleKey {
    kp: aws_lc_rs::rsa::KeyPair,
    kid: String,
}

impl GoogleKey {
    pub(super) fn new(kid: &str) -> GoogleKey {
        GoogleKey {
            kp: aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap(),
            kid: kid.to_string(),
        }
    }

    /// The key as https://www.googleapis.com/oauth2/v3/certs lists it.
    pub(super) fn jwk(&self) -> serde_json::Value {
        let pk = self.kp.public_key();
        serde_json::json!({
            "alg": "RS256",
            "kty": "RSA",
            "use": "sig",
            "kid": self.kid,
            "n": b64url(pk.modulus().big_endian_without_leading_zero()),
            "e": b64url(pk.exponent().big_endian_without_leading_zero()),
        })
    }

    /// A compact RS256 JWS over `claims`, signed by aws-lc-rs.
    pub(super) fn token(&self, claims: &serde_json::Value) -> String {
        let head = serde_json::json!({"alg": "RS256", "kid": self.kid, "typ": "JWT"});
        let input = format!(
            "{}.{}",
            b64url(head.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let mut sig = vec![0u8; self.kp.public_modulus_len()];
        self.kp
            .sign(
                &aws_lc_rs::signature::RSA_PKCS1_SHA256,
                &aws_lc_rs::rand::SystemRandom::new(),
                input.as_bytes(),
                &mut sig,
            )
            .unwrap();
        format!("{input}.{}", b64url(&sig))
    }
}

/// A real HTTP server on 127.0.0.1 answering every GET with `body` (a JWK Set), counting
/// the requests. One thread, one request per connection (`Connection: close`).
pub(super) struct JwksStub {
    pub(super) port: u16,
    pub(super) hits: Arc<AtomicUsize>,
}

impl JwksStub {
    pub(super) fn start(body: String) -> JwksStub {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut s) = conn else { continue };
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let ok = buf.starts_with(b"GET /oauth2/v3/certs ");
                h.fetch_add(1, Ordering::SeqCst);
                let (status, body) = if ok {
                    ("200 OK", body.as_str())
                } else {
                    ("404 Not Found", "{}")
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Type: application/json; charset=UTF-8\r\nCache-Control: public, max-age=21600, must-revalidate, no-transform\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        JwksStub { port, hits }
    }
}

pub(super) const AUD: &str = "https://hooks.example.org/hooks/gm";
const SA: &str = "gmail-push@my-project.iam.gserviceaccount.com";
/// The push token in the URL: a sentinel, so a leak of the query string shows.
const PUSH_TOKEN: &str = "SENTINEL-QUERY-TOKEN-5d1e";

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The claims of a Pub/Sub push token (Google's documented example, "Authentication for push
/// subscriptions"), with a sentinel in `sub`.
pub(super) fn claims() -> serde_json::Value {
    serde_json::json!({
        "aud": AUD,
        "azp": "SENTINEL-AZP-113774264463038321964",
        "email": SA,
        "email_verified": true,
        "exp": now() + 3590,
        "iat": now() - 10,
        "iss": "https://accounts.google.com",
        "sub": "SENTINEL-SUB-113774264463038321964",
    })
}

fn push_body(n: u32) -> Vec<u8> {
    let data = base64::engine::general_purpose::STANDARD
        .encode(br#"{"emailAddress":"user@example.com","historyId":"9876543210"}"#);
    format!(
        r#"{{"message":{{"attributes":{{"SENTINEL-ATTR":"SENTINEL-BODY-{n}"}},"data":"{data}","messageId":"213689401{n}","publishTime":"2021-02-26T19:13:55.749Z"}},"subscription":"projects/myproject/subscriptions/mysubscription"}}"#
    )
    .into_bytes()
}

/// A good token is accepted and enqueued; a wrong audience, a wrong issuer, an expired
/// token, a tampered signature, an unknown kid and a missing token are each refused with
/// 401 and a `rejected` log line naming the source, and none is enqueued; the unknown kid
/// causes no second fetch inside the minute's guard; no sentinel from a token, the body or
/// the query string reaches the log.
#[test]
fn intake_google_pubsub_push_oidc_token_verified_against_the_published_keys() {
    let key = GoogleKey::new("f5f4bf46e52b31d9b6249f7309ad0338400680cd");
    let stranger = GoogleKey::new("0000000000000000000000000000000000000000");
    let set = serde_json::json!({"keys": [GoogleKey::new("6f7254101f56e41cf35c9926de84a2d552b4c6f1").jwk(), key.jwk()]});
    let stub = JwksStub::start(set.to_string());

    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("secret"), "x").unwrap();
    std::fs::write(home.path().join("push-token"), PUSH_TOKEN).unwrap();
    let gm = format!(
        "[limits]\nmin_free_bytes = 0\n\n[sources.gm]\ntype = \"gmail\"\naudience = \"{AUD}\"\n\
         service_account = \"{SA}\"\njwks_url = \"http://127.0.0.1:{}/oauth2/v3/certs\"\n\
         jwks_allow_private = [\"127.0.0.1/32\"]\naction = \"http-main\"\n\
         secrets.push_token = {{ file = \"{}/push-token\" }}\n",
        stub.port,
        home.path().display()
    );
    std::fs::write(home.path().join("config.toml"), config(home.path(), &gm)).unwrap();
    let p = Proc::start_in(home, &[("HOOKSPOOL_LOG_LEVEL", "trace".into())]);
    p.wait_serving();

    let path = format!("/hooks/gm?token={PUSH_TOKEN}");
    let send = |token: Option<&str>, n: u32| {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut h: Vec<(&str, &str)> = vec![("Content-Type", "application/json")];
        if let Some(a) = &auth {
            h.push(("Authorization", a));
        }
        super::intake::raw(p.tcp, &request("POST", &path, &h, &push_body(n)))
    };

    let first_token = key.token(&claims());
    let r = send(Some(&first_token), 1);
    assert_eq!(r.status, 200, "{r:?}\n{}", p.log());
    let stored = events(&p.db());
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stub.hits.load(Ordering::SeqCst), 1);

    let with = |k: &str, v: serde_json::Value| {
        let mut c = claims();
        c[k] = v;
        key.token(&c)
    };
    let mut tampered = key.token(&claims());
    let last = tampered.pop().unwrap();
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    let refused: Vec<(&str, Option<String>)> = vec![
        (
            "wrong audience",
            Some(with("aud", "https://elsewhere.example.org/".into())),
        ),
        (
            "wrong issuer",
            Some(with("iss", "https://accounts.example.com".into())),
        ),
        ("expired", Some(with("exp", (now() - 120).into()))),
        ("tampered signature", Some(tampered)),
        ("unknown kid", Some(stranger.token(&claims()))),
        (
            "wrong service account",
            Some(with("email", "someone@example.com".into())),
        ),
        ("missing token", None),
    ];
    for (i, (what, token)) in refused.iter().enumerate() {
        let r = send(token.as_deref(), 10 + i as u32);
        assert_eq!(r.status, 401, "{what}: {r:?}");
        assert!(r.body.is_empty(), "{what}: {r:?}");
    }
    assert_eq!(events(&p.db()).len(), 1, "a refused push was stored");
    // The unknown kid fell inside the minute's fetch guard: no second fetch.
    assert_eq!(stub.hits.load(Ordering::SeqCst), 1);

    // `hookspool source test` fetches the keys as the intake does (its own process, its own
    // cache: one more fetch) and explains nothing more than a verdict.
    let body = push_body(99);
    let capture = format!(
        "POST {path} HTTP/1.1\nHost: hooks.example.org\nContent-Type: application/json\nAuthorization: Bearer {first_token}\nContent-Length: {}\n\n{}",
        body.len(),
        String::from_utf8_lossy(&body)
    );
    let file = p.home.path().join("push.http");
    std::fs::write(&file, &capture).unwrap();
    let out = std::process::Command::new(super::bin())
        .arg("--home")
        .arg(p.home.path())
        .args(["source", "test", "gm", "--request"])
        .arg(&file)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && text.contains("signature   verified"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stub.hits.load(Ordering::SeqCst), 2);

    // Nothing of a token or of the query string is stored (the spool and its WAL, raw).
    let sig_part = first_token.rsplit('.').next().unwrap().to_string();
    for suffix in ["", "-wal"] {
        let path = format!("{}{suffix}", p.db().display());
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        for needle in [
            "eyJhbGciOiJSUzI1NiIs",
            PUSH_TOKEN,
            "SENTINEL-SUB",
            &sig_part[..24],
        ] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{needle} is stored in {path}"
            );
        }
    }

    let log = p.log();
    let rejected = log
        .lines()
        .filter(|l| l.contains("rejected") && l.contains("gm") && l.contains("401"))
        .count();
    assert_eq!(rejected, refused.len(), "one log line per refusal:\n{log}");
    assert!(
        !log.contains("SENTINEL"),
        "a sentinel reached the log:\n{}",
        log.lines()
            .filter(|l| l.contains("SENTINEL"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(!log.contains("eyJ"), "a token reached the log:\n{log}");
}
