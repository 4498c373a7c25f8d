//! The bobbin step of config loading (spec 14.3.3): `config::parse` expands `[bobbins.*]`
//! from the built-ins and `spool.bobbin_path`, and reports every problem at the instance key.

use std::path::{Path, PathBuf};

use super::*;

fn parse_ok(text: &str) -> (Config, Vec<Problem>) {
    parse(text, None, &PathInputs::default(), true).unwrap_or_else(|e| panic!("{e:?}"))
}

fn parse_err(text: &str) -> Vec<Problem> {
    parse(text, None, &PathInputs::default(), true).expect_err("should fail")
}

fn keys(problems: &[Problem]) -> Vec<String> {
    problems.iter().map(|p| p.key.clone()).collect()
}

const GITHUB: &str = r#"
[bobbins.github]
bobbin = "github.repo"
secrets.secret = { file = "/etc/hookspool/secrets/github" }
outputs = { "*" = "hermes:github-prs" }
quiet_s = 5
"#;

#[test]
fn expansion_a_github_instance_is_an_ordinary_source() {
    let (c, _) = parse_ok(GITHUB);
    let s = &c.sources["github"];
    assert_eq!(s.kind, "github");
    assert_eq!(s.action.as_deref(), Some("hermes:github-prs"));
    assert_eq!(s.window.quiet_s, Some(5.0));
    assert!(s.secrets.contains_key("secret"));
    let o = c.bobbins.get("github").expect("the instance is recorded");
    assert_eq!(o.bobbin.to_string(), "github.repo");
    assert!(!o.processor);
}

#[test]
fn expansion_errors_name_the_instance_key_and_the_fix() {
    let e = parse_err("[bobbins.gmail]\nsecrets.push_token = { file = \"/x\" }\n");
    assert_eq!(keys(&e), ["bobbins.gmail.bobbin"]);
    assert!(
        e[0].message
            .contains("did you mean bobbin = \"google.gmail\"?"),
        "{e:?}"
    );
}

#[test]
fn expansion_problem_in_an_expanded_source_is_reported_at_the_instance_key() {
    let e = parse_err(&GITHUB.replace("quiet_s = 5", "span = \"nope\""));
    assert_eq!(keys(&e), ["bobbins.github.span"], "{e:?}");
    // A template key from a setting: the template source's own check, at the setting.
    let e = parse_err(
        r#"
[bobbins.hooks]
bobbin = "hookspool.webhook"
secrets.secret = { file = "/x" }
settings = { scheme = "hmac-sha256-hex", key = ["payload.id"] }
outputs = { "*" = "hermes:hooks" }
"#,
    );
    assert_eq!(keys(&e), ["bobbins.hooks.settings.header"], "{e:?}");
    assert!(e[0].message.contains("hmac-sha256-hex"), "{e:?}");
    assert!(e[0].message.contains("write settings.header ="), "{e:?}");
}

#[test]
fn expansion_override_of_the_wrong_type_is_named_at_the_instance() {
    let e = parse_err(&GITHUB.replace("quiet_s = 5", "quiet_s = \"soon\""));
    assert_eq!(keys(&e), ["bobbins.github.quiet_s"], "{e:?}");
    assert!(e[0].message.contains("write e.g. quiet_s = 60"), "{e:?}");
}

#[test]
fn expansion_file_routes_keep_their_own_index_after_generated_routes() {
    let text = r#"
[bobbins.widgets]
bobbin = "hookspool.webhook"
secrets.secret = { file = "/x" }
settings = { scheme = "static-token", header = "X-Token", key = ["payload.id"], event_type = "payload.kind", attrs = { event_type = "payload.kind" } }
outputs = { "*" = "hermes:widgets", created = "hermes:created" }

[[routes]]
name = "extra"
source = "nowhere"
destination = "hermes:x"
"#;
    let e = parse_err(text);
    // One generated route (widgets-created) comes first; the file's route is routes[0].
    assert_eq!(keys(&e), ["routes[0].source"], "{e:?}");
    let (c, _) = parse_ok(&text.replace("nowhere", "widgets"));
    assert_eq!(c.routes[0].name, "widgets-created");
    assert_eq!(c.routes[1].name, "extra");
}

