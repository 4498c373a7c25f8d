//! Issue 29, security: a private bobbin's code (the processor or poller its manifest runs,
//! and the files it declares it loads) is held to 14.3.6's owner and mode rules through the
//! real binary: `check` refuses a file or a directory up to the bobbin root that others can
//! change, naming the file, the manifest key and the fix; and the dispatcher refuses to run
//! it (a config-class retry with an issue), so a file changed after the check is caught.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use super::bin;
use super::run_e2e::{RunProc, free_port, reserved_port};

/// A Standard Webhooks secret (whsec_ and the base64 of 32 bytes) for the http destination.
const DEST_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwMfKQ9r8GKYo=";

fn hs(home: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
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

fn mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// A home holding a private bobbin root with the kit fixture's exec processor bobbin
/// (acme.widgets, `exec = "processor.sh"`) and a config with one instance of it; returns
/// the bobbin's directory.
fn setup(home: &Path, port: u16) -> PathBuf {
    let root = home.join("bobbins");
    copy_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bobbins/broken-processor"),
        &root,
    );
    for d in [&root, &root.join("acme"), &root.join("acme/widgets")] {
        mode(d, 0o755);
    }
    for (name, value) in [("widgets", "It's a Secret"), ("receiver", DEST_SECRET)] {
        std::fs::write(home.join(name), value).unwrap();
        mode(&home.join(name), 0o600);
    }
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"[intake]
listen = "127.0.0.1:{port}"

[alerts]
argv = ["/bin/true"]

[dispatch]
poll_s = 0.2

[spool]
bobbin_path = ["{root}"]

[bobbins.widgets]
bobbin = "acme.widgets"
secrets.secret = {{ file = "{home}/widgets" }}
outputs = {{ "widget.changed" = "receiver" }}
span = "immediate"

[destinations.receiver]
type = "http"
url = "http://127.0.0.1:9/hook"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{home}/receiver" }}
"#,
            root = root.display(),
            home = home.display(),
        ),
    )
    .unwrap();
    root.join("acme/widgets")
}

/// `check`'s exit code and its output.
fn check(home: &Path) -> (Option<i32>, String) {
    let o = hs(home, &["check"]);
    (o.status.code(), text(&o))
}

#[test]
fn bobbin_code_others_can_change_is_refused_by_check_naming_file_key_and_fix() {
    let home = tempfile::tempdir().unwrap();
    let dir = setup(home.path(), free_port());
    let manifest = dir.join("bobbin.toml");
    let exec = dir.join("processor.sh");
    let (code, out) = check(home.path());
    assert_eq!(code, Some(0), "the fixture as shipped passes: {out}");

    // The executable the manifest names, writable by everyone.
    mode(&exec, 0o777);
    let (code, out) = check(home.path());
    assert_eq!(code, Some(2), "{out}");
    let want = format!(
        "bobbins.widgets: {e} (processor.exec in {m}): {e} is group- or other-writable (mode 777); run chmod go-w {e}",
        e = exec.display(),
        m = manifest.display()
    );
    assert!(out.contains(&want), "{want} not in:\n{out}");
    mode(&exec, 0o755);

    // A file it declares it loads, in a directory others can write.
    let text = std::fs::read_to_string(&manifest).unwrap().replace(
        "exec = \"processor.sh\"\n",
        "exec = \"processor.sh\"\nloads = [\"lib/common.sh\"]\n",
    );
    std::fs::write(&manifest, text).unwrap();
    let lib = dir.join("lib");
    std::fs::create_dir(&lib).unwrap();
    std::fs::write(lib.join("common.sh"), "# shared\n").unwrap();
    mode(&lib.join("common.sh"), 0o644);
    mode(&lib, 0o757);
    let (code, out) = check(home.path());
    assert_eq!(code, Some(2), "{out}");
    let want = format!(
        "(processor.loads[0] in {m}): {l} is group- or other-writable (mode 757); run chmod go-w {l}",
        m = manifest.display(),
        l = lib.display()
    );
    assert!(out.contains(&want), "{want} not in:\n{out}");
    mode(&lib, 0o755);
    let (code, out) = check(home.path());
    assert_eq!(code, Some(0), "{out}");

    // A declared file that is missing.
    std::fs::remove_file(lib.join("common.sh")).unwrap();
    let (code, out) = check(home.path());
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("does not exist; install the bobbin's file or fix processor.loads[0]"),
        "{out}"
    );
    std::fs::write(lib.join("common.sh"), "# shared\n").unwrap();
    mode(&lib.join("common.sh"), 0o644);

    // Owned by another user (only root can give a file away).
    if nix::unistd::geteuid().is_root() {
        nix::unistd::chown(&exec, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        let (code, out) = check(home.path());
        assert_eq!(code, Some(2), "{out}");
        let want = format!(
            "{e} is owned by uid 65534; it must belong to root or to the user hookspool runs as",
            e = exec.display()
        );
        assert!(out.contains(&want), "{want} not in:\n{out}");
        assert!(out.contains("processor.exec"), "{out}");
    }
}

