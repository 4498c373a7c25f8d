use super::*;
use std::path::Path;

fn parse_ok(text: &str) -> (Config, Vec<Problem>) {
    parse(text, None, &PathInputs::default(), true).unwrap_or_else(|e| panic!("{e:?}"))
}

fn parse_err(text: &str) -> Vec<Problem> {
    parse(text, None, &PathInputs::default(), true).expect_err("should fail")
}

#[test]
fn empty_config_has_every_default() {
    let (c, w) = parse_ok("");
    assert!(w.is_empty());
    assert_eq!(c.home, PathBuf::from(DEFAULT_HOME));
    assert_eq!(c.db, PathBuf::from("/var/lib/hookspool/spool.db"));
    assert_eq!(c.intake.listen, vec!["127.0.0.1:8650"]);
    assert_eq!(c.intake.max_body_bytes, 1_048_576);
    assert_eq!(c.dispatch.parallel, 4);
    assert_eq!(c.dispatch.breaker.trip_after, 3);
    assert_eq!(c.dispatch.backoff_cap_s, 300.0);
    assert_eq!(
        c.coalesce,
        Window {
            quiet_s: 0.0,
            max_s: 0.0,
            max_events: 500,
            max_bytes: 786_432
        }
    );
    assert_eq!(c.min_free_bytes, 536_870_912);
    assert_eq!(c.retention.attempts_days, 30.0);
    assert_eq!(c.alerts.rate_limit_s, 1800.0);
    assert_eq!(
        c.spans["burst"],
        Span {
            quiet_s: 120.0,
            max_s: 600.0
        }
    );
    assert_eq!(c.spans.len(), 6);
}

#[test]
fn unknown_keys_are_errors_in_check_and_warnings_at_runtime() {
    let text = "[dispatch]\nparalel = 4\n[sources.github]\nspann = \"burst\"\n";
    let errs = parse_err("[dispatch]\nparalel = 4\n");
    assert_eq!(errs[0].key, "dispatch.paralel");
    assert!(errs[0].message.contains("unknown key"));
    let (c, warnings) = parse(text, None, &PathInputs::default(), false).unwrap();
    let keys: Vec<&str> = warnings.iter().map(|w| w.key.as_str()).collect();
    assert_eq!(keys, ["dispatch.paralel", "sources.github.spann"]);
    assert!(
        !c.sources["github"].options.contains_key("spann"),
        "an unknown key is left out, so the source builds"
    );
    let errs = parse_err(text);
    assert!(
        errs.iter().any(|e| e.key == "sources.github.spann"),
        "{errs:?}"
    );
}

#[test]
fn unknown_keys_in_sources_and_destinations_are_runtime_warnings_not_errors() {
    let text = r#"
[sources.t]
scheme = "static-token"
header = "X-Token"
key = "all"
action = "http-x"
skeme = "typo"
[destinations.http-x]
type = "http"
url = "https://x.invalid/"
secret = { file = "/nonexistent" }
tiemout_s = 3
"#;
    let (c, warnings) = parse(text, None, &PathInputs::default(), false).expect("runs");
    let keys: Vec<&str> = warnings.iter().map(|w| w.key.as_str()).collect();
    assert!(keys.contains(&"sources.t.skeme"), "{keys:?}");
    assert!(
        keys.contains(&"destinations.\"http-x\".tiemout_s"),
        "{keys:?}"
    );
    assert!(matches!(
        c.destinations["http-x"].spec,
        DestinationSpec::Http(_)
    ));
    let errs = parse_err(text);
    assert_eq!(errs.len(), 2, "check refuses both: {errs:?}");
}

#[test]
fn one_validation_refuses_a_destination_url_with_credentials_at_runtime_too() {
    let text = "[destinations.d]\ntype = \"http\"\nurl = \"https://u:p@x.invalid/\"\nsecret = { file = \"/x\" }\n";
    for strict in [true, false] {
        let e = parse(text, None, &PathInputs::default(), strict).expect_err("refused");
        assert!(e[0].message.contains("credentials"), "{e:?}");
    }
}

#[test]
fn quarantine_is_reserved_everywhere() {
    for text in [
        "[sources.gh]\ntype = \"github\"\naction = \"quarantine\"\n",
        "[destinations.quarantine]\ntype = \"http\"\nurl = \"https://x.invalid/\"\nsecret = { file = \"/x\" }\n",
        "[sources.gh]\ntype = \"github\"\n[[routes]]\nname = \"r\"\nsource = \"gh\"\ndestination = \"quarantine\"\n",
    ] {
        let e = parse_err(text);
        assert!(
            e.iter()
                .any(|p| p.message.contains("quarantine is reserved")),
            "{text}: {e:?}"
        );
    }
}