#[test]
fn expansion_generated_route_problem_is_the_instance_outputs() {
    let instances = {
        let text = r#"
[bobbins.widgets]
bobbin = "hookspool.webhook"
secrets.secret = { file = "/x" }
settings = { scheme = "static-token", header = "X-Token", key = ["payload.id"], event_type = "payload.kind", attrs = { event_type = "payload.kind" } }
outputs = { "*" = "hermes:widgets", created = "hermes:created" }
"#;
        parse_ok(text).0.bobbins
    };
    assert_eq!(
        instances.config_key("routes[0].destination"),
        "bobbins.widgets.outputs"
    );
    assert_eq!(instances.config_key("routes[1].match"), "routes[0].match");
    assert_eq!(
        instances.config_key("sources.widgets.action"),
        "bobbins.widgets.outputs"
    );
    assert_eq!(
        instances.config_key("sources.widgets.type"),
        "bobbins.widgets.bobbin"
    );
    assert_eq!(
        instances.config_key("sources.other.span"),
        "sources.other.span"
    );
}

const GMAIL: &str = r#"
[bobbins.gmail]
bobbin = "google.gmail"
secrets.push_token = { file = "/etc/hookspool/secrets/gmail_push" }
secrets.cred_owner = { file = "/etc/hookspool/google/owner.json" }
settings = { owner = "owner@example.com" }
outputs = { mail = "hermes:mail" }
"#;

#[test]
fn expansion_processor_instance_is_a_script_destination_with_processor() {
    let (c, _) = parse_ok(GMAIL);
    let d = &c.destinations["script:gmail"];
    let DestinationSpec::Script(s) = &d.spec else {
        panic!("a script destination: {d:?}");
    };
    assert_eq!(s.processor.as_deref(), Some("gmail"));
    assert!(s.argv.is_empty());
    assert_eq!(d.max_inflight, 1);
    for name in crate::destinations::script::PROCESSOR_ENV {
        assert!(s.env.contains_key(*name), "{name}");
    }
    // Gmail's processor calls the Gmail API ([provider] api_docs): network on.
    assert!(s.sandbox.network);
    assert_eq!(
        s.state_dir.as_deref(),
        Some(Path::new("/var/lib/hookspool/bobbins/gmail"))
    );
    assert_eq!(c.sources["gmail"].action.as_deref(), Some("script:gmail"));
    assert!(c.bobbins.get("gmail").unwrap().processor);
    assert!(s.problems().is_empty(), "{:?}", s.problems());
}

#[test]
fn expansion_processor_key_is_refused_in_a_hand_written_destination() {
    let e = parse_err(
        "[destinations.\"script:mine\"]\nprocessor = \"mine\"\nenv = { HOOKSPOOL_BOBBIN = \"x\" }\n",
    );
    assert!(
        keys(&e).contains(&"destinations.\"script:mine\".processor".to_string()),
        "{e:?}"
    );
}

#[test]
fn script_env_hookspool_names_only_with_processor() {
    let e = parse_err(
        "[destinations.\"script:s\"]\nargv = [\"/bin/true\"]\nenv = { HOOKSPOOL_SETTINGS = \"{}\" }\n",
    );
    assert!(
        e.iter().any(|p| p
            .message
            .contains("HOOKSPOOL_* variables are set by hookspool")),
        "{e:?}"
    );
    let (c, _) = parse_ok(GMAIL);
    let DestinationSpec::Script(mut s) = c.destinations["script:gmail"].spec.clone() else {
        panic!("script");
    };
    s.env.insert("HOOKSPOOL_STATE_DIR".into(), "/tmp".into());
    assert!(
        s.problems()
            .iter()
            .any(|p| p.contains("HOOKSPOOL_STATE_DIR")),
        "only the 14.3.3 names: {:?}",
        s.problems()
    );
    s.env.remove("HOOKSPOOL_STATE_DIR");
    s.env.remove("HOOKSPOOL_SETTINGS");
    assert!(
        s.problems()
            .iter()
            .any(|p| p.contains("needs env HOOKSPOOL_SETTINGS")),
        "{:?}",
        s.problems()
    );
    s.env.insert("HOOKSPOOL_SETTINGS".into(), "{}".into());
    s.argv = vec!["/bin/true".into()];
    assert!(
        s.problems().iter().any(|p| p.contains("remove argv")),
        "{:?}",
        s.problems()
    );
}

