//! The files the packages ship and the systemd e2e test installs: the default
//! /etc/hookspool/config.toml validates strictly with no source, the e2e configs validate
//! with their sources, destination and built-in bobbin instance, and `hookspool generate` writes the man pages and
//! completions the packages install; the Grafana dashboard and the alerting rules (with
//! their promtool unit tests) query real metrics and both packages install them.

use std::path::{Path, PathBuf};
use std::process::Command;

use hookspool::config::{self, PathInputs};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Strict validation, as `hookspool check` does it: unknown keys are errors, and a warning
/// in a shipped file is a defect too.
fn assert_clean(name: &str, text: &str) -> config::Config {
    match config::parse(text, None, &PathInputs::default(), true) {
        Ok((c, warnings)) => {
            assert!(warnings.is_empty(), "{name}: warnings {warnings:?}");
            c
        }
        Err(problems) => panic!("{name}: {problems:#?}"),
    }
}

#[test]
fn default_config_validates_with_no_source() {
    let c = assert_clean("packaging/config.toml", &read("packaging/config.toml"));
    assert!(
        c.sources.is_empty(),
        "the default config must configure no source"
    );
    assert_eq!(c.home, PathBuf::from("/var/lib/hookspool"));
}

#[test]
fn e2e_configs_validate() {
    let base = read("tests/systemd/e2e-config.toml").replace("@RECEIVER_PORT@", "18651");
    let c = assert_clean("tests/systemd/e2e-config.toml", &base);
    assert!(c.sources.contains_key("demo"));
    assert!(c.destinations.contains_key("receiver"));
    let reloaded = base + &read("tests/systemd/e2e-config-reload.toml");
    let c = assert_clean("e2e-config.toml + e2e-config-reload.toml", &reloaded);
    assert!(c.sources.contains_key("demo2"));
    // Step 12's built-in bobbin instance expands to a github source.
    let with_bobbin = reloaded + &read("tests/systemd/e2e-config-bobbin.toml");
    let c = assert_clean("... + e2e-config-bobbin.toml", &with_bobbin);
    assert!(c.sources.contains_key("gh"), "{:?}", c.sources.keys());
}

#[test]
fn generate_writes_man_pages_and_completions() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (what, sub) in [("man", "man"), ("completions", "completions")] {
        let out = Command::new(crate::bin())
            .args(["generate", what])
            .arg(dir.path().join(sub))
            .output()
            .expect("run hookspool generate");
        assert!(out.status.success(), "generate {what}: {out:?}");
    }
    let man = std::fs::read_to_string(dir.path().join("man/hookspool.1")).expect("hookspool.1");
    assert!(man.contains(".TH hookspool 1"), "{man}");
    assert!(dir.path().join("man/hookspool-enqueue.1").exists());
    assert!(
        !dir.path().join("man/hookspool-generate.1").exists(),
        "the hidden command gets no page"
    );
    for f in ["hookspool", "_hookspool", "hookspool.fish"] {
        let text = std::fs::read_to_string(dir.path().join("completions").join(f)).expect(f);
        assert!(text.contains("enqueue"), "{f} completes the commands");
    }
}

/// Issue 29: no configuration reference shipped (the config's comment sent the reader to a
/// spec the packages do not hold and to `man hookspool`, which covers the CLI).
/// `generate man` writes hookspool.toml(5) beside the CLI's pages, with every key, and both
/// packages install it (and docs/configuration.md) where `man hookspool.toml` finds it.
#[test]
fn the_configuration_reference_is_a_man_page_in_both_packages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(crate::bin())
        .args(["generate", "man"])
        .arg(dir.path())
        .output()
        .expect("run hookspool generate");
    assert!(out.status.success(), "{out:?}");
    let page =
        std::fs::read_to_string(dir.path().join("hookspool.toml.5")).expect("hookspool.toml.5");
    assert!(page.starts_with(".TH HOOKSPOOL.TOML 5"), "{page}");
    for key in [
        "spool.home",
        "dispatch.breaker.trip_after",
        "routes[].match",
        "bobbins.<name>.outputs",
    ] {
        let roff = key.replace('-', "\\-");
        assert!(page.contains(&format!(".B {roff}\n")), "{key} in the page");
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    assert!(read("debian/rules").contains("usr/share/man/man5 $(GEN)/man/*.5"));
    assert!(
        read("debian/hookspool.docs")
            .lines()
            .any(|l| l == "docs/configuration.md")
    );
    let spec = read("rpm/hookspool.spec");
    assert!(spec.contains("%{_mandir}/man5 generated/man/*.5"));
    assert!(spec.contains("%{_mandir}/man5/hookspool.toml.5*"));
    assert!(spec.contains("docs/configuration.md"));
    for shipped in ["packaging/config.toml", "src/cli/starter.toml"] {
        assert!(
            read(shipped).contains("man hookspool.toml"),
            "{shipped} points at the reference"
        );
    }
}