#[test]
fn quiet_over_max_is_warned_when_max_s_is_the_default_zero() {
    let (_, w) = parse_ok(
        "[sources.t]\nscheme = \"static-token\"\nheader = \"X-Token\"\nkey = \"all\"\naction = \"hermes:t\"\nquiet_s = 30\n",
    );
    assert!(
        w.iter()
            .any(|p| p.key == "sources.t" && p.message.contains("quiet_s 30 > max_s 0")),
        "{w:?}"
    );
}

#[test]
fn unwrap_destinations_bound_each_event_not_the_document_and_warn_on_a_window() {
    let base = |body: i64, span: &str| {
        format!(
            "[sources.gh]\ntype = \"github\"\nspan = \"{span}\"\nmax_body_bytes = 1000\naction = \"hermes:gh\"\n\
             [destinations.\"hermes:gh\"]\nunwrap = true\nmax_body_bytes = {body}\n"
        )
    };
    // A document bound would refuse max_bytes 786432 > 0.75 x 2000; unwrap sends events.
    let (_, w) = parse_ok(&base(2000, "burst"));
    assert!(
        w.iter().any(|p| p
            .message
            .contains("unwraps (one request per event) but this route coalesces")),
        "{w:?}"
    );
    let (_, w) = parse_ok(&base(2000, "immediate"));
    assert!(!w.iter().any(|p| p.message.contains("unwraps")), "{w:?}");
    let e = parse_err(&base(500, "immediate"));
    assert!(
        e.iter().any(|p| p.key == "sources.gh.max_body_bytes"),
        "an event over the receiver's limit: {e:?}"
    );
    // Without unwrap the document bound applies.
    let e = parse_err(
        "[sources.gh]\ntype = \"github\"\n[destinations.\"hermes:github\"]\nmax_body_bytes = 2000\n",
    );
    assert!(e.iter().any(|p| p.message.contains("0.75 x")), "{e:?}");
}

#[test]
fn a_source_level_event_header_is_accepted_for_the_hermes_fallback() {
    let (c, w) = parse_ok("[sources.gh]\ntype = \"github\"\nevent_header = \"X-GitHub-Event\"\n");
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        c.sources["gh"].event_header.as_deref(),
        Some("X-GitHub-Event")
    );
    let e = parse_err("[sources.gh]\ntype = \"github\"\nevent_header = \"webhook-id\"\n");
    assert_eq!(e[0].key, "sources.gh.event_header", "{e:?}");
}

#[test]
fn default_action_destinations_are_validated_like_named_ones() {
    // github reaches hermes:github through its type's action: a tee there is refused, no
    // "no action" warning is given, and its body bound is checked.
    let text = "[sources.gh]\ntype = \"github\"\n[[routes]]\nname = \"t\"\nsource = \"gh\"\ntee = true\ndestination = \"hermes:github\"\n";
    let e = parse_err(text);
    assert!(
        e.iter()
            .any(|p| p.message.contains("hermes:github already receives")),
        "{e:?}"
    );
    let (c, w) = parse_ok("[sources.gh]\ntype = \"github\"\n");
    assert!(!w.iter().any(|p| p.message.contains("no action")), "{w:?}");
    assert_eq!(c.sources["gh"].default_action(), Some("hermes:github"));
    assert_eq!(
        c.window(&c.sources["gh"], None).max_s,
        600.0,
        "github's burst span"
    );
}

#[test]
fn window_inherits_per_field_route_source_span_coalesce() {
    let (c, _) = parse_ok(
        r#"
[coalesce]
max_events = 50
[spans]
custom = { quiet_s = 5, max_s = 50 }
[sources.gh]
type = "github"
span = "custom"
max_s = 70
action = "hermes:gh"
[[routes]]
name = "gh-ci"
source = "gh"
match = { class = "ci" }
destination = "hermes:gh-ci"
quiet_s = 1
"#,
    );
    let s = &c.sources["gh"];
    let route = &c.routes[0];
    let w = c.window(s, Some(route));
    assert_eq!(
        w,
        Window {
            quiet_s: 1.0,
            max_s: 70.0,
            max_events: 50,
            max_bytes: 786_432
        }
    );
    let w = c.window(s, None);
    assert_eq!(w.quiet_s, 5.0);
    let mut s2 = s.clone();
    s2.span = None;
    let w = c.window(&s2, None);
    assert_eq!(
        (w.quiet_s, w.max_s),
        (120.0, 70.0),
        "the type's default span fills what is unset"
    );
}

