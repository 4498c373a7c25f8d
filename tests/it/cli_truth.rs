//! Issue 29 ("check, the CLI and the kit tell the whole truth"), through the real binary:
//! `check` reports every error of a file in one run; a relative `--home` is made absolute
//! once; read commands on a missing spool refuse instead of creating one; `retry` on a
//! batch it cannot take says which states it takes; the `run` banner names a command that
//! works.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use super::bin;
use super::ops::{AUDIT_SECRET, CONFIG, Env, seed};

/// `hookspool <args>` in `cwd`, with none of the path variables of the environment (the
/// ones in `env` set).
fn hs_in(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .current_dir(cwd)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_DB")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .env_remove("XDG_STATE_HOME")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run hookspool")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn private_dir(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(p).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)).unwrap();
}

fn private_file(p: &Path, content: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(p, content).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Issue 29: an http:// destination URL (a rule of the file) stopped `check` before it
/// looked at another destination's secret (a fact of the host): "1 error(s)".
#[test]
fn check_reports_every_error_of_a_file_in_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    private_dir(&home);
    private_file(&home.join("a.secret"), &format!("{AUDIT_SECRET}\n"));
    private_file(&home.join("b.secret"), "0123456789abcdef0123456789abcdef\n");
    let config = format!(
        r#"
[alerts]
argv = ["/bin/true"]

[destinations."http:a"]
type = "http"
url = "http://a.example.invalid/hook"
secret = {{ file = "{h}/a.secret" }}

[destinations."http:b"]
type = "http"
url = "https://b.example.invalid/hook"
secret = {{ file = "{h}/b.secret" }}
"#,
        h = home.display()
    );
    std::fs::write(home.join("config.toml"), config).unwrap();
    let h = home.display().to_string();
    let out = hs_in(dir.path(), &["--home", &h, "check"], &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}{}", text(&out.stderr));
    let file = format!("{h}/config.toml");
    let errors: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 2, "{stdout}");
    // Each names the file, the key and what to write instead.
    assert!(
        errors.contains(&format!("error: {file}: destinations.\"http:a\": url uses http://: write an https:// URL, or set allow_insecure = true (payloads and signatures then cross the network in clear)").as_str()),
        "{stdout}"
    );
    assert!(
        errors.iter().any(|l| l.starts_with(&format!(
            "error: {file}: destinations.\"http:b\".secret: not a Standard Webhooks secret"
        )) && l.contains("hookspool secret new")),
        "{stdout}"
    );
    assert!(
        text(&out.stderr).contains(&format!("check found 2 error(s) in {file}")),
        "{}",
        text(&out.stderr)
    );
    // The JSON form holds the same two.
    let out = hs_in(dir.path(), &["--home", &h, "--json", "check"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["errors"].as_array().map(Vec::len), Some(2), "{v}");
}

/// Issue 29: with `--home ./x` every processor and poll instance was refused with
/// "state_dir must be an absolute path", a key the operator never wrote.
#[test]
fn a_relative_home_is_made_absolute_before_a_processor_instance_is_expanded() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("x");
    private_dir(&home);
    private_file(
        &home.join("subs.json"),
        "{\"feed\": {\"secret\": \"x\", \"enabled\": true}}",
    );
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"
[alerts]
argv = ["/bin/true"]

[hermes]
subscriptions_path = "{}/subs.json"

[bobbins.feed]
bobbin = "hookspool.feed"
settings = {{ url = "https://feeds.example.org/atom.xml" }}
outputs = {{ entry = "hermes:feed" }}
"#,
            home.display()
        ),
    )
    .unwrap();
    for flag in ["./x", "x"] {
        let out = hs_in(dir.path(), &["--home", flag, "check"], &[]);
        let stdout = text(&out.stdout);
        assert!(!stdout.contains("must be an absolute path"), "{stdout}");
        assert_eq!(
            out.status.code(),
            Some(0),
            "--home {flag}: {stdout}{}",
            text(&out.stderr)
        );
    }
    // HOOKSPOOL_HOME is the same edge.
    let out = hs_in(dir.path(), &["check"], &[("HOOKSPOOL_HOME", "./x")]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // The processor's state directory is under the absolute home.
    let out = hs_in(
        dir.path(),
        &["--home", "./x", "--json", "bobbin", "expand"],
        &[],
    );
    let stdout = text(&out.stdout);
    let real = std::fs::canonicalize(dir.path()).unwrap().join("x");
    let want = format!("{}/", real.display());
    assert!(
        stdout.contains(&format!("\"state_dir\": \"{want}")),
        "{stdout}{}",
        text(&out.stderr)
    );
}