#[test]
fn bobbin_code_changed_after_check_is_refused_by_the_dispatcher_with_a_config_issue() {
    let home = tempfile::tempdir().unwrap();
    let port = reserved_port();
    let dir = setup(home.path(), port);
    let exec = dir.join("processor.sh");
    let (code, out) = check(home.path());
    assert_eq!(code, Some(0), "{out}");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let p = RunProc::start(home.path(), addr, &[]);
    // After the check and the start: anyone may now rewrite the processor.
    mode(&exec, 0o777);
    let mut enqueue = Command::new(bin())
        .arg("--home")
        .arg(home.path())
        .args(["enqueue", "--source", "widgets", "--key", "w-1"])
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    enqueue
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"widget": {"id": "w-1"}}"#)
        .unwrap();
    let o = enqueue.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let until = Instant::now() + Duration::from_secs(30);
    let (attempt, issue) = loop {
        let o = hs(home.path(), &["--json", "show", "1", "--attempts"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let attempt = v["attempts"]
            .as_array()
            .and_then(|a| a.first())
            .filter(|a| !a["finished_at"].is_null())
            .cloned();
        let o = hs(home.path(), &["--json", "issues"]);
        let issues: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let issue = issues.as_array().and_then(|a| {
            a.iter()
                .find(|i| i["fingerprint"] == "config:delivery:script:widgets")
                .cloned()
        });
        if let (Some(a), Some(i)) = (attempt, issue) {
            break (a, i);
        }
        assert!(
            Instant::now() < until,
            "no refused attempt and config issue; log:\n{}",
            p.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(attempt["klass"], "config", "{attempt:#}");
    assert_eq!(attempt["outcome"], "retry", "{attempt:#}");
    let refused = format!(
        "{e} (processor.exec in {m}): {e} is group- or other-writable (mode 777); run chmod go-w {e}",
        e = exec.display(),
        m = dir.join("bobbin.toml").display()
    );
    let said = attempt["error"].as_str().unwrap_or_default();
    assert!(said.contains(&refused), "{refused} not in {attempt:#}");
    assert_eq!(issue["last_error"], "bobbin code unsafe", "{issue:#}");
    assert!(
        p.log().contains("reason=bobbin code unsafe klass=config"),
        "{}",
        p.log()
    );
    // Retried (the operator's fix needs no replay), never run: the batch is not dead.
    let o = hs(home.path(), &["--json", "show", "1"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["batch"]["state"], "retry", "{v:#}");
}

/// A home with a google.gmail instance whose hooks program (14.3.6) is `hooks/gmail.sh`
/// under the home; returns the program's path.
fn gmail_hooks_home(home: &Path, port: u16) -> PathBuf {
    for (name, value) in [
        ("push", "hookspool-kit-gmail-push-token"),
        ("cred", "{}"),
        ("receiver", DEST_SECRET),
    ] {
        std::fs::write(home.join(name), value).unwrap();
        mode(&home.join(name), 0o600);
    }
    let hooks = home.join("hooks");
    std::fs::create_dir(&hooks).unwrap();
    mode(&hooks, 0o755);
    let program = hooks.join("gmail.sh");
    std::fs::write(&program, "#!/bin/sh\ncat > /dev/null\necho null\n").unwrap();
    mode(&program, 0o755);
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"[intake]
listen = "127.0.0.1:{port}"

[alerts]
argv = ["/bin/true"]

[dispatch]
poll_s = 0.2

[bobbins.gmail]
bobbin = "google.gmail"
secrets.push_token = {{ file = "{home}/push" }}
secrets.cred_owner = {{ file = "{home}/cred" }}
settings = {{ owner = "user@example.com", hooks = "{program}" }}
outputs = {{ mail = "receiver" }}
span = "immediate"

[destinations.receiver]
type = "http"
url = "http://127.0.0.1:9/hook"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{home}/receiver" }}
"#,
            home = home.display(),
            program = program.display(),
        ),
    )
    .unwrap();
    program
}

#[test]
fn bobbin_hooks_program_others_can_change_is_refused_by_check_and_the_dispatcher() {
    let home = tempfile::tempdir().unwrap();
    let port = reserved_port();
    let program = gmail_hooks_home(home.path(), port);
    let (code, out) = check(home.path());
    assert_eq!(code, Some(0), "{out}");

    mode(&program, 0o777);
    let (code, out) = check(home.path());
    assert_eq!(code, Some(2), "{out}");
    let want = format!(
        "bobbins.gmail.settings.hooks: {p} is group- or other-writable (mode 777); run chmod go-w {p}",
        p = program.display()
    );
    assert!(out.contains(&want), "{want} not in:\n{out}");
    mode(&program, 0o755);
    mode(program.parent().unwrap(), 0o775);
    let (code, out) = check(home.path());
    assert_eq!(code, Some(2), "the directory above it too: {out}");
    assert!(
        out.contains(&format!(
            "{} is group- or other-writable (mode 775)",
            program.parent().unwrap().display()
        )),
        "{out}"
    );
    mode(program.parent().unwrap(), 0o755);

    // Changed after the check and the start: the dispatcher refuses to start the processor.
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let p = RunProc::start(home.path(), addr, &[]);
    mode(&program, 0o777);
    let mut enqueue = Command::new(bin())
        .arg("--home")
        .arg(home.path())
        .args(["enqueue", "--source", "gmail", "--key", "user@example.com"])
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    enqueue
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"sweep": true}"#)
        .unwrap();
    let o = enqueue.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let until = Instant::now() + Duration::from_secs(30);
    let attempt = loop {
        let o = hs(home.path(), &["--json", "show", "1", "--attempts"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        if let Some(a) = v["attempts"]
            .as_array()
            .and_then(|a| a.first())
            .filter(|a| !a["finished_at"].is_null())
        {
            break a.clone();
        }
        assert!(Instant::now() < until, "no attempt; log:\n{}", p.log());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(attempt["klass"], "config", "{attempt:#}");
    let want = format!(
        "settings.hooks: {} is group- or other-writable (mode 777)",
        program.display()
    );
    assert!(
        attempt["error"].as_str().is_some_and(|e| e.contains(&want)),
        "{want} not in {attempt:#}"
    );
}