#[test]
fn route_resolution_first_match_then_implicit_and_tees() {
    let (c, _) = parse_ok(
        r#"
[sources.gh]
type = "github"
[[routes]]
name = "audit"
source = "gh"
tee = true
destination = "http-audit"
[[routes]]
name = "gh-ci"
source = "gh"
match = { class = "ci" }
destination = "hermes:gh-ci"
[destinations.http-audit]
type = "http"
url = "https://audit.example.invalid/x"
secret = { file = "/nonexistent/hookspool-test-secret" }
"#,
    );
    let s = &c.sources["gh"];
    let attrs = |class: &str| BTreeMap::from([("class".to_string(), class.to_string())]);
    let q = |attrs: &BTreeMap<String, String>, action: Option<&'static str>| {
        c.route(&RouteQuery {
            source: s,
            attrs,
            event_action: action,
            destination: None,
        })
    };
    let r = q(&attrs("ci"), Some("hermes:github")).unwrap();
    assert_eq!(
        (r.primary.route.as_str(), r.primary.destination.as_str()),
        ("gh-ci", "hermes:gh-ci")
    );
    assert_eq!(r.tees.len(), 1);
    assert_eq!(r.tees[0].destination, "http-audit");
    let r = q(&attrs("pr"), Some("hermes:github")).unwrap();
    assert_eq!(
        (r.primary.route.as_str(), r.primary.destination.as_str()),
        ("gh", "hermes:github")
    );
    assert_eq!(
        q(&attrs("pr"), None).unwrap().primary.destination,
        "hermes:github",
        "the type's own action when the event names none"
    );
}

#[test]
fn tee_rules_are_enforced() {
    let errs = parse_err(
        r#"
[sources.gh]
type = "github"
action = "hermes:gh"
[[routes]]
name = "t1"
source = "gh"
tee = true
destination = "hermes:gh"
[[routes]]
name = "t2"
source = "gh"
tee = true
"#,
    );
    let text = errs
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        text.contains("routes[0].destination: hermes:gh already receives"),
        "{text}"
    );
    assert!(
        text.contains("routes[1].destination: a tee route needs its own destination"),
        "{text}"
    );
}

#[test]
fn tees_to_one_destination_are_refused_only_when_their_matches_overlap() {
    let tees = |m1: &str, m2: &str| {
        format!(
            "[sources.gh]\ntype = \"github\"\n\
             [[routes]]\nname = \"a\"\nsource = \"gh\"\ntee = true\nmatch = {m1}\ndestination = \"hermes:audit\"\n\
             [[routes]]\nname = \"b\"\nsource = \"gh\"\ntee = true\nmatch = {m2}\ndestination = \"hermes:audit\"\n"
        )
    };
    parse_ok(&tees("{ class = \"ci\" }", "{ class = \"pr\" }"));
    let e = parse_err(&tees("{ class = \"ci\" }", "{ repo = \"x\" }"));
    assert!(
        e.iter().any(|p| p.key == "routes[1].destination"
            && p.message.contains("can select the same events")),
        "{e:?}"
    );
}

