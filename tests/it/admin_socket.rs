//! Issue 31: `hookspool admin --socket PATH` through the real binary. The socket file is
//! created mode 0660; a request on it needs no token but keeps the Host rule and, for an
//! action, the CSRF header; an action over it is audited in the spool and the journal with
//! the caller's uid from SO_PEERCRED, not as `admin-token`.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::admin::{audit_rows, seed_dead};
use super::intake::{Resp, read_response};
use super::{bin, capture_stderr, wait_until};

/// One request over the socket: `method path` with `host` and the CSRF header when given.
pub(super) fn over(
    sock: &Path,
    method: &str,
    path: &str,
    host: &str,
    csrf: bool,
    body: &str,
) -> Resp {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n");
    if csrf {
        head.push_str("X-Hookspool-CSRF: 1\r\n");
    }
    head.push_str(&format!(
        "Content-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    read_response(&mut s)
}

#[test]
fn the_admin_socket_is_0660_needs_no_token_and_audits_the_callers_uid() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("config.toml"), "").unwrap();
    let db = home.path().join("spool.db");
    let (dead, _, _) = seed_dead(&db);
    let sock = home.path().join("admin.sock");
    let mut child = Command::new(bin())
        .arg("--home")
        .arg(home.path())
        .args(["admin", "--socket"])
        .arg(&sock)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = capture_stderr(&mut child);
    let log = || String::from_utf8_lossy(&stderr.lock().unwrap()).to_string();
    wait_until("the admin socket serves", Duration::from_secs(20), || {
        log().contains("admin API on unix:")
    });
    let meta = std::fs::symlink_metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o660,
        "the socket's mode"
    );

    // A read without a token; the Host rule still holds.
    let r = over(&sock, "GET", "/api/v1/status", "localhost", false, "");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = over(&sock, "GET", "/api/v1/status", "evil.example", false, "");
    assert_eq!(r.status, 403);
    // An action without the CSRF header changes nothing; with it, it is the caller's.
    let path = format!("/api/v1/batches/{}/replay", dead[0]);
    let r = over(&sock, "POST", &path, "localhost", false, "{}");
    assert_eq!(r.status, 403, "{}", String::from_utf8_lossy(&r.body));
    assert!(audit_rows(&db).is_empty());
    let r = over(&sock, "POST", &path, "localhost", true, "{}");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = over(
        &sock,
        "POST",
        "/api/v1/destinations/http:r0/pause",
        "localhost",
        true,
        "{}",
    );
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    let uid = nix::unistd::getuid().as_raw();
    let me = format!("uid:{uid}");
    assert_eq!(
        (r.status, v["by"].as_str()),
        (200, Some(me.as_str())),
        "{v}"
    );

    let rows = audit_rows(&db);
    assert!(
        rows.iter()
            .any(|r| r.0 == "replay" && r.1 == Some(dead[0]) && r.3["by"] == me.as_str()),
        "{rows:?}"
    );
    assert!(rows.iter().all(|r| r.3["by"] == me.as_str()), "{rows:?}");
    wait_until("the journal line", Duration::from_secs(5), || {
        log().contains(&format!("action by {me}: replay batch {}", dead[0]))
    });
    assert!(!log().contains("admin-token"), "{}", log());

    // SIGTERM: the service stops and takes its socket file with it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", log());
    assert!(!sock.exists(), "the socket file is removed at exit");
}

#[test]
fn admin_needs_a_token_file_or_a_socket() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("config.toml"), "").unwrap();
    let o = Command::new(bin())
        .arg("--home")
        .arg(home.path())
        .arg("admin")
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--token-file") && err.contains("--socket"),
        "{err}"
    );
}

/// Issue 31: hookspool-admin.socket's service. Started with a Unix listener systemd-style
/// (LISTEN_FDS, LISTEN_PID naming the process, fd 3), `hookspool admin --idle-exit` serves
/// a connection already waiting in the backlog, says READY=1 on NOTIFY_SOCKET (Type=notify),
/// stays while a connection is open, exits 0 once nothing has been connected for the idle
/// period, and leaves the socket file to its owner (systemd).
#[test]
fn a_socket_activated_admin_serves_says_ready_and_exits_when_idle() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("config.toml"), "").unwrap();
    let db = home.path().join("spool.db");
    let (dead, _, _) = seed_dead(&db);
    let sock = home.path().join("admin.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let notify = home.path().join("notify.sock");
    let ready = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    ready
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // A request waits in the backlog before the service exists, as on a first connection.
    let early = std::thread::spawn({
        let sock = sock.clone();
        move || over(&sock, "GET", "/api/v1/status", "localhost", false, "")
    });
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new("/bin/sh");
    // $$ is the shell's pid, which exec keeps: LISTEN_PID names hookspool itself.
    cmd.arg("-c")
        .arg("LISTEN_PID=$$; export LISTEN_PID; exec \"$0\" \"$@\"")
        .arg(bin())
        .arg("--home")
        .arg(home.path())
        .args(["admin", "--idle-exit", "2s"])
        .env("LISTEN_FDS", "1")
        .env("LISTEN_FDNAMES", "admin")
        .env("NOTIFY_SOCKET", &notify)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_LOG")
        .env_remove("WATCHDOG_USEC")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only dup2/close between fork and exec (async-signal-safe).
    unsafe {
        cmd.pre_exec(move || {
            use nix::libc;
            if libc::dup2(fd, 100) < 0 || libc::dup2(100, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(100);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(listener);
    let stderr = capture_stderr(&mut child);
    let log = || String::from_utf8_lossy(&stderr.lock().unwrap()).to_string();
    let mut buf = [0u8; 512];
    let n = ready.recv(&mut buf).expect("a notification");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    let r = early.join().unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert!(v.get("ok").is_some(), "{v}");
    // An action over the inherited socket is the caller's.
    let path = format!("/api/v1/batches/{}/replay", dead[0]);
    let r = over(&sock, "POST", &path, "localhost", true, "{}");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let me = format!("uid:{}", nix::unistd::getuid().as_raw());
    assert!(
        audit_rows(&db).iter().any(|r| r.3["by"] == me.as_str()),
        "{:?}",
        audit_rows(&db)
    );

    // An open connection keeps it: 4 s past a 2 s idle period, it still runs.
    let held = UnixStream::connect(&sock).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited with a connection open\n{}",
        log()
    );
    drop(held);
    let started = std::time::Instant::now();
    wait_until("the idle exit", Duration::from_secs(20), || {
        child.try_wait().unwrap().is_some()
    });
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", log());
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "left before its idle period"
    );
    assert!(log().contains("exiting"), "{}", log());
    assert!(sock.exists(), "the socket file is systemd's, not removed");
    let stopping = ready.recv(&mut buf).expect("STOPPING=1");
    assert!(
        String::from_utf8_lossy(&buf[..stopping]).contains("STOPPING=1"),
        "{}",
        String::from_utf8_lossy(&buf[..stopping])
    );
}