/// Issue 29: `hookspool issues` without `--home` beside a quick-start `run` created a spool
/// where the default pointed and answered "no open issues". A command that reads the spool
/// refuses a missing one (exit 2), says where it looked, and creates nothing.
#[test]
fn read_commands_on_a_missing_spool_exit_2_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nohome");
    let m = missing.display().to_string();
    for args in [
        &["status"][..],
        &["list"],
        &["show", "1"],
        &["issues"],
        &["metrics"],
        &["export"],
        &["prune"],
        &["replay", "1"],
        &["retry", "1"],
        &["split", "1", "--max-events", "1"],
        &["exclude", "1", "1", "--yes"],
        &["drop", "1", "--yes"],
        &["pause", "http:x"],
        &["resume", "http:x"],
    ] {
        let mut argv = vec!["--home", m.as_str()];
        argv.extend_from_slice(args);
        let out = hs_in(dir.path(), &argv, &[]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("no spool at {m}/spool.db")),
            "{args:?}: {err}"
        );
        assert!(err.contains("--home"), "where it looked: {args:?}: {err}");
        assert!(!err.contains("did you mean"), "{args:?}: {err}");
        assert!(!missing.exists(), "{args:?} created {m}");
    }
    // Beside a quick-start home: the hint, whatever named the missing one.
    private_dir(&dir.path().join("hookspool-home"));
    let out = hs_in(dir.path(), &["issues"], &[("HOOKSPOOL_HOME", &m)]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("HOOKSPOOL_HOME"), "{err}");
    assert!(
        err.contains("did you mean --home ./hookspool-home"),
        "{err}"
    );
    assert!(!missing.exists());
    // `run`'s home under XDG_STATE_HOME, when it holds a spool, from another directory.
    let state = dir.path().join("state");
    let run_home = state.join("hookspool");
    let out = hs_in(
        dir.path(),
        &["--home", &run_home.display().to_string(), "migrate"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let elsewhere = dir.path().join("elsewhere");
    private_dir(&elsewhere);
    let out = hs_in(
        &elsewhere,
        &["--home", &m, "status"],
        &[("XDG_STATE_HOME", &state.display().to_string())],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("did you mean --home {}?", run_home.display())),
        "{err}"
    );

    // A spool that exists is read; a home others can enter is warned about.
    let home = dir.path().join("home");
    let h = home.display().to_string();
    let out = hs_in(dir.path(), &["--home", &h, "migrate"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = hs_in(dir.path(), &["--home", &h, "list"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("warning"),
        "{}",
        text(&out.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = hs_in(dir.path(), &["--home", &h, "list"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!(
            "warning: the spool home {h} has mode 0755: group or others can enter it; run chmod 700 {h}"
        )),
        "{}",
        text(&out.stderr)
    );
}

/// Issue 29: `retry` on a delivered batch printed "batch 19 is delivered: retry needs retry".
#[test]
fn retry_on_a_delivered_batch_says_which_states_retry_takes() {
    let env = Env::new(CONFIG);
    seed(&env);
    let h = env.home.display().to_string();
    let out = hs_in(&env.home, &["--home", &h, "retry", "1"], &[]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        "hookspool: batch 1 is delivered: retry takes only a batch in state retry (waiting out its backoff); a dead batch is sent again with hookspool replay"
    );
}

/// Issue 29: after `cargo run -- run` the banner said `hookspool --home ...`, which is not
/// on PATH. It names the binary that is running unless PATH finds that same binary.
#[test]
fn the_run_banner_names_a_command_that_works() {
    let dir = tempfile::tempdir().unwrap();
    let home = std::fs::canonicalize(dir.path()).unwrap().join("hs");
    let tail = format!(" --home {} list", home.display());
    // Not on PATH: the binary's own path.
    let log = run_banner(
        dir.path(),
        "/usr/bin:/bin",
        &format!("Inspect with: {}{tail}", bin().display()),
    );
    assert!(!log.contains("Inspect with: hookspool "), "{log}");
    // PATH finds this binary (through a symlink, as an install into ~/.local/bin would):
    // the short name.
    let bin_dir = dir.path().join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    std::os::unix::fs::symlink(bin(), bin_dir.join("hookspool")).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin_dir.display());
    run_banner(dir.path(), &path, &format!("Inspect with: hookspool{tail}"));
}

/// Start `hookspool --home ./hs run` in `cwd` with `PATH`, wait for `want` in its banner,
/// stop it; the log.
fn run_banner(cwd: &Path, path: &str, want: &str) -> String {
    let port = super::run_e2e::free_port();
    let mut child = Command::new(bin())
        .args(["--home", "./hs", "run"])
        .current_dir(cwd)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .env_remove("JOURNAL_STREAM")
        .env("HOOKSPOOL_PORT", port.to_string())
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = super::capture_stderr(&mut child);
    let seen = super::eventually(std::time::Duration::from_secs(30), || {
        text(&log.lock().unwrap()).contains(want)
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = child.wait();
    let log = text(&log.lock().unwrap());
    assert!(seen, "expected {want:?} in\n{log}");
    log
}
