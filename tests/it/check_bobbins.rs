//! Issue 29 ("check says ok about things that will fail"), for bobbin instances, through the
//! real binary: a setting the processor or poller would refuse at every run is refused by
//! the expansion (check, start and reload), and the destinations a processor bobbin's
//! outputs feed are checked as fed.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::bin;

fn hs(home: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .env_remove("XDG_STATE_HOME")
        .stdin(Stdio::null())
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

/// A home with a gateway subscriptions file for the route `feed` and a config holding one
/// hookspool.feed instance whose feed is at `url`.
fn feed_home(url: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    private_dir(home);
    private_file(
        &home.join("subs.json"),
        "{\"feed\": {\"secret\": \"x\", \"enabled\": true}}",
    );
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"[alerts]
argv = ["/bin/true"]

[intake]
listen = "127.0.0.1:{port}"

[hermes]
subscriptions_path = "{home}/subs.json"

[bobbins.feed]
bobbin = "hookspool.feed"
settings = {{ url = "{url}" }}
outputs = {{ entry = "hermes:feed" }}
"#,
            port = super::run_e2e::free_port(),
            home = home.display()
        ),
    )
    .unwrap();
    dir
}

/// Issue 29: `hookspool.feed` with `url = "http://..."` passed check, then every tick died
/// permanent ("setting url must be an https URL"). The manifest says `format =
/// "https-url"`, and the expansion refuses the value on every path that loads the config.
#[test]
fn check_refuses_a_bobbin_setting_its_poller_would_refuse_at_every_run() {
    let good = feed_home("https://feeds.example.org/atom.xml");
    let o = hs(good.path(), &["check"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    let bad = feed_home("http://feeds.example.org/atom.xml");
    let want = "bobbins.feed.settings.url: \"http://feeds.example.org/atom.xml\" is not an https URL; write the https:// address";
    let o = hs(bad.path(), &["check"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains(want), "{want} not in:\n{}", text(&o));
    // reload runs the same check, and touches nothing.
    let o = hs(bad.path(), &["reload"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains(want), "{want} not in:\n{}", text(&o));
    // A start refuses it too (the services' own load).
    let mut child = Command::new(bin())
        .arg("--home")
        .arg(bad.path())
        .arg("run")
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("run started on the bad setting:\n{}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let o = child.wait_with_output().unwrap();
    assert_eq!(status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("bobbins.feed.settings.url"),
        "{}",
        text(&o)
    );
}

/// A home with a google.gmail instance (a processor bobbin) whose outputs go to
/// `hermes:mail` and `hermes:sched`, the gateway's subscriptions file `subs`, and `extra`
/// appended to the config.
fn gmail_home(subs: &str, instance_extra: &str, extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    private_dir(home);
    private_file(&home.join("subs.json"), subs);
    private_file(&home.join("push"), "hookspool-kit-gmail-push-token");
    private_file(&home.join("cred"), "{}");
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"[alerts]
argv = ["/bin/true"]

[hermes]
subscriptions_path = "{home}/subs.json"

[bobbins.gmail]
bobbin = "google.gmail"
secrets.push_token = {{ file = "{home}/push" }}
secrets.cred_owner = {{ file = "{home}/cred" }}
settings = {{ owner = "user@example.com" }}
outputs = {{ mail = "hermes:mail", scheduling = "hermes:sched" }}
{instance_extra}
{extra}"#,
            home = home.display()
        ),
    )
    .unwrap();
    dir
}

/// Issue 29: `check` skipped the destinations a processor bobbin's outputs feed: the Hermes
/// subscription (route exists, has a secret, no `events`/`coalesce`) and the 0.75 size bound
/// were not checked for them, and check called them unfed. Outputs are feeds.
#[test]
fn check_treats_a_processor_bobbins_outputs_as_feeds() {
    let subs_ok =
        r#"{"mail": {"secret": "x", "enabled": true}, "sched": {"secret": "y", "enabled": true}}"#;
    let table = "\n[destinations.\"hermes:mail\"]\ntimeout_s = 20\n";
    let ok = gmail_home(subs_ok, "", table);
    let o = hs(ok.path(), &["check"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        !text(&o).contains("no route or source action delivers to it"),
        "an output feeds hermes:mail: {}",
        text(&o)
    );

    // The gateway's file: sched missing, mail with events and coalesce.
    let subs_bad =
        r#"{"mail": {"secret": "x", "enabled": true, "events": ["a"], "coalesce": true}}"#;
    let bad = gmail_home(subs_bad, "", table);
    let o = hs(bad.path(), &["check"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    for want in [
        "destinations.\"hermes:sched\": route \"sched\" is not in the hermes subscriptions file",
        "destinations.\"hermes:mail\": hermes route \"mail\" sets events",
        "destinations.\"hermes:mail\": hermes route \"mail\" sets coalesce",
    ] {
        assert!(out.contains(want), "{want} not in:\n{out}");
    }

    // The size bound: a document of the instance's window must fit 0.75 x the
    // destination's body limit.
    let small = gmail_home(
        subs_ok,
        "max_bytes = 65536",
        "\n[destinations.\"hermes:sched\"]\nmax_body_bytes = 4096\n",
    );
    let o = hs(small.path(), &["check"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    let want = "bobbins.gmail.max_bytes: 65536 is over 0.75 x the max_body_bytes 4096 of hermes:sched: a full batch would be refused (413); write max_bytes = 3072";
    assert!(out.contains(want), "{want} not in:\n{out}");
    // Two outputs to one destination are one feed (one route, one window): said once.
    let config = small.path().join("config.toml");
    let edited = std::fs::read_to_string(&config)
        .unwrap()
        .replace("mail = \"hermes:mail\"", "mail = \"hermes:sched\"");
    std::fs::write(&config, edited).unwrap();
    let o = hs(small.path(), &["check"]);
    let out = text(&o);
    assert_eq!(out.matches(want).count(), 1, "{out}");
}
