//! Proofs by observed effect: real /bin/sh and python3 scripts run through the real sandbox
//! and report what they could and could not do; the test asserts each effect (and, where it
//! matters, that the same action works outside the sandbox, so a pass is not an accident of
//! the test machine). (The rule that only this module spawns processes is in tests/tidy.rs.)
//!
//! Tests that need root (run_as) or python3 and strace report `SKIPPED` through
//! tests/support/skip.rs when those are absent (a failure under HOOKSPOOL_NO_SKIP=1).

use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::*;

// The one skip rule (tests/support/skip.rs), included once for the library's tests.
use crate::store::test_skip::skip_or_fail;

const PYTHON: &str = "/usr/bin/python3";
/// Deadline for ordinary test scripts.
const TEST_DEADLINE_S: u64 = 20;
/// An unused uid/gid for the fork-bomb test, so RLIMIT_NPROC counts only the bomb.
const BOMB_UID: u32 = 61_234;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn python() -> Option<&'static str> {
    if Path::new(PYTHON).exists() {
        Some(PYTHON)
    } else {
        skip_or_fail(&format!("{PYTHON} is absent (Debian package python3)"));
        None
    }
}

/// A spool home as the dispatcher has it, plus a state dir and a scripts dir outside it.
struct Fixture {
    _root: tempfile::TempDir,
    home: PathBuf,
    state: PathBuf,
    scripts: PathBuf,
}

