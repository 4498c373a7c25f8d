//! `hookspool source test` on a Plaid source fetches Plaid's verification key as the intake
//! does (`intake::plaid_fetch`: POST /webhook_verification_key/get with the source's
//! client_id and secret and the JWT's kid), here from a stub key service on 127.0.0.1 that
//! answers in the shape of Plaid's documented example (tests/vectors/plaid,
//! docs-webhook_verification_key-get.response.json) with the source kit's published key
//! (the `plaid.items` bobbin's `[stub.webhook_verification_key]`). The binary is told the
//! stub's address with `HOOKSPOOL_TEST_PLAID_BASE_URL` (honoured only in `failpoints`
//! builds; elsewhere the key service is https://{env}.plaid.com).

use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

const CAPTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/bobbins/plaid/items/captures");
const KID: &str = "hookspool-kit-key-1";

/// How the stub key service answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// The key for a known kid; for another a 400 INVALID_INPUT error object (Plaid's
    /// error fields; the code is the stub's choice: the fetcher reads any 400 that is not a
    /// credentials error as "no such key").
    Keys,
    /// 400 INVALID_API_KEYS: the credentials are wrong.
    BadCredentials,
}

struct KeyService {
    base: String,
    /// Each request seen: request line and JSON body.
    seen: Arc<Mutex<Vec<(String, serde_json::Value)>>>,
    answer: Arc<Mutex<Answer>>,
}

impl KeyService {
    fn start() -> KeyService {
        // Plaid's documented answer, with the kit's key in place of the docs' key.
        let mut doc: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/vectors/plaid/docs-webhook_verification_key-get.response.json"
            ))
            .unwrap(),
        )
        .unwrap();
        let kit: toml::Table = std::fs::read_to_string(format!("{CAPTURES}/kit.toml"))
            .unwrap()
            .parse()
            .unwrap();
        let key = &kit["stub"]["webhook_verification_key"];
        assert_eq!(key["kid"].as_str(), Some(KID));
        for k in ["kid", "x", "y", "crv", "kty", "alg"] {
            doc["key"][k] = key[k].as_str().unwrap().into();
        }
        doc["key"]["created_at"] = key["created_at"].as_integer().unwrap().into();
        let known = doc.to_string();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answer = Arc::new(Mutex::new(Answer::Keys));
        let (seen2, answer2) = (seen.clone(), answer.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let (line, body) = read_request(&mut stream);
                let json: serde_json::Value =
                    serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                let kid_known = json["key_id"] == KID;
                seen2.lock().unwrap().push((line, json));
                let (status, text) = match *answer2.lock().unwrap() {
                    Answer::Keys if kid_known => ("200 OK", known.clone()),
                    Answer::Keys => (
                        "400 Bad Request",
                        serde_json::json!({"error_type": "INVALID_INPUT", "error_code": "INVALID_FIELD", "error_message": "key_id: no such key", "request_id": "stub"}).to_string(),
                    ),
                    Answer::BadCredentials => (
                        "400 Bad Request",
                        serde_json::json!({"error_type": "INVALID_INPUT", "error_code": "INVALID_API_KEYS", "error_message": "invalid client_id or secret provided", "request_id": "stub"}).to_string(),
                    ),
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                    text.len()
                );
                let _ = stream.write_all(resp.as_bytes());
            }
        });
        KeyService { base, seen, answer }
    }

    fn hits(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// The request line and the Content-Length body of one HTTP/1.1 request.
fn read_request(stream: &mut std::net::TcpStream) -> (String, Vec<u8>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&got[..end]).to_string();
        let len = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .and_then(|v| v.trim().parse::<usize>().ok())
            })
            .unwrap_or(0);
        if got.len() >= end + 4 + len {
            let line = head.lines().next().unwrap_or_default().to_string();
            return (line, got[end + 4..end + 4 + len].to_vec());
        }
    }
    (String::new(), Vec::new())
}