#[test]
fn bad_values_say_what_to_write() {
    let errs = parse_err(
        r#"
[intake]
listen = "0.0.0.0:8650"
[dispatch]
parallel = 0
[sources.x]
span = "nope"
type = "githb"
[destinations.plain]
url = "https://x"
[destinations."script:s"]
cwd = "/tmp"
"#,
    );
    let text = errs
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    for needle in [
        "intake.listen[0]: 0.0.0.0:8650 is not a loopback address",
        "write listen = \"127.0.0.1:8650\"",
        "dispatch.parallel: must be an integer >= 1; write e.g. dispatch.parallel = 4",
        "sources.x.span: no span preset \"nope\"",
        "sources.x.type: unknown source type \"githb\"",
        "destinations.\"plain\".type: write type = \"http\"",
        "destinations.\"script:s\".argv: a script destination needs argv",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    assert!(check_listen("0.0.0.0:1", true).is_ok());
    assert!(check_listen("unix:/run/x.sock", false).is_ok());
    assert!(check_listen("unix:relative", false).is_err());
}

#[test]
fn paths_follow_flag_env_config_default() {
    let text = "[spool]\nhome = \"/from/config\"\ndb = \"other.db\"\n";
    let (c, _) = parse(text, None, &PathInputs::default(), true).unwrap();
    assert_eq!(c.db, PathBuf::from("/from/config/other.db"));
    let env = PathInputs {
        env_home: Some("/from/env".into()),
        ..Default::default()
    };
    let (c, _) = parse(text, None, &env, true).unwrap();
    assert_eq!(c.home, PathBuf::from("/from/env"));
    let flag = PathInputs {
        home_flag: Some("/from/flag".into()),
        env_db: Some("/abs/x.db".into()),
        ..env.clone()
    };
    let (c, _) = parse(text, None, &flag, true).unwrap();
    assert_eq!(
        (c.home.as_path(), c.db.as_path()),
        (Path::new("/from/flag"), Path::new("/abs/x.db"))
    );
    assert_eq!(
        flag.config_path(),
        (PathBuf::from("/from/flag/config.toml"), false)
    );
    let cfg = PathInputs {
        env_config: Some("/etc/hookspool/config.toml".into()),
        ..flag
    };
    assert_eq!(
        cfg.config_path(),
        (PathBuf::from("/etc/hookspool/config.toml"), true)
    );
}

#[test]
fn a_named_config_file_must_exist_an_implicit_one_may_not() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = PathInputs {
        home_flag: Some(dir.path().into()),
        ..Default::default()
    };
    let (c, _) = load(&inputs, true).unwrap();
    assert_eq!(c.file, None);
    let named = PathInputs {
        config_flag: Some(dir.path().join("missing.toml")),
        ..inputs
    };
    let e = load(&named, true).unwrap_err();
    assert!(e.to_string().contains("cannot read the config file"), "{e}");
}

#[test]
fn size_bounds_and_quiet_over_max_are_checked() {
    let t = "[sources.s]\nscheme = \"static-token\"\nheader = \"X-Token\"\nkey = \"all\"\naction = \"hermes:s\"\n";
    let errs = parse_err(&format!("{t}max_body_bytes = 900000\n"));
    assert!(
        errs[0]
            .to_string()
            .contains("exceeds the batch max_bytes 786432"),
        "{errs:?}"
    );
    let (_, warnings) = parse_ok(&format!(
        "{t}quiet_s = 60\nmax_s = 30\nmax_body_bytes = 1000\n"
    ));
    assert!(
        warnings
            .iter()
            .any(|w| w.message.contains("the quiet window never fires")),
        "{warnings:?}"
    );
}

#[test]
fn a_source_types_own_dedup_window_applies_unless_config_sets_one() {
    let (c, _) = parse_ok(
        "[sources.plaid]\naction = \"hermes:p\"\n[sources.p2]\ntype = \"plaid\"\ndedup_window_s = 3600\naction = \"hermes:p\"\n[sources.gh]\ntype = \"github\"\n",
    );
    assert_eq!(
        c.sources["plaid"].dedup_window_s, 600.0,
        "Plaid dedups by body hash: 600 s"
    );
    assert_eq!(c.sources["p2"].dedup_window_s, 3600.0);
    assert_eq!(c.sources["gh"].dedup_window_s, 86_400.0);
    let r = c.retention();
    assert!(
        r.dedup_windows.contains(&("plaid".to_string(), 600.0)),
        "retention agrees with the intake"
    );
}

#[test]
fn injected_events_get_the_source_types_action_and_span_like_the_intake() {
    // `enqueue --source github` and a script's emits route through the intake's decision.
    let (c, _) = parse_ok(
        "[sources.github]\n[[routes]]\nname = \"push\"\nsource = \"github\"\nmatch = { event_type = \"push\" }\ndestination = \"hermes:push\"\n",
    );
    let inj = |event_type: &'static str, destination: Option<&'static str>| Injected {
        source: "github",
        key: "o/r:push",
        event_type,
        dedup_id: None,
        destination,
        payload: "{}",
        raw: None,
        now: 1.0,
    };
    let r = c.injected_request(&inj("issues", None)).expect("routed");
    assert_eq!(
        (r.primary.route.as_str(), r.primary.destination.as_str()),
        ("github", "hermes:github")
    );
    assert_eq!(
        (r.primary.window.quiet_s, r.primary.window.max_s),
        (120.0, 600.0)
    );
    let r = c.injected_request(&inj("push", None)).expect("routed");
    assert_eq!(
        r.primary.route, "push",
        "an injected event's attrs are its event_type"
    );
    let r = c
        .injected_request(&inj("push", Some("http:x")))
        .expect("routed");
    assert_eq!(
        (r.primary.route.as_str(), r.primary.window.max_s),
        ("github>http:x", 600.0),
        "a named destination gets a route of its own in the implicit route's window"
    );
}