fn fixture() -> Fixture {
    let root = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(root.path()).unwrap();
    let home = base.join("home");
    let state = base.join("state");
    let scripts = base.join("scripts");
    for d in [&home, &home.join("secrets"), &state, &scripts] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(home.join("spool.db"), b"SQLite format 3\0").unwrap();
    std::fs::write(home.join("spool.db-wal"), b"wal").unwrap();
    std::fs::write(home.join("config.toml"), b"[intake]\n").unwrap();
    std::fs::write(home.join("secrets/github"), b"SENTINEL-SECRET").unwrap();
    for f in ["spool.db", "secrets/github"] {
        std::fs::set_permissions(home.join(f), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    Fixture {
        _root: root,
        home,
        state,
        scripts,
    }
}

impl Fixture {
    fn script(&self, name: &str, body: &str) -> String {
        let path = self.scripts.join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.to_string_lossy().into_owned()
    }

    fn policy(&self, argv: Vec<String>) -> Policy {
        let mut p = Policy::new(argv, Instant::now() + Duration::from_secs(TEST_DEADLINE_S));
        p.deny_paths = vec![self.home.clone()];
        p.write_paths = vec![self.state.clone()];
        p.env = vec![
            ("SPOOL".into(), self.home.to_string_lossy().into_owned()),
            ("STATE".into(), self.state.to_string_lossy().into_owned()),
        ];
        p
    }
}

fn stdout(r: &RunResult) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}

fn lines(r: &RunResult) -> Vec<String> {
    stdout(r).lines().map(str::to_string).collect()
}

async fn py(f: &Fixture, code: &str, tweak: impl FnOnce(&mut Policy)) -> Option<RunResult> {
    let python = python()?;
    let mut p = f.policy(vec![python.into(), "-c".into(), code.into()]);
    tweak(&mut p);
    Some(run(p).await.unwrap())
}

/// Runs a command outside the sandbox (the control half of a proof).
fn outside(argv: &[&str]) -> std::process::Output {
    std::process::Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .unwrap()
}

fn pid_gone(pid: i32) -> bool {
    // A zombie waiting for a reaper is dead for our purpose: it runs nothing.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_gone(pid: i32) -> bool {
    for _ in 0..40 {
        if pid_gone(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn enforcement_report_matches_this_kernel() {
    let f = fixture();
    let r = run(f.policy(vec!["/bin/true".into()])).await.unwrap();
    assert_eq!(r.status, ExitStatus::Code(0));
    let e = r.enforcement;
    eprintln!("enforcement here: {e:?}");
    assert_eq!(e.landlock, paths::level(paths::kernel_abi()));
    assert!(e.no_new_privs);
    assert_eq!(e.seccomp, seccomp::available());
    if is_root() {
        assert!(e.caps_dropped);
        assert!(!e.nproc_enforced, "uid 0 is exempt from RLIMIT_NPROC");
    }
}

#[tokio::test]
async fn sh_script_cannot_touch_the_spool_home_but_can_write_state_and_tmp() {
    let f = fixture();
    let script = f.script(
        "probe.sh",
        r#"#!/bin/sh
for name in spool.db spool.db-wal config.toml secrets/github; do
  if cat "$SPOOL/$name" >/dev/null 2>&1; then echo "read-ok $name"; else echo "read-denied $name"; fi
done
if echo x > "$SPOOL/evil" 2>/dev/null; then echo write-home-ok; else echo write-home-denied; fi
if ls "$SPOOL" >/dev/null 2>&1; then echo list-home-ok; else echo list-home-denied; fi
echo state > "$STATE/written" && echo write-state-ok
echo tmp > "$TMPDIR/written" && cat "$TMPDIR/written" >/dev/null && echo write-tmp-ok
if echo x > "$ESCAPE" 2>/dev/null; then echo write-slash-tmp-ok; else echo write-slash-tmp-denied; fi
if cat /etc/shadow >/dev/null 2>&1; then echo shadow-ok; else echo shadow-denied; fi
cat /etc/passwd >/dev/null && echo etc-passwd-ok
"#,
    );
    // A fresh name in the real /tmp, which is not granted.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let escape = std::env::temp_dir().join(format!(
        "hookspool-sandbox-escape-{}-{nanos}",
        std::process::id()
    ));
    let mut p = f.policy(vec![script]);
    p.env
        .push(("ESCAPE".into(), escape.to_string_lossy().into_owned()));
    let r = run(p).await.unwrap();
    assert_eq!(
        r.status,
        ExitStatus::Code(0),
        "{}",
        String::from_utf8_lossy(&r.stderr_tail)
    );
    let out = lines(&r);
    for expected in [
        "read-denied spool.db",
        "read-denied spool.db-wal",
        "read-denied config.toml",
        "read-denied secrets/github",
        "write-home-denied",
        "list-home-denied",
        "write-state-ok",
        "write-tmp-ok",
        "write-slash-tmp-denied",
        "shadow-denied",
        "etc-passwd-ok",
    ] {
        assert!(
            out.iter().any(|l| l == expected),
            "missing {expected} in {out:?}"
        );
    }
    assert!(!f.home.join("evil").exists());
    assert_eq!(std::fs::read(f.state.join("written")).unwrap(), b"state\n");
    assert!(!escape.exists());
}

#[tokio::test]
async fn python_gets_eacces_on_the_home_and_the_dispatchers_proc() {
    let f = fixture();
    let code = r#"
import os, json
res = {}
def attempt(name, fn):
    try:
        fn(); res[name] = "ok"
    except OSError as e:
        res[name] = e.errno
home = os.environ["SPOOL"]
attempt("read_db", lambda: open(home + "/spool.db", "rb").read())
attempt("read_config", lambda: open(home + "/config.toml").read())
attempt("read_secret", lambda: open(home + "/secrets/github").read())
attempt("write_home", lambda: open(home + "/new", "w").write("x"))
attempt("list_home", lambda: os.listdir(home))
attempt("parent_environ", lambda: open("/proc/%s/environ" % os.environ["PARENT_PID"], "rb").read())
attempt("write_state", lambda: open(os.environ["STATE"] + "/py", "w").write("x"))
import tempfile
attempt("tempfile", lambda: tempfile.NamedTemporaryFile().write(b"x"))
print(json.dumps(res))
"#;
    let Some(r) = py(&f, code, |p| {
        p.env
            .push(("PARENT_PID".into(), std::process::id().to_string()));
    })
    .await
    else {
        return;
    };
    let res: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let eacces = nix::libc::EACCES;
    for key in [
        "read_db",
        "read_config",
        "read_secret",
        "write_home",
        "list_home",
        "parent_environ",
    ] {
        assert_eq!(res[key], eacces, "{key}: {res}");
    }
    assert_eq!(res["write_state"], "ok", "{res}");
    assert_eq!(res["tempfile"], "ok", "{res}");
    assert!(!f.home.join("new").exists());
}

#[tokio::test]
async fn a_state_dir_inside_the_home_is_the_only_way_in() {
    let f = fixture();
    let inner = f.home.join("scripts/demo");
    std::fs::create_dir_all(&inner).unwrap();
    let script = f.script(
        "inner.sh",
        "#!/bin/sh\necho doc > \"$INNER/out\" && echo inner-ok\ncat \"$SPOOL/spool.db\" >/dev/null 2>&1 || echo db-denied\n",
    );
    let mut p = f.policy(vec![script]);
    p.write_paths = vec![inner.clone()];
    p.env
        .push(("INNER".into(), inner.to_string_lossy().into_owned()));
    let r = run(p).await.unwrap();
    assert_eq!(lines(&r), vec!["inner-ok", "db-denied"]);
    assert!(inner.join("out").exists());
}

#[tokio::test]
async fn ptrace_fails_inside_and_works_outside() {
    let Some(python) = python() else { return };
    let mut target = std::process::Command::new("/bin/sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = target.id().to_string();
    let code = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH = 16
rc = libc.ptrace(PTRACE_ATTACH, int(sys.argv[1]), None, None)
print(rc, ctypes.get_errno())
"#;
    if is_root() {
        // Control: the same call works for root outside the sandbox (detached at exit).
        let out = outside(&[python, "-c", code, &pid]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0 0");
    } else {
        skip_or_fail("the ptrace control outside the sandbox needs root");
    }
    let f = fixture();
    let p = f.policy(vec![python.into(), "-c".into(), code.into(), pid.clone()]);
    let r = run(p).await.unwrap();
    assert_eq!(stdout(&r).trim(), format!("-1 {}", nix::libc::EPERM));

    if Path::new("/usr/bin/strace").exists() {
        let p = f.policy(vec!["/usr/bin/strace".into(), "-p".into(), pid.clone()]);
        let r = run(p).await.unwrap();
        assert_ne!(r.status, ExitStatus::Code(0));
        let err = String::from_utf8_lossy(&r.stderr_tail);
        assert!(err.contains("Operation not permitted"), "{err}");
    } else {
        skip_or_fail(
            "/usr/bin/strace is absent (Debian package strace): ptrace checked with python ctypes only",
        );
    }
    target.kill().unwrap();
    target.wait().unwrap();
}

#[tokio::test]
async fn mount_unshare_setsid_and_capabilities_fail_even_as_root() {
    let f = fixture();
    let victim = f.state.join("owned");
    std::fs::write(&victim, b"x").unwrap();
    if is_root() {
        // Control: root outside the sandbox may chown to another uid (CAP_CHOWN).
        std::os::unix::fs::chown(&victim, Some(12_345), None).unwrap();
        std::os::unix::fs::chown(&victim, Some(0), None).unwrap();
    } else {
        skip_or_fail("the chown control outside the sandbox needs root");
    }
    let code = r#"
import ctypes, os, json
libc = ctypes.CDLL(None, use_errno=True)
res = {}
os.mkdir(os.environ["TMPDIR"] + "/m")
rc = libc.mount(b"none", (os.environ["TMPDIR"] + "/m").encode(), b"tmpfs", 0, None)
res["mount"] = [rc, ctypes.get_errno()]
rc = libc.unshare(0x20000)
res["unshare"] = [rc, ctypes.get_errno()]
try:
    os.setsid(); res["setsid"] = "ok"
except OSError as e:
    res["setsid"] = e.errno
try:
    os.chown(os.environ["STATE"] + "/owned", 12345, -1); res["chown"] = "ok"
except OSError as e:
    res["chown"] = e.errno
caps = {}
for line in open("/proc/self/status"):
    k, _, v = line.partition(":")
    if k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
        caps[k] = v.strip()
res["status"] = caps
print(json.dumps(res))
"#;
    let Some(r) = py(&f, code, |_| {}).await else {
        return;
    };
    let res: serde_json::Value = serde_json::from_slice(&r.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&r.stderr_tail)));
    let eperm = nix::libc::EPERM;
    assert_eq!(res["mount"], serde_json::json!([-1, eperm]), "{res}");
    assert_eq!(res["unshare"], serde_json::json!([-1, eperm]), "{res}");
    assert_eq!(res["setsid"], eperm, "{res}");
    assert_eq!(res["chown"], eperm, "{res}");
    let zero = "0000000000000000";
    for set in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(res["status"][set], zero, "{set}: {res}");
    }
    // An unprivileged dispatcher outside systemd (full bounding set, no CAP_SETPCAP) cannot
    // empty the bounding set; the report must say so rather than claim it.
    assert_eq!(
        r.enforcement.caps_dropped,
        res["status"]["CapBnd"] == zero,
        "report vs /proc: {res}"
    );
    if is_root() {
        assert!(r.enforcement.caps_dropped);
    }
    assert_eq!(res["status"]["NoNewPrivs"], "1");
    assert_eq!(res["status"]["Seccomp"], "2");
}

#[tokio::test]
async fn fork_bomb_hits_the_process_limit_as_an_unprivileged_uid() {
    if !is_root() {
        skip_or_fail("run_as needs root (as non-root, NPROC binds the dispatcher's uid)");
        return;
    }
    let Some(python) = python() else { return };
    let f = fixture();
    // Bounded three ways: an unused uid so the count starts at zero, 16 tasks at most, and a
    // short deadline that kills the group.
    let code = r#"
import os, time
n = 0
try:
    for i in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    print("unbounded", n)
except OSError as e:
    print("stopped", n, e.errno)
"#;
    let mut p = f.policy(vec![python.into(), "-c".into(), code.into()]);
    p.write_paths.clear();
    p.run_as = Some(RunAs {
        uid: BOMB_UID,
        gid: BOMB_UID,
    });
    p.limits.processes = 16;
    p.deadline = Instant::now() + Duration::from_secs(8);
    let r = run(p).await.unwrap();
    assert!(r.enforcement.nproc_enforced);
    let out = stdout(&r);
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"stopped"), "{out}");
    let forked: u64 = words[1].parse().unwrap();
    assert!(forked < 16, "{out}");
    assert_eq!(words[2], nix::libc::EAGAIN.to_string());
    // The sleeping children were killed with the group when python exited.
    let mut left = u64::MAX;
    for _ in 0..40 {
        left = plan::uid_task_count(BOMB_UID);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0, "tasks of uid {BOMB_UID} survived the run");

    // A classic shell fork bomb under the same bounds ends and leaves nothing behind.
    let mut p = f.policy(vec![
        "/bin/sh".into(),
        "-c".into(),
        "b() { b | b & }; b; sleep 1".into(),
    ]);
    p.write_paths.clear();
    p.run_as = Some(RunAs {
        uid: BOMB_UID,
        gid: BOMB_UID,
    });
    p.limits.processes = 16;
    p.deadline = Instant::now() + Duration::from_secs(3);
    let started = Instant::now();
    let _ = run(p).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(8));
    for _ in 0..40 {
        left = plan::uid_task_count(BOMB_UID);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0, "shell bomb tasks survived");
}