fn secret_file(path: &Path, value: &str) {
    std::fs::write(path, value).unwrap();
    let mut perms = std::fs::metadata(path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(path, perms).unwrap();
}

/// A bobbin capture as `source test` reads it: from its request line on.
fn capture(home: &Path, name: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(format!("{CAPTURES}/{name}")).unwrap();
    let file = home.join(name);
    std::fs::write(&file, &text[text.find("POST /hooks/plaid").unwrap()..]).unwrap();
    file
}

#[test]
fn source_test_verifies_plaid_with_its_key_fetched_from_the_key_service() {
    let service = KeyService::start();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    secret_file(&h.join("plaid-client-id"), "stub-client-id-5d1c");
    secret_file(&h.join("plaid-secret"), "stub-secret-9a7e");
    std::fs::write(
        h.join("config.toml"),
        format!(
            "[bobbins.plaid]\nbobbin = \"plaid.items\"\nsettings = {{ env = \"sandbox\" }}\nsecrets.client_id = {{ file = \"{0}/plaid-client-id\" }}\nsecrets.secret = {{ file = \"{0}/plaid-secret\" }}\noutputs = {{ \"*\" = \"hermes:plaid\" }}\n",
            h.display()
        ),
    )
    .unwrap();
    let run = |file: &Path, at: &str| {
        let out = std::process::Command::new(super::bin())
            .arg("--home")
            .arg(h)
            .args(["source", "test", "plaid", "--request"])
            .arg(file)
            .args(["--at", at])
            .env("HOOKSPOOL_TEST_PLAID_BASE_URL", &service.base)
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let good = capture(h, "sync-updates-available.http");

    // At its own time: the key is fetched once, with the source's credentials and the kid.
    let (ok, text) = run(&good, "1700000000");
    assert!(ok && text.contains("signature   verified"), "{text}");
    assert!(
        text.contains("event_type  TRANSACTIONS.SYNC_UPDATES_AVAILABLE")
            && text.contains("key         item:wz666MBjYWTp2PDzzggYhM6oWWmBb"),
        "{text}"
    );
    {
        let seen = service.seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        let (line, body) = &seen[0];
        assert!(
            line.starts_with("POST /webhook_verification_key/get "),
            "{line}"
        );
        assert_eq!(
            body,
            &serde_json::json!({"client_id": "stub-client-id-5d1c", "secret": "stub-secret-9a7e", "key_id": KID})
        );
    }
    // No credential reaches the output.
    assert!(
        !text.contains("stub-secret-9a7e") && !text.contains("stub-client-id-5d1c"),
        "{text}"
    );

    // Outside the JWT's 300 s window, and a JWT over another body: refused with the key.
    for at in ["1700000301", "1699999699"] {
        let (ok, text) = run(&good, at);
        assert!(!ok && text.contains("401"), "{at}: {text}");
    }
    let (ok, text) = run(&capture(h, "other-body.http"), "1700000000");
    assert!(
        !ok && text.contains("signature   not verified") && text.contains("401"),
        "{text}"
    );
    assert_eq!(service.hits(), 4);

    // An unknown kid: the service says there is no such key; refused, not undecided.
    let other_kid = std::fs::read_to_string(&good).unwrap().replace(
        "eyJhbGciOiJFUzI1NiIsImtpZCI6Imhvb2tzcG9vbC1raXQta2V5LTEiLCJ0eXAiOiJKV1QifQ",
        // {"alg":"ES256","kid":"hookspool-kit-key-2","typ":"JWT"}
        "eyJhbGciOiJFUzI1NiIsImtpZCI6Imhvb2tzcG9vbC1raXQta2V5LTIiLCJ0eXAiOiJKV1QifQ",
    );
    let file = h.join("other-kid.http");
    std::fs::write(&file, other_kid).unwrap();
    let (ok, text) = run(&file, "1700000000");
    assert!(!ok && text.contains("401"), "{text}");
    assert_eq!(
        service.seen.lock().unwrap()[4].1["key_id"],
        "hookspool-kit-key-2"
    );

    // Credentials the key service refuses: the intake could not decide (503), and says why
    // without the credentials.
    *service.answer.lock().unwrap() = Answer::BadCredentials;
    let (ok, text) = run(&good, "1700000000");
    assert!(
        !ok && text.contains("could not decide") && text.contains("503"),
        "{text}"
    );
    assert!(text.contains("key service answered HTTP 400"), "{text}");
    assert!(!text.contains("stub-secret-9a7e"), "{text}");
}