/// Issue 29: tests/systemd/build-next.sh compiled the upgrade test's binary, the one with a
/// probe migration, over the checkout's target/release/hookspool, and a soak run afterwards
/// migrated its spool past every release. The script's target directory (its own line,
/// evaluated by bash as the script does) is a directory of its own, under the caller's
/// CARGO_TARGET_DIR or the checkout's target/; and the build says it is a test build.
#[test]
fn build_next_compiles_in_a_target_directory_of_its_own() {
    let script = read("tests/systemd/build-next.sh");
    let line = script
        .lines()
        .find(|l| l.starts_with("export CARGO_TARGET_DIR="))
        .expect("build-next.sh exports CARGO_TARGET_DIR");
    for caller in [None, Some("/elsewhere/target")] {
        let mut c = Command::new("bash");
        c.arg("-c")
            .arg(format!(
                "repo=/repo; {line}; printf %s \"$CARGO_TARGET_DIR\""
            ))
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("HOOKSPOOL_NEXT_TARGET_DIR");
        if let Some(t) = caller {
            c.env("CARGO_TARGET_DIR", t);
        }
        let out = c.output().expect("bash");
        assert!(out.status.success(), "{line}");
        let dir = String::from_utf8(out.stdout).unwrap();
        let shared = caller.unwrap_or("/repo/target");
        assert!(
            dir.starts_with(&format!("{shared}/")),
            "{caller:?}: {dir} is not below {shared}"
        );
        assert!(
            !Path::new(&dir)
                .join("release/hookspool")
                .starts_with(format!("{shared}/release")),
            "{caller:?}: {dir} builds over {shared}/release/hookspool"
        );
    }
    assert!(
        script.contains("export HOOKSPOOL_TEST_BUILD="),
        "build-next.sh does not mark its build"
    );
    assert!(read("build.rs").contains("\"HOOKSPOOL_TEST_BUILD\""));
}

/// Issue 35's operations files: the alerting rules pass `promtool check rules` and their
/// unit tests (`promtool test rules`, one test per rule, firing and quiet cases); every
/// metric the rules and the dashboard query is a family on a real /metrics page (a
/// histogram's `_bucket`/`_count`/`_sum` of a histogram family); every dashboard query is
/// valid PromQL (promtool checks them as recording rules, with Grafana's variables
/// substituted); and both packages install the three files.
#[test]
fn the_dashboard_and_alerting_rules_query_real_metrics_and_their_rule_tests_pass() {
    const PROMTOOL: &str = "/usr/bin/promtool";
    let dir = repo("packaging/monitoring");
    let rules = read("packaging/monitoring/hookspool-alerts.yml");
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("packaging/monitoring/hookspool-dashboard.json"))
            .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    let mut stack = vec![&dashboard];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::String(e)) = m.get("expr") {
                    exprs.push(e.clone());
                }
                stack.extend(m.values());
            }
            serde_json::Value::Array(a) => stack.extend(a.iter()),
            _ => {}
        }
    }
    assert!(exprs.len() >= 15, "{} queries", exprs.len());

    // The families a real intake serves (its counters, the histograms, the table gauges).
    let intake = super::intake::start("");
    let page = super::intake::get(intake.addr, "/metrics");
    assert_eq!(page.status, 200);
    let page = String::from_utf8_lossy(&page.body).to_string();
    let types: std::collections::BTreeMap<&str, &str> = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let names = |text: &str| -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(i) = rest.find("hookspool_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            out.push(tail[..end].to_string());
            rest = &tail[end..];
        }
        out
    };
    let mut queried = 0;
    for text in exprs.iter().map(String::as_str).chain([rules.as_str()]) {
        for name in names(text) {
            queried += 1;
            let known = types.contains_key(name.as_str())
                || ["_bucket", "_count", "_sum"].iter().any(|s| {
                    name.strip_suffix(s)
                        .is_some_and(|base| types.get(base) == Some(&"histogram"))
                });
            assert!(known, "{name} is not a family on /metrics:\n{page}");
        }
    }
    assert!(queried >= 25, "{queried} metric names checked");

    let installs = |text: &str, file: &str| text.contains(&format!("packaging/monitoring/{file}"));
    let deb = read("debian/rules");
    let spec = read("rpm/hookspool.spec");
    for file in [
        "hookspool-dashboard.json",
        "hookspool-alerts.yml",
        "hookspool-alerts.test.yml",
    ] {
        assert!(installs(&deb, file), "debian/rules installs {file}");
        assert!(installs(&spec, file), "the rpm spec installs {file}");
    }

    if !Path::new(PROMTOOL).exists() {
        super::skip::skip_or_fail(&format!(
            "promtool check/test rules: {PROMTOOL} is absent (Debian package prometheus)"
        ));
        return;
    }
    let promtool = |args: &[&str], cwd: &Path| {
        let out = Command::new(PROMTOOL)
            .args(args)
            .current_dir(cwd)
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let checked = promtool(&["check", "rules", "hookspool-alerts.yml"], &dir);
    assert!(checked.contains("SUCCESS: 6 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "hookspool-alerts.test.yml"], &dir);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Each rule has its unit test.
    let tests = read("packaging/monitoring/hookspool-alerts.test.yml");
    for alert in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "{alert} has no unit test"
        );
    }
    // The dashboard's queries as recording rules: promtool parses each.
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut as_rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = e
            .replace("$__rate_interval", "5m")
            .replace("$instance", ".*");
        as_rules.push_str(&format!(
            "      - record: dashboard:q{i}\n        expr: {}\n",
            serde_json::Value::String(e)
        ));
    }
    std::fs::write(tmp.path().join("dashboard.yml"), as_rules).expect("write");
    let checked = promtool(&["check", "rules", "dashboard.yml"], tmp.path());
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "{checked}"
    );
}