/// Issue 35: `max_per_s` and `burst` on every destination type; absent is no limit, burst
/// defaults to one second's worth (at least 1).
#[test]
fn a_destination_rate_limit_is_parsed_on_every_type_with_its_default_burst() {
    let text = r#"
[destinations.h]
type = "http"
url = "https://x.invalid/"
secret = { file = "/x" }
max_per_s = 5
burst = 2
[destinations."hermes:gh"]
max_per_s = 0.5
[destinations."script:s"]
argv = ["/bin/true"]
max_per_s = 2.5
[destinations.free]
type = "http"
url = "https://y.invalid/"
secret = { file = "/x" }
"#;
    let (c, w) = parse_ok(text);
    assert!(w.is_empty(), "{w:?}");
    let rate = |n: &str| c.destinations[n].rate.map(|r| (r.max_per_s, r.burst));
    assert_eq!(rate("h"), Some((5.0, 2)));
    assert_eq!(rate("hermes:gh"), Some((0.5, 1)), "at least one token");
    assert_eq!(rate("script:s"), Some((2.5, 3)), "ceil(max_per_s)");
    assert_eq!(rate("free"), None, "absent: no limit");
}

#[test]
fn a_wrong_rate_limit_names_the_key_and_says_what_to_write() {
    let table = |extra: &str| {
        format!(
            "[destinations.h]\ntype = \"http\"\nurl = \"https://x.invalid/\"\nsecret = {{ file = \"/x\" }}\n{extra}\n"
        )
    };
    for (extra, key, says) in [
        ("max_per_s = 0", "max_per_s", "write e.g. max_per_s = 5"),
        ("max_per_s = -1.5", "max_per_s", "write e.g. max_per_s = 5"),
        ("max_per_s = nan", "max_per_s", "or remove it for no limit"),
        ("max_per_s = 1e9", "max_per_s", "<= 100000"),
        ("max_per_s = 5\nburst = 0", "burst", "write e.g. burst = 5"),
        (
            "max_per_s = 0.2\nburst = -3",
            "burst",
            "write e.g. burst = 1",
        ),
        (
            "burst = 4",
            "burst",
            "write max_per_s = <requests a second>",
        ),
    ] {
        // Refused by check and by a running service alike (a reload keeps the old config).
        for strict in [true, false] {
            let e = parse(&table(extra), None, &PathInputs::default(), strict).expect_err(extra);
            assert_eq!(e.len(), 1, "{extra}: {e:?}");
            assert_eq!(e[0].key, format!("destinations.\"h\".{key}"), "{extra}");
            assert!(e[0].message.contains(says), "{extra}: {}", e[0].message);
        }
    }
}

