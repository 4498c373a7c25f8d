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
    let (_, warnings) = parse(text, None, &PathInputs::default(), false).unwrap();
    assert_eq!(
        warnings.len(),
        1,
        "source options go to the source type's own check"
    );
    assert_eq!(warnings[0].key, "dispatch.paralel");
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
    let w = resolve_window(&c.spans, &c.coalesce, s, Some(route));
    assert_eq!(
        w,
        Window {
            quiet_s: 1.0,
            max_s: 70.0,
            max_events: 50,
            max_bytes: 786_432
        }
    );
    let w = resolve_window(&c.spans, &c.coalesce, s, None);
    assert_eq!(w.quiet_s, 5.0);
    let mut s2 = s.clone();
    s2.span = None;
    let w = resolve_window_with_span(&c.spans, &c.coalesce, &s2, None, Some("burst"));
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
    let r = c
        .resolve_routes(s, &attrs("ci"), Some("hermes:github"), None)
        .unwrap();
    assert_eq!(
        (r.primary.route.as_str(), r.primary.destination.as_str()),
        ("gh-ci", "hermes:gh-ci")
    );
    assert_eq!(r.tees.len(), 1);
    assert_eq!(r.tees[0].destination, "http-audit");
    let r = c
        .resolve_routes(s, &attrs("pr"), Some("hermes:github"), None)
        .unwrap();
    assert_eq!(
        (r.primary.route.as_str(), r.primary.destination.as_str()),
        ("gh", "hermes:github")
    );
    assert!(
        c.resolve_routes(s, &attrs("pr"), None, None).is_none(),
        "no destination anywhere"
    );
}

#[test]
fn tee_rules_are_enforced() {
    let errs = parse_err(
        r#"
[sources.gh]
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
        text.contains("routes.t1.destination: hermes:gh already receives"),
        "{text}"
    );
    assert!(
        text.contains("routes[1].destination: a tee route needs its own destination"),
        "{text}"
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
    let errs = parse_err("[sources.s]\naction = \"hermes:s\"\nmax_body_bytes = 900000\n");
    assert!(
        errs[0]
            .to_string()
            .contains("exceeds the batch max_bytes 786432"),
        "{errs:?}"
    );
    let (_, warnings) = parse_ok(
        "[sources.s]\naction = \"hermes:s\"\nquiet_s = 60\nmax_s = 30\nmax_body_bytes = 1000\n",
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.message.contains("can never fire")),
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
