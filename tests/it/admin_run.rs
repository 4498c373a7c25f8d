//! Issue 31: `hookspool run` serves the admin API in-process, through the real binary. With
//! no `[admin] token` it generates one and prints it in its banner's curl line, which
//! works as printed; the token is on no other line (no log line carries it). A taken
//! `admin.listen` port falls back to a free one that the banner names. A configured token
//! (a file holding a sentinel) is used and never printed. A wrong `admin.listen` is refused
//! at start naming the key and what to write; written into the file while `run` is
//! running it is a refused reload, and `run` keeps serving both the intake and the API.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::bin;
use super::intake::{Resp, read_response};
use super::run_e2e::{RunProc, free_port, reserved_port};
use super::wait_until;

const TOKEN: &str = "RUNADMINTOKENSENTINEL-0123456789";

/// A GET of `path` at `addr` with Host 127.0.0.1 and the token, if any.
fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Resp {
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n", addr.port());
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    read_response(&mut s)
}

/// A config with the intake on `port` and the `[admin]` table given.
fn write_config(home: &Path, port: u16, admin: &str) {
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[intake]\nlisten = \"127.0.0.1:{port}\"\n\n[limits]\nmin_free_bytes = 0\n\n[admin]\n{admin}\n"
        ),
    )
    .unwrap();
}

/// The banner's curl line: (the token as printed, the status URL's address).
fn banner(log: &str) -> Option<(String, SocketAddr)> {
    let line = log.lines().find(|l| {
        l.trim_start()
            .starts_with("curl -H 'Authorization: Bearer ")
    })?;
    let rest = line.split("Bearer ").nth(1)?;
    let (token, rest) = rest.split_once("' http://")?;
    let addr = rest.strip_suffix("/api/v1/status")?.parse().ok()?;
    Some((token.to_string(), addr))
}