#[test]
fn the_admin_table_takes_a_loopback_address_or_nothing_and_a_token_reference() {
    let (c, _) = parse_ok("");
    assert_eq!(c.admin.listen, Some("127.0.0.1:8651".parse().unwrap()));
    assert_eq!(c.admin.token, None);
    let (c, _) = parse_ok("[admin]\nlisten = \"\"");
    assert_eq!(c.admin.listen, None, "\"\" turns it off");
    let (c, _) = parse_ok("[admin]\nlisten = \"localhost:0\"\ntoken = { env = \"ADMIN_T\" }");
    assert_eq!(c.admin.listen, Some("127.0.0.1:0".parse().unwrap()));
    assert_eq!(
        c.admin.token,
        Some(SecretRef::Env {
            env: "ADMIN_T".into()
        })
    );
    let (c, _) = parse_ok("[admin]\nlisten = \"[::1]:9\"");
    assert_eq!(c.admin.listen, Some("[::1]:9".parse().unwrap()));
    for (bad, says) in [
        ("0.0.0.0:8651", "not a loopback address"),
        ("10.1.2.3:1", "not a loopback address"),
        ("8651", "is not an address"),
        ("unix:/run/a.sock", "is not an address"),
    ] {
        let e = parse_err(&format!("[admin]\nlisten = \"{bad}\""));
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].key, "admin.listen");
        assert!(e[0].message.contains(says), "{bad}: {}", e[0].message);
        assert!(
            e[0].message.contains("listen = \""),
            "says what to write: {}",
            e[0].message
        );
    }
    let e = parse_err("[admin]\ntoken = \"SENTINEL-inline\"");
    assert!(
        e.iter().all(|p| !p.to_string().contains("SENTINEL")),
        "no value quoted: {e:?}"
    );
    let (c, _) = parse_ok("[admin]\nsocket = \"/run/hookspool/admin.sock\"");
    assert_eq!(
        c.admin.socket,
        Some(PathBuf::from("/run/hookspool/admin.sock"))
    );
    let e = parse_err("[admin]\nsocket = \"admin.sock\"");
    assert_eq!(e[0].key, "admin.socket");
    assert!(e[0].message.contains("absolute"), "{e:?}");
    let e = parse_err("[admin]\nlisten_on = \"127.0.0.1:1\"");
    assert_eq!(e[0].key, "admin.listen_on", "{e:?}");
}

/// Issue 35: `allow_private` on http and hermes destinations (hermes admits loopback by
/// default), and a wrong block names the key and what to write.
#[test]
fn allow_private_is_a_flag_or_address_blocks_and_hermes_admits_loopback_by_default() {
    use crate::destinations::HttpConfig;
    use crate::egress::Allow;
    let text = r#"
[destinations.lan]
type = "http"
url = "https://lan.invalid/"
secret = { file = "/x" }
allow_private = ["10.0.0.0/8", "fd00::/8"]
[destinations.all]
type = "http"
url = "https://all.invalid/"
secret = { file = "/x" }
allow_private = true
[destinations.none]
type = "http"
url = "https://none.invalid/"
secret = { file = "/x" }
[destinations."hermes:gh"]
"#;
    let (c, w) = parse_ok(text);
    assert!(w.is_empty(), "{w:?}");
    let http = |n: &str| -> HttpConfig {
        match &c.destinations[n].spec {
            DestinationSpec::Http(h) => h.http.clone(),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        http("lan").allow_private,
        Allow::Blocks(vec![
            "10.0.0.0/8".parse().unwrap(),
            "fd00::/8".parse().unwrap()
        ])
    );
    assert_eq!(http("all").allow_private, Allow::All);
    assert_eq!(http("none").allow_private, Allow::None);
    match &c.destinations["hermes:gh"].spec {
        DestinationSpec::Hermes(h) => assert_eq!(h.allow_private, crate::egress::loopback_only()),
        other => panic!("{other:?}"),
    }
    let e = parse_err(
        "[destinations.h]\ntype = \"http\"\nurl = \"https://x.invalid/\"\nsecret = { file = \"/x\" }\nallow_private = [\"10.0.0.0/40\"]\n",
    );
    assert!(
        e.iter().any(|p| p.message.contains("allow_private")
            && p.message.contains("write e.g. \"127.0.0.1/32\"")),
        "{e:?}"
    );
}

/// Issue 35: traces are off unless `[telemetry] otlp_endpoint` names a collector; a wrong
/// endpoint or queue names its key.
#[test]
fn telemetry_is_off_by_default_and_a_wrong_endpoint_or_queue_names_its_key() {
    let (c, _) = parse_ok("");
    assert_eq!(c.telemetry.otlp_endpoint, None);
    assert_eq!(
        c.telemetry.queue_spans,
        crate::telemetry::QUEUE_SPANS_DEFAULT
    );
    let (c, w) =
        parse_ok("[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\nqueue_spans = 64\n");
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        c.telemetry.otlp_endpoint.as_deref(),
        Some("http://127.0.0.1:4318")
    );
    assert_eq!(c.telemetry.queue_spans, 64);
    for (text, key) in [
        (
            "otlp_endpoint = \"127.0.0.1:4318\"",
            "telemetry.otlp_endpoint",
        ),
        ("otlp_endpoint = \"ftp://c/\"", "telemetry.otlp_endpoint"),
        ("queue_spans = 0", "telemetry.queue_spans"),
    ] {
        let e = parse_err(&format!("[telemetry]\n{text}\n"));
        assert!(e.iter().any(|p| p.key == key), "{text}: {e:?}");
    }
}
