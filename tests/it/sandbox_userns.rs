//! The real `hookspool dispatch`, run as an unprivileged uid (as the packaged
//! hookspool-dispatch.service runs it): a script destination with `network = false` runs in a
//! new user namespace around its network namespace, and there it is still the dispatcher's
//! user. Unmapped, getuid() in that namespace answers the overflow uid (65534, "nobody"),
//! which is what a bobbin's processor saw under the systemd unit.
//!
//! Needs root (to start the binary as another uid with setpriv) and setpriv; says SKIPPED
//! without them.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::bin;
use super::skip::skip_or_fail;

/// An unprivileged uid and gid no account on a test host is expected to hold; not 65534,
/// which is the overflow id an unmapped namespace reports.
const TEST_ID: u32 = 4243;
const WAIT_S: u64 = 30;

fn as_test_user(home: &Path) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={TEST_ID}"))
        .arg(format!("--regid={TEST_ID}"))
        .args(["--clear-groups", "--inh-caps=-all", "--bounding-set=-all"])
        .arg(bin())
        .arg("--home")
        .arg(home)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .env_remove("NOTIFY_SOCKET");
    c
}

fn chown_to_test_user(p: &Path) {
    std::os::unix::fs::chown(p, Some(TEST_ID), Some(TEST_ID)).unwrap();
}

#[test]
fn network_off_script_of_an_unprivileged_dispatcher_keeps_its_uid() {
    if !nix::unistd::geteuid().is_root() {
        skip_or_fail("starting the dispatcher as another uid needs root");
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        skip_or_fail("setpriv (util-linux) is not installed");
        return;
    }
    let home_dir = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let home = home_dir.path();
    for d in [home, scripts.path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        chown_to_test_user(d);
    }
    let script = scripts.path().join("whoami.sh");
    super::executable(
        &script,
        "#!/bin/sh\ncat > /dev/null\necho \"$(id -u) $(id -g)\" > \"$HOOKSPOOL_STATE_DIR/ids.tmp\"\nmv \"$HOOKSPOOL_STATE_DIR/ids.tmp\" \"$HOOKSPOOL_STATE_DIR/ids\"\n",
    );
    let config = home.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "{}sandbox.network = false\n",
            super::script_source_config(home, "whoami", &script)
        ),
    )
    .unwrap();
    chown_to_test_user(&config);

    let mut c = as_test_user(home)
        .args(["enqueue", "--source", "s", "--key", "k"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(br#"{"n":1}"#).unwrap();
    assert!(c.wait().unwrap().success(), "enqueue as uid {TEST_ID}");

    let mut d = as_test_user(home)
        .arg("dispatch")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ids = home.join("state/ids");
    let until = Instant::now() + Duration::from_secs(WAIT_S);
    while !ids.exists() && Instant::now() < until && d.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = d.kill();
    let out = d.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let seen = std::fs::read_to_string(&ids)
        .unwrap_or_else(|e| panic!("the script wrote no ids within {WAIT_S}s ({e}): {stderr}"));
    assert_eq!(
        seen.trim(),
        format!("{TEST_ID} {TEST_ID}"),
        "the script's uid and gid inside its user namespace"
    );
}