#[tokio::test]
async fn deadline_kills_a_term_ignoring_script_and_its_grandchild() {
    let f = fixture();
    let script = f.script(
        "stubborn.sh",
        r#"#!/bin/sh
trap '' TERM
/bin/sh -c 'trap "" TERM; echo $$ > "$STATE/grandchild.pid"; exec sleep 60' &
while true; do sleep 1; done
"#,
    );
    let mut p = f.policy(vec![script]);
    p.deadline = Instant::now() + Duration::from_millis(1500);
    let started = Instant::now();
    let r = run(p).await.unwrap();
    assert!(r.timed_out);
    assert_eq!(r.status, ExitStatus::Signal(nix::libc::SIGKILL));
    // Deadline + grace + drain bounds the whole run.
    assert!(started.elapsed() < Duration::from_millis(1500 + run::KILL_GRACE_MS + 2500));
    let pid: i32 = std::fs::read_to_string(f.state.join("grandchild.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_gone(pid).await,
        "grandchild {pid} survived the deadline"
    );
}

#[tokio::test]
async fn a_background_child_does_not_outlive_a_successful_script() {
    let f = fixture();
    let script = f.script(
        "leaves.sh",
        "#!/bin/sh\nsleep 60 >/dev/null 2>&1 &\necho $! > \"$STATE/bg.pid\"\nexit 0\n",
    );
    let r = run(f.policy(vec![script])).await.unwrap();
    assert_eq!(r.status, ExitStatus::Code(0));
    assert!(!r.timed_out);
    let pid: i32 = std::fs::read_to_string(f.state.join("bg.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(wait_gone(pid).await, "background child {pid} survived");
}

#[tokio::test]
async fn environment_holds_exactly_the_allowed_variables() {
    let f = fixture();
    let mut p = f.policy(vec!["/usr/bin/env".into()]);
    p.env = vec![
        ("FROM_ENV_FILE".into(), "a".into()),
        ("HOOKSPOOL_BATCH_ID".into(), "42".into()),
        ("HOOKSPOOL_DELIVERY_ID".into(), "hs_x_42".into()),
    ];
    let r = run(p).await.unwrap();
    let mut names: Vec<String> = lines(&r)
        .iter()
        .filter_map(|l| l.split_once('=').map(|(n, _)| n.to_string()))
        .collect();
    names.sort();
    let mut expected: Vec<String> = [
        "FROM_ENV_FILE",
        "HOOKSPOOL_BATCH_ID",
        "HOOKSPOOL_DELIVERY_ID",
        "TMPDIR",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(
        ["PATH", "HOME", "LANG"]
            .iter()
            .filter(|n| *n == &"PATH" || std::env::var_os(n).is_some())
            .map(|s| s.to_string()),
    )
    .collect();
    expected.sort();
    assert_eq!(names, expected);
    assert!(lines(&r).contains(&"HOOKSPOOL_BATCH_ID=42".to_string()));
}

#[tokio::test]
async fn network_off_cannot_reach_a_loopback_listener() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let f = fixture();
    let code = r#"
import socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", int(sys.argv[1]))); print("connected")
except OSError as e:
    print("refused", e.errno)
"#;
    let Some(python) = python() else { return };
    // Control: with the network on, the same script connects.
    let p = f.policy(vec![python.into(), "-c".into(), code.into(), port.clone()]);
    let r = run(p).await.unwrap();
    assert_eq!(stdout(&r).trim(), "connected");
    let _ = listener.accept().unwrap();

    let mut p = f.policy(vec![python.into(), "-c".into(), code.into(), port.clone()]);
    p.network = false;
    let r = run(p).await.unwrap();
    assert_ne!(r.enforcement.net, NetIsolation::Shared);
    assert_eq!(
        stdout(&r).trim(),
        format!("refused {}", nix::libc::ENETUNREACH)
    );
    assert_eq!(listener.accept().unwrap_err().kind(), ErrorKind::WouldBlock);

    // Landlock port rules (ABI 4+): network on, but only port 1 may be connected.
    let mut p = f.policy(vec![python.into(), "-c".into(), code.into(), port]);
    p.tcp_connect_ports = Some(vec![1]);
    let r = run(p).await.unwrap();
    if r.enforcement.tcp_ports_limited {
        assert_eq!(stdout(&r).trim(), format!("refused {}", nix::libc::EACCES));
        assert_eq!(listener.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    }
}

#[tokio::test]
async fn inherited_fds_are_closed_at_exec() {
    let Some(python) = python() else { return };
    // An fd opened without O_CLOEXEC, as a careless library might.
    let leaked = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDONLY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    let f = fixture();
    let p = f.policy(vec![
        python.into(),
        "-c".into(),
        "import os; print(sorted(int(x) for x in os.listdir('/proc/self/fd')))".into(),
    ]);
    let r = run(p).await.unwrap();
    let _ = nix::unistd::close(leaked);
    // 0-2 and the fd listdir itself holds.
    assert_eq!(stdout(&r).trim(), "[0, 1, 2, 3]");
}

#[tokio::test]
async fn stdin_reaches_the_script_and_stderr_keeps_only_a_tail() {
    let f = fixture();
    let script = f.script(
        "echo.sh",
        "#!/bin/sh\ncat\ni=0; while [ $i -lt 500 ]; do echo \"line $i\" >&2; i=$((i+1)); done\nexit 3\n",
    );
    let mut p = f.policy(vec![script]);
    p.stdin = b"{\"doc\":1}".to_vec();
    let r = run(p).await.unwrap();
    assert_eq!(r.status, ExitStatus::Code(3));
    assert_eq!(r.stdout, b"{\"doc\":1}");
    assert!(r.stderr_tail.len() <= policy::STDERR_TAIL_BYTES_DEFAULT);
    assert!(String::from_utf8_lossy(&r.stderr_tail).ends_with("line 499\n"));
}

#[tokio::test]
async fn stdout_over_the_cap_is_reported_not_truncated_silently() {
    let f = fixture();
    let mut p = f.policy(vec![
        "/bin/sh".into(),
        "-c".into(),
        "head -c 3000000 /dev/zero; sleep 30".into(),
    ]);
    p.stdout_cap_bytes = 1024 * 1024;
    let started = Instant::now();
    let r = run(p).await.unwrap();
    assert!(r.stdout_overflow);
    assert_eq!(r.stdout.len(), 1024 * 1024);
    assert!(!r.timed_out);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "killed at the cap, not at the deadline"
    );
}

#[tokio::test]
async fn programs_that_cannot_start_are_exec_failures() {
    let f = fixture();
    let err = run(f.policy(vec!["/nonexistent/script".into()]))
        .await
        .unwrap_err();
    assert!(err.is_exec_failure(), "{err}");
    let not_exec = f.script("plain.txt", "echo hi\n");
    std::fs::set_permissions(&not_exec, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = run(f.policy(vec![not_exec])).await.unwrap_err();
    assert!(err.is_exec_failure(), "{err}");
    // A script inside the denied home cannot be executed either.
    let inside = f.home.join("evil.sh");
    std::fs::write(&inside, "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut p = f.policy(vec![inside.to_string_lossy().into_owned()]);
    p.deny_paths = vec![f.home.clone()];
    match run(p).await {
        Err(e) => assert!(e.is_exec_failure(), "{e}"),
        Ok(r) => panic!("ran inside the home: {:?}", r.status),
    }
    let err = run(f.policy(vec!["relative".into()])).await.unwrap_err();
    assert!(matches!(err, SandboxError::Policy(_)));
}

#[tokio::test]
async fn the_private_tmp_dir_is_removed_after_the_run() {
    let f = fixture();
    let parent = tempfile::tempdir().unwrap();
    let mut p = f.policy(vec![
        "/bin/sh".into(),
        "-c".into(),
        "mkdir \"$TMPDIR/sub\" && echo x > \"$TMPDIR/sub/f\" && echo \"$TMPDIR\"".into(),
    ]);
    p.tmp_parent = Some(parent.path().to_path_buf());
    let r = run(p).await.unwrap();
    let tmp = PathBuf::from(stdout(&r).trim());
    assert!(tmp.starts_with(parent.path()));
    assert!(!tmp.exists());
    assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
}

#[test]
fn explain_names_the_grants_the_denials_and_the_kernel() {
    let f = fixture();
    let mut p = f.policy(vec!["/usr/bin/python3".into(), "/opt/x.py".into()]);
    p.network = false;
    let text = explain(&p);
    assert!(text.contains("no access: "), "{text}");
    assert!(text.contains(&f.home.display().to_string()), "{text}");
    assert!(text.contains("read+write: ") && text.contains(&f.state.display().to_string()));
    assert!(text.contains("network: off"), "{text}");
    assert!(text.contains("landlock: "), "{text}");
    assert!(text.contains("/etc (except /etc/"), "{text}");
    assert!(text.contains("SPOOL"), "names shown");
    assert!(!text.contains(&f.state.join("x").display().to_string()));
}

#[test]
fn required_refuses_when_a_layer_is_missing() {
    // The kernel here has both layers; exercise the refusal on a predicted report.
    let full = plan::predict(&Policy::new(vec!["/bin/true".into()], Instant::now()));
    let mut no_landlock = full;
    no_landlock.landlock = LandlockLevel::None;
    assert!(!no_landlock.complete());
    let mut no_seccomp = full;
    no_seccomp.seccomp = false;
    assert!(!no_seccomp.complete());
    if full.complete() {
        let mut p = Policy::new(vec!["/bin/true".into()], Instant::now());
        p.required = true;
        assert!(plan::prepare(&p).is_ok());
    }
}