#[test]
fn run_serves_the_admin_api_with_a_generated_token_printed_in_its_banner_only() {
    let home = tempfile::tempdir().unwrap();
    let port = reserved_port();
    // The configured admin port is taken: run serves on a free one and says which.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();
    write_config(home.path(), port, &format!("listen = \"{taken_addr}\""));
    let p = RunProc::start(home.path(), ([127, 0, 0, 1], port).into(), &[]);
    let mut printed = None;
    wait_until("the banner's curl line", Duration::from_secs(20), || {
        printed = banner(&p.log());
        printed.is_some()
    });
    let (token, addr) = printed.unwrap();
    assert_ne!(addr, taken_addr, "a free port instead of the taken one");
    assert_eq!(token.len(), 48, "24 random bytes, hex: {token}");
    assert!(p.log().contains("is taken"), "{}", p.log());

    // The printed command works as printed (once the spool is migrated); no token, no entry.
    wait_until("the admin API answers", Duration::from_secs(20), || {
        get(addr, "/api/v1/status", Some(&token)).status == 200
    });
    let r = get(addr, "/api/v1/status", Some(&token));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(v["ok"].is_boolean(), "the status document: {v}");
    assert_eq!(get(addr, "/api/v1/status", None).status, 401);
    assert_eq!(
        get(addr, "/api/v1/batches", Some("x".repeat(48).as_str())).status,
        401
    );

    // A wrong admin.listen saved while running: the reload is refused, nothing stops.
    write_config(home.path(), port, "listen = \"0.0.0.0:8651\"");
    wait_until(
        "the refused reload is logged",
        Duration::from_secs(20),
        || p.log().contains("admin.listen"),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(get(addr, "/api/v1/status", Some(&token)).status, 200);
    assert_eq!(
        super::intake::raw(
            ([127, 0, 0, 1], port).into(),
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .status,
        200,
        "the intake serves on: {}",
        p.log()
    );

    // The token is on the banner's curl and dashboard lines and on no other line.
    let log = p.log();
    let with_token: Vec<&str> = log.lines().filter(|l| l.contains(&token)).collect();
    assert_eq!(with_token.len(), 2, "{with_token:?}");
    assert!(
        with_token[0].trim_start().starts_with("curl -H"),
        "{with_token:?}"
    );
    assert_eq!(
        with_token[1],
        format!("The dashboard: open http://{addr}/?token={token}")
    );
    drop(taken);
}

#[test]
fn run_uses_a_configured_admin_token_and_never_prints_it() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("admin.token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let port = reserved_port();
    write_config(
        home.path(),
        port,
        &format!(
            "listen = \"127.0.0.1:0\"\ntoken = {{ file = \"{}\" }}",
            file.display()
        ),
    );
    let p = RunProc::start(home.path(), ([127, 0, 0, 1], port).into(), &[]);
    let mut printed = None;
    wait_until("the banner's curl line", Duration::from_secs(20), || {
        printed = banner(&p.log());
        printed.is_some()
    });
    let (shown, addr) = printed.unwrap();
    assert_eq!(shown, format!("$(cat {})", file.display()));
    wait_until("the admin API answers", Duration::from_secs(20), || {
        get(addr, "/api/v1/status", Some(TOKEN)).status == 200
    });
    assert_eq!(get(addr, "/api/v1/issues", Some(TOKEN)).status, 200);
    assert!(!p.log().contains("RUNADMINTOKENSENTINEL"), "{}", p.log());
}

#[test]
fn a_wrong_admin_key_is_refused_at_start_naming_the_key_and_what_to_write() {
    let home = tempfile::tempdir().unwrap();
    let run = |admin: &str| {
        write_config(home.path(), free_port(), admin);
        let o = Command::new(bin())
            .arg("--home")
            .arg(home.path())
            .arg("check")
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let out = run("listen = \"0.0.0.0:8651\"");
    assert!(
        out.contains("admin.listen") && out.contains("listen = \"127.0.0.1:8651\""),
        "{out}"
    );
    let out = run("listen = \"port 8651\"");
    assert!(
        out.contains("admin.listen") && out.contains("is not an address"),
        "{out}"
    );
    let out = run("token = \"inline-value-SENTINELTOKEN\"");
    assert!(
        out.contains("admin.token") || out.contains("admin"),
        "{out}"
    );
    assert!(!out.contains("SENTINELTOKEN"), "no value quoted: {out}");
}

#[test]
fn with_json_logs_and_no_configured_token_run_leaves_the_admin_api_off_and_prints_no_banner() {
    let home = tempfile::tempdir().unwrap();
    let port = reserved_port();
    write_config(home.path(), port, "listen = \"127.0.0.1:0\"");
    let p = RunProc::start(
        home.path(),
        ([127, 0, 0, 1], port).into(),
        &[("HOOKSPOOL_LOG", "json")],
    );
    wait_until("the warning", Duration::from_secs(20), || {
        p.log().contains("the admin API is off")
    });
    let log = p.log();
    assert!(!log.contains("Bearer") && !log.contains("?token="), "{log}");
    assert!(
        log.lines()
            .filter(|l| !l.trim().is_empty())
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()
                || l.starts_with("warning: ")),
        "JSON lines only:\n{log}"
    );
}

#[test]
fn run_serves_the_admin_socket_of_its_config_without_a_token() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let port = reserved_port();
    let sock = home.path().join("admin.sock");
    write_config(
        home.path(),
        port,
        &format!("listen = \"\"\nsocket = \"{}\"", sock.display()),
    );
    let p = RunProc::start(home.path(), ([127, 0, 0, 1], port).into(), &[]);
    wait_until("the admin socket serves", Duration::from_secs(20), || {
        sock.exists()
            && super::admin_socket::over(&sock, "GET", "/api/v1/status", "localhost", false, "")
                .status
                == 200
    });
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    let log = p.log();
    assert!(log.contains("admin API on unix:"), "{log}");
    assert!(!log.contains("Bearer"), "no TCP, no banner: {log}");
    let r = super::admin_socket::over(&sock, "GET", "/", "localhost", false, "");
    assert_eq!(r.status, 200, "the dashboard over the socket");
    assert!(String::from_utf8_lossy(&r.body).contains("Backlog"));
}

/// The overview's "rejections by reason" (issue 31), through the real `hookspool run`: the
/// intake counts requests it answers without storing them and stores its counts in the
/// spool (with its next group, or on its own within seconds when nothing commits); the
/// admin half reads them into /api/v1/rejections, the sources and the overview and sources
/// pages. A sentinel planted in the rejected bodies, query strings and a header is in no
/// answer, page, log line or byte of the spool.
#[test]
fn run_shows_the_intakes_rejections_by_reason_and_never_what_the_requests_carried() {
    use std::os::unix::fs::PermissionsExt;
    const SENTINEL: &str = "REJECTEDSENTINEL7731";
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let file = h.join("admin.token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(h.join("source.secret"), "the-source-secret").unwrap();
    std::fs::write(h.join("dest.secret"), "the-destination-secret").unwrap();
    let port = reserved_port();
    std::fs::write(
        h.join("config.toml"),
        format!(
            r#"[intake]
listen = "127.0.0.1:{port}"

[limits]
min_free_bytes = 0

[admin]
listen = "127.0.0.1:0"
token = {{ file = "{home}/admin.token" }}

[sources.gh]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.topic"
action = "sink"
secrets.secret = {{ file = "{home}/source.secret" }}

[destinations.sink]
type = "http"
url = "http://127.0.0.1:9/"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{home}/dest.secret" }}
"#,
            home = h.display()
        ),
    )
    .unwrap();
    let p = RunProc::start(h, ([127, 0, 0, 1], port).into(), &[]);
    let mut printed = None;
    wait_until("the banner's curl line", Duration::from_secs(20), || {
        printed = banner(&p.log());
        printed.is_some()
    });
    let (_, admin) = printed.unwrap();
    wait_until("the admin API answers", Duration::from_secs(20), || {
        get(admin, "/api/v1/status", Some(TOKEN)).status == 200
    });

    // Five wrongly signed requests and two chunked ones, each carrying the sentinel in its
    // body, its query string and a header.
    let body = format!(r#"{{"topic":"t","secret":"{SENTINEL}-body"}}"#);
    for i in 0..5 {
        let r = super::intake::raw(
            p.addr,
            &super::intake::request(
                "POST",
                &format!("/hooks/gh?token={SENTINEL}-query-{i}"),
                &[
                    ("X-Signature", "sha256=00ff"),
                    ("X-Custom", &format!("{SENTINEL}-header")),
                ],
                body.as_bytes(),
            ),
        );
        assert_eq!(r.status, 401, "{}", String::from_utf8_lossy(&r.body));
    }
    for _ in 0..2 {
        let chunked = format!(
            "POST /hooks/gh?q={SENTINEL}-chunked HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n14\r\n{SENTINEL}\r\n0\r\n\r\n"
        );
        assert_eq!(super::intake::raw(p.addr, chunked.as_bytes()).status, 411);
    }

    // Nothing committed a group: the writer stores the counts on its own, within seconds.
    let json = |path: &str| -> serde_json::Value {
        let r = get(admin, path, Some(TOKEN));
        assert_eq!(r.status, 200, "{path}");
        serde_json::from_slice(&r.body).unwrap()
    };
    wait_until(
        "the rejections reach the spool",
        Duration::from_secs(30),
        || json("/api/v1/rejections")["total"] == 7,
    );
    let v = json("/api/v1/rejections");
    assert_eq!(
        v["by_reason"],
        serde_json::json!({"chunked": 2, "unverified": 5}),
        "{v}"
    );
    assert_eq!(
        v["by_source"],
        serde_json::json!([{"source": "gh", "reason": "chunked", "count": 2},
            {"source": "gh", "reason": "unverified", "count": 5}]),
        "{v}"
    );
    let sources = json("/api/v1/sources");
    let gh = sources["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "gh")
        .unwrap_or_else(|| panic!("{sources}"))
        .clone();
    assert_eq!(gh["rejected"], 7, "{gh}");
    assert_eq!(
        gh["rejected_by_reason"],
        serde_json::json!({"chunked": 2, "unverified": 5})
    );

    // The overview and the sources page show them by reason.
    let page = |path: &str| -> String {
        let r = get(admin, path, Some(TOKEN));
        assert_eq!(r.status, 200, "{path}");
        String::from_utf8(r.body).unwrap()
    };
    let overview = page("/");
    let card = overview
        .split("id=\"rejections\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no rejections card: {overview}"));
    let card = card.split("</div>").next().unwrap();
    assert!(card.contains("Rejections, last 24 h"), "{card}");
    assert!(card.contains("7 <small>"), "{card}");
    assert!(
        card.contains("<th>unverified</th><td>5</td>")
            && card.contains("<th>chunked</th><td>2</td>"),
        "{card}"
    );
    assert!(
        card.find("unverified") < card.find("chunked"),
        "largest first: {card}"
    );
    let sources_page = page("/sources");
    assert!(
        sources_page.contains("unverified 5, chunked 2"),
        "{sources_page}"
    );

    // The sentinel: in no answer, no page, no log line, no byte of the spool.
    let mut seen = vec![
        v.to_string(),
        sources.to_string(),
        json("/api/v1/batches").to_string(),
        json("/api/v1/status").to_string(),
        json("/api/v1/issues?all=1").to_string(),
        overview,
        sources_page,
        page("/batches"),
        p.log(),
    ];
    for f in ["spool.db", "spool.db-wal"] {
        if let Ok(bytes) = std::fs::read(h.join(f)) {
            seen.push(String::from_utf8_lossy(&bytes).to_string());
        }
    }
    for (i, text) in seen.iter().enumerate() {
        assert!(!text.contains(SENTINEL), "the sentinel in #{i}: {text}");
    }
}