#[test]
fn expansion_standard_webhooks_needs_one_of_its_optional_secrets() {
    let text = r#"
[bobbins.sw]
bobbin = "hookspool.standard-webhooks"
outputs = { "*" = "hermes:sw" }
"#;
    let e = parse_err(text);
    assert_eq!(keys(&e), ["bobbins.sw.secrets"], "{e:?}");
    assert!(e[0].message.contains("at least one of"), "{e:?}");
    for one in ["secret", "public_key"] {
        let t = text.replace(
            "outputs",
            &format!("secrets.{one} = {{ file = \"/x\" }}\noutputs"),
        );
        parse_ok(&t);
    }
}

/// A private bobbin root holding a copy of the good fixture (acme.widgets).
fn private_root(dir: &Path) -> PathBuf {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bobbins/good");
    let root = dir.join("bobbins");
    copy_dir(&from, &root);
    root
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

fn widgets(root: &Path) -> String {
    format!(
        "[spool]\nbobbin_path = [\"{}\"]\n\n[bobbins.widgets]\nbobbin = \"acme.widgets\"\nsecrets.secret = {{ file = \"/x\" }}\noutputs = {{ \"*\" = \"hermes:widgets\" }}\n",
        root.display()
    )
}

#[test]
fn expansion_rereads_bobbin_path_manifests_on_every_load() {
    let dir = tempfile::tempdir().unwrap();
    let root = private_root(dir.path());
    let text = widgets(&root);
    let (c, _) = parse_ok(&text);
    assert_eq!(c.sources["widgets"].span.as_deref(), Some("burst"));
    let manifest = root.join("acme/widgets/bobbin.toml");
    let edited = std::fs::read_to_string(&manifest)
        .unwrap()
        .replace("span = \"burst\"", "span = \"sync\"");
    std::fs::write(&manifest, edited).unwrap();
    let (c, _) = parse_ok(&text);
    assert_eq!(c.sources["widgets"].span.as_deref(), Some("sync"));
}

#[test]
fn expansion_a_broken_private_bobbin_is_an_error_at_bobbin_path() {
    let dir = tempfile::tempdir().unwrap();
    let root = private_root(dir.path());
    let manifest = root.join("acme/widgets/bobbin.toml");
    let broken = std::fs::read_to_string(&manifest).unwrap() + "\ncolour = \"red\"\n";
    std::fs::write(&manifest, broken).unwrap();
    let e = parse_err(&widgets(&root));
    assert!(
        e.iter()
            .any(|p| p.key == "spool.bobbin_path" && p.message.contains("colour")),
        "{e:?}"
    );
}

#[test]
fn expansion_without_bobbins_reads_no_catalogue_and_changes_nothing() {
    let text = "[sources.github]\ntype = \"github\"\nsecrets.secret = { file = \"/x\" }\n";
    let (c, _) = parse_ok(text);
    assert!(c.bobbins.is_empty());
    assert_eq!(c.sources["github"].kind, "github");
}

#[test]
fn expansion_webhook_tolerance_s_is_a_setting_and_zero_is_the_default() {
    let text = |scheme: &str, tolerance: &str| {
        format!(
            r#"
[bobbins.hooks]
bobbin = "hookspool.webhook"
secrets.secret = {{ file = "/x" }}
settings = {{ scheme = "{scheme}", header = "Stripe-Signature", key = ["payload.id"]{tolerance} }}
outputs = {{ "*" = "hermes:hooks" }}
"#
        )
    };
    let (c, _) = parse_ok(&text("timestamped", ", tolerance_s = 600"));
    assert_eq!(
        c.sources["hooks"].options.get("tolerance_s"),
        Some(&toml::Value::Integer(600))
    );
    // The default 0 leaves the key out, so a scheme without a window still loads.
    let (c, _) = parse_ok(&text("hmac-sha256-hex", ""));
    assert!(!c.sources["hooks"].options.contains_key("tolerance_s"));
    // Out of the template source's bounds: its own message, at the setting.
    let e = parse_err(&text("timestamped", ", tolerance_s = 5"));
    assert_eq!(keys(&e), ["bobbins.hooks.settings.tolerance_s"], "{e:?}");
}