/// The value of `key=` in a unit file (the last one wins, as in systemd).
fn unit_value(unit: &str, key: &str) -> Option<String> {
    unit.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}=")))
        .map(str::to_string)
}

/// Issue 31: the management API's systemd pair. The socket is /run/hookspool/admin.sock,
/// mode 0660, group hookspool-admin (created by sysusers.d); its service is Type=notify,
/// runs `hookspool admin --idle-exit`, is hardened like the intake (but keeps the callers'
/// uids: no PrivateUsers), and both packages install the pair, enable the socket and ship the
/// nginx example that publishes it behind the proxy's own authentication.
#[test]
fn the_admin_socket_and_service_are_shipped_and_hardened() {
    let socket = read("units/hookspool-admin.socket");
    for (k, v) in [
        ("ListenStream", "/run/hookspool/admin.sock"),
        ("SocketMode", "0660"),
        ("SocketGroup", "hookspool-admin"),
        ("SocketUser", "root"),
        ("FileDescriptorName", "admin"),
        ("WantedBy", "sockets.target"),
    ] {
        assert_eq!(unit_value(&socket, k).as_deref(), Some(v), "socket {k}");
    }
    let service = read("units/hookspool-admin.service");
    for (k, v) in [
        ("Type", "notify"),
        ("Requires", "hookspool-admin.socket"),
        ("User", "hookspool"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateNetwork", "yes"),
        ("RestrictAddressFamilies", "AF_UNIX"),
        ("MemoryDenyWriteExecute", "yes"),
        ("SystemCallArchitectures", "native"),
    ] {
        assert_eq!(unit_value(&service, k).as_deref(), Some(v), "service {k}");
    }
    assert_eq!(
        unit_value(&service, "PrivateUsers"),
        None,
        "a private user namespace would hide the callers' uids"
    );
    let exec = unit_value(&service, "ExecStart").expect("ExecStart");
    assert!(
        exec.starts_with("/usr/bin/hookspool admin ") && exec.contains("--idle-exit "),
        "{exec}"
    );
    // The idle period parses as the binary parses it.
    let period = exec.split("--idle-exit ").nth(1).unwrap().split(' ').next();
    assert!(humantime::parse_duration(period.unwrap()).is_ok(), "{exec}");
    // The intake's hardening lines are all here too, except PrivateUsers (said above).
    let intake = read("units/hookspool-intake.service");
    for key in [
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectControlGroups",
        "ProtectProc",
        "LockPersonality",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "RestrictNamespaces",
    ] {
        assert_eq!(
            unit_value(&service, key),
            unit_value(&intake, key),
            "{key} as in the intake"
        );
    }
    assert!(
        read("sysusers.d/hookspool.conf")
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["g", "hookspool-admin"])),
        "sysusers.d creates the group"
    );
    let rules = read("debian/rules");
    let spec = read("rpm/hookspool.spec");
    for unit in ["hookspool-admin.socket", "hookspool-admin.service"] {
        assert!(
            rules.contains(&format!("units/{unit}")),
            "debian/rules {unit}"
        );
        assert!(
            spec.contains(&format!("units/{unit}")),
            "spec installs {unit}"
        );
        assert!(
            spec.contains(&format!("%{{_unitdir}}/{unit}\n")),
            "spec %files {unit}"
        );
    }
    assert!(rules.contains(
        "dh_installsystemd --no-stop-on-upgrade --no-restart-after-upgrade hookspool-admin.socket"
    ));
    assert!(spec.contains(
        "%systemd_post hookspool-intake.socket hookspool-dispatch.service hookspool-admin.socket"
    ));
    assert!(
        read("packaging/systemd/80-hookspool.preset")
            .lines()
            .any(|l| l == "enable hookspool-admin.socket")
    );
    let nginx = read("packaging/nginx/hookspool-admin.conf");
    for needed in [
        "server unix:/run/hookspool/admin.sock;",
        "proxy_set_header Host 127.0.0.1;",
        "auth_basic_user_file",
        "satisfy all;",
        "usermod -aG hookspool-admin www-data",
        "proxy_buffering off;",
    ] {
        assert!(nginx.contains(needed), "the nginx example: {needed}");
    }
    for (file, dest) in [
        (
            &rules,
            "$(PKG)/usr/share/doc/hookspool/examples/nginx/hookspool-admin.conf",
        ),
        (
            &spec,
            "%{buildroot}%{_docdir}/%{name}/examples/nginx/hookspool-admin.conf",
        ),
    ] {
        assert!(
            file.contains(&format!("packaging/nginx/hookspool-admin.conf {dest}")),
            "{dest}"
        );
    }
}
