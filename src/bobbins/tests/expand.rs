//! The expansion rules of spec 14.3.3 (and 14.3.2a's instance rules), one test each.

use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::manifest::GITHUB;
use crate::bobbins::catalog::{Catalog, Entry, Origin};
use crate::bobbins::expand::{ExpandError, expand_config, expand_instance};
use crate::bobbins::manifest::Manifest;

const GMAIL: &str = r#"
name = "google.gmail"
version = "1"
summary = "Gmail push"
[provider]
vendor = "Google"
product = "Gmail"
homepage = "https://workspace.google.com/products/gmail/"
webhook_docs = "https://developers.google.com/workspace/gmail/api/guides/push"
signature_docs = "https://cloud.google.com/pubsub/docs/push"
[source]
builtin = "gmail"
span = "mail"
expect_every_s = 345600
[secrets.token]
description = "the push token"
[secrets.cred_owner]
description = "the owner's OAuth credential"
processor = true
[settings.owner]
description = "the owner's mailbox"
type = "string"
required = true
[settings.tz]
description = "time zone"
type = "string"
default = "UTC"
[processor]
exec = "processor"
timeout_s = 120
[outputs.scheduling]
description = "asks for availability"
[outputs.agent-mail]
description = "the assistant's mail"
"#;

const WEBHOOK: &str = r#"
name = "hookspool.webhook"
version = "1"
summary = "any signed JSON POST"
[provider]
vendor = "hookspool"
product = "Webhook"
homepage = "https://github.com/"
webhook_docs = "https://github.com/"
[source]
template = "settings"
[secrets.secret]
description = "the signing secret"
[settings.scheme]
description = "scheme"
type = "string"
required = true
[settings.header]
description = "header"
type = "string"
default = ""
[settings.prefix]
description = "prefix"
type = "string"
default = ""
[settings.key]
description = "key"
type = "list"
required = true
[settings.event_type]
description = "event type"
type = "string"
default = ""
[settings.attrs]
description = "attrs"
type = "table"
default = {}
[outputs."*"]
description = "every accepted event"
"#;

const HOME: &str = "/var/lib/hookspool";

fn entry(text: &str, vendor: &str, product: &str) -> Entry {
    Entry {
        manifest: Manifest::parse(text).expect("test manifest"),
        origin: Origin::Path(PathBuf::from("/etc/hookspool/bobbins")),
        vendor_dir: vendor.into(),
        product_dir: product.into(),
        installed: None,
    }
}

fn catalog() -> Catalog {
    Catalog::default()
        .with_entry(entry(GITHUB, "github", "repo"))
        .with_entry(entry(GMAIL, "google", "gmail"))
        .with_entry(entry(WEBHOOK, "hookspool", "webhook"))
}

fn root(text: &str) -> Table {
    toml::from_str(text).expect("test config")
}

fn expand(text: &str) -> Result<Table, Vec<ExpandError>> {
    expand_config(&root(text), &catalog(), Path::new(HOME)).map(|e| e.root)
}

fn errors(text: &str) -> Vec<String> {
    expand(text)
        .expect_err("should fail")
        .into_iter()
        .map(|e| e.to_string())
        .collect()
}

fn refused(text: &str, needle: &str) {
    let e = errors(text);
    assert!(
        e.iter().any(|m| m.contains(needle)),
        "expected {needle:?} in {e:#?}"
    );
}

const GITHUB_CI: &str = r#"
[bobbins.github-ci]
bobbin = "github.repo"
secrets.secret = { file = "/etc/hookspool/secrets/github" }
outputs = { "*" = "hermes:github", push = "hermes:ci" }
"#;

const GMAIL_I: &str = r#"
[bobbins.gmail]
bobbin = "google.gmail"
secrets.token = { file = "/etc/hookspool/secrets/gmail_token" }
secrets.cred_owner = { file = "/etc/hookspool/google/owner.json" }
settings = { owner = "owner@example.com" }
outputs = { scheduling = "hermes:mail-scheduling", agent-mail = "hermes:assistant-mail" }
expect = true
"#;

fn get<'a>(t: &'a Table, path: &[&str]) -> &'a Value {
    let mut v = t
        .get(path[0])
        .unwrap_or_else(|| panic!("{path:?} in {t:#?}"));
    for p in &path[1..] {
        v = v.get(*p).unwrap_or_else(|| panic!("{path:?} in {t:#?}"));
    }
    v
}

#[test]
fn expand_rule_1_template_source() {
    let out = expand(GITHUB_CI).expect("expands");
    assert!(out.get("bobbins").is_none());
    let s = get(&out, &["sources", "github-ci"]).as_table().unwrap();
    assert_eq!(s["type"].as_str(), Some("template"));
    assert_eq!(s["scheme"].as_str(), Some("hmac-sha256-hex"));
    assert_eq!(s["header"].as_str(), Some("X-Hub-Signature-256"));
    assert_eq!(s["span"].as_str(), Some("burst"));
    assert_eq!(s["sender_retries"].as_bool(), Some(false));
    assert_eq!(
        get(s, &["secrets", "secret", "file"]).as_str(),
        Some("/etc/hookspool/secrets/github")
    );
    assert_eq!(s["action"].as_str(), Some("hermes:github"));
}

#[test]
fn expand_rule_1_builtin_source_and_overrides() {
    let text = GMAIL_I.replace(
        "expect = true",
        "expect = true\nspan = \"sync\"\nquiet_s = 5\nmax_body_bytes = 4096",
    );
    let out = expand(&text).expect("expands");
    let s = get(&out, &["sources", "gmail"]).as_table().unwrap();
    assert_eq!(s["type"].as_str(), Some("gmail"));
    assert_eq!(s["span"].as_str(), Some("sync"));
    assert_eq!(s["quiet_s"].as_integer(), Some(5));
    assert_eq!(s["max_body_bytes"].as_integer(), Some(4096));
    assert_eq!(s["expect_every_s"].as_integer(), Some(345_600));
    assert_eq!(s["action"].as_str(), Some("script:gmail"));
    // The processor's own settings stay out of the source's table.
    assert!(s.get("owner").is_none());
}

#[test]
fn expand_rule_1_expect_only_when_asked() {
    let out = expand(&GMAIL_I.replace("expect = true", "")).expect("expands");
    assert!(
        get(&out, &["sources", "gmail"])
            .get("expect_every_s")
            .is_none()
    );
    let out = expand(&GMAIL_I.replace("expect = true", "expect_every_s = 60")).expect("expands");
    assert_eq!(
        get(&out, &["sources", "gmail", "expect_every_s"]).as_integer(),
        Some(60)
    );
    refused(
        &GITHUB_CI.replace("outputs =", "expect = true\noutputs ="),
        "recommends no expect_every_s",
    );
}

#[test]
fn expand_rule_2_processor_destination() {
    let out = expand(GMAIL_I).expect("expands");
    let d = get(&out, &["destinations", "script:gmail"])
        .as_table()
        .unwrap();
    assert_eq!(d["processor"].as_str(), Some("gmail"));
    assert_eq!(d["timeout_s"].as_integer(), Some(120));
    assert_eq!(d["max_inflight"].as_integer(), Some(1));
    assert_eq!(
        d["state_dir"].as_str(),
        Some("/var/lib/hookspool/bobbins/gmail")
    );
    let out = expand(&GMAIL_I.replace(
        "expect = true",
        "timeout_s = 30\nstate_dir = \"/srv/gmail-state\"",
    ))
    .expect("expands");
    let d = get(&out, &["destinations", "script:gmail"]);
    assert_eq!(d["timeout_s"].as_integer(), Some(30));
    assert_eq!(d["state_dir"].as_str(), Some("/srv/gmail-state"));
    refused(
        &GMAIL_I.replace("expect = true", "state_dir = \"state\""),
        "bobbins.gmail.state_dir: an absolute directory",
    );
}

#[test]
fn expand_rule_2_stateless_processor_has_no_state_dir() {
    let stateless = GMAIL.replace("timeout_s = 120", "timeout_s = 120\nstate = false");
    let cat = Catalog::default().with_entry(entry(&stateless, "google", "gmail"));
    let out = expand_config(&root(GMAIL_I), &cat, Path::new(HOME))
        .expect("expands")
        .root;
    assert!(
        get(&out, &["destinations", "script:gmail"])
            .get("state_dir")
            .is_none()
    );
    let e = expand_config(
        &root(&GMAIL_I.replace("expect = true", "state_dir = \"/srv/x\"")),
        &cat,
        Path::new(HOME),
    )
    .unwrap_err();
    assert!(e[0].to_string().contains("keeps no state"), "{e:?}");
}

fn env(out: &Table, name: &str) -> String {
    get(out, &["destinations", "script:gmail", "env", name])
        .as_str()
        .expect("string env")
        .to_string()
}

#[test]
fn expand_rule_3_bobbin_identity_env() {
    let out = expand(GMAIL_I).expect("expands");
    assert_eq!(env(&out, "HOOKSPOOL_BOBBIN"), "google.gmail");
    assert_eq!(env(&out, "HOOKSPOOL_BOBBIN_INSTANCE"), "gmail");
    assert_eq!(
        env(&out, "HOOKSPOOL_BOBBIN_DIR"),
        "/etc/hookspool/bobbins/google/gmail"
    );
}

#[test]
fn expand_rule_3_builtin_dir_is_materialised_under_home() {
    let mut e = entry(GMAIL, "google", "gmail");
    e.origin = Origin::BuiltIn;
    let cat = Catalog::default().with_entry(e);
    let out = expand_config(&root(GMAIL_I), &cat, Path::new(HOME))
        .expect("expands")
        .root;
    assert_eq!(
        env(&out, "HOOKSPOOL_BOBBIN_DIR"),
        "/var/lib/hookspool/builtin-bobbins/google/gmail"
    );
}

#[test]
fn expand_rule_4_settings_json_with_defaults() {
    let out = expand(GMAIL_I).expect("expands");
    let v: serde_json::Value =
        serde_json::from_str(&env(&out, "HOOKSPOOL_SETTINGS")).expect("json");
    assert_eq!(
        v,
        serde_json::json!({"owner": "owner@example.com", "tz": "UTC"})
    );
}

#[test]
fn expand_rule_5_delta_routes_json() {
    let out = expand(GMAIL_I).expect("expands");
    let v: serde_json::Value =
        serde_json::from_str(&env(&out, "HOOKSPOOL_DELTA_ROUTES")).expect("json");
    assert_eq!(
        v,
        serde_json::json!({"scheduling": "hermes:mail-scheduling", "agent-mail": "hermes:assistant-mail"})
    );
}

#[test]
fn expand_rule_6_secret_refs_are_references_of_processor_secrets() {
    let out = expand(GMAIL_I).expect("expands");
    let refs = env(&out, "HOOKSPOOL_SECRET_REFS");
    let v: serde_json::Value = serde_json::from_str(&refs).expect("json");
    assert_eq!(
        v,
        serde_json::json!({"cred_owner": {"file": "/etc/hookspool/google/owner.json"}})
    );
    refused(
        &GMAIL_I.replace(
            "secrets.cred_owner = { file = \"/etc/hookspool/google/owner.json\" }",
            "secrets.cred_owner = { env = \"OWNER\" }",
        ),
        "bobbins.gmail.secrets.cred_owner: the processor needs this secret and does not inherit",
    );
    // The source's own secret may come from the environment.
    assert!(
        expand(&GMAIL_I.replace(
            "secrets.token = { file = \"/etc/hookspool/secrets/gmail_token\" }",
            "secrets.token = { env = \"TOKEN\" }"
        ))
        .is_ok()
    );
}

#[test]
fn expand_rule_7_multi_output_routes_before_the_files_own() {
    let text = format!(
        "{GITHUB_CI}\n[[routes]]\nname = \"mine\"\nsource = \"github-ci\"\ndestination = \"hermes:mine\"\n"
    );
    let out = expand(&text).expect("expands");
    let routes = get(&out, &["routes"]).as_array().unwrap();
    assert_eq!(routes.len(), 2);
    assert_eq!(routes[0]["name"].as_str(), Some("github-ci-push"));
    assert_eq!(routes[0]["source"].as_str(), Some("github-ci"));
    assert_eq!(
        get(routes[0].as_table().unwrap(), &["match", "event_type"]).as_str(),
        Some("push")
    );
    assert_eq!(routes[0]["destination"].as_str(), Some("hermes:ci"));
    assert_eq!(routes[1]["name"].as_str(), Some("mine"));
}

#[test]
fn expand_rule_7_multi_output_needs_star() {
    refused(
        &GITHUB_CI.replace("\"*\" = \"hermes:github\", ", ""),
        "\"*\" must be mapped too",
    );
    refused(
        &GITHUB_CI.replace(
            "outputs = { \"*\" = \"hermes:github\", push = \"hermes:ci\" }",
            "",
        ),
        "map where events go",
    );
}

#[test]
fn expand_rule_7_processor_generates_no_routes_and_refuses_bypass() {
    let out = expand(GMAIL_I).expect("expands");
    assert!(out.get("routes").is_none());
    let bypass = format!(
        "{GMAIL_I}\n[[routes]]\nname = \"raw\"\nsource = \"gmail\"\ndestination = \"hermes:raw\"\n"
    );
    refused(
        &bypass,
        "routes[0].destination: source gmail is a processor bobbin instance",
    );
    let tee = format!(
        "{GMAIL_I}\n[[routes]]\nname = \"audit\"\nsource = \"gmail\"\ndestination = \"hermes:audit\"\ntee = true\n"
    );
    assert!(expand(&tee).is_ok());
}

#[test]
fn expand_rule_8_collisions_with_explicit_tables() {
    refused(
        &format!("{GITHUB_CI}\n[sources.github-ci]\ntype = \"github\"\n"),
        "sources.github-ci: [bobbins.github-ci] already defines this source",
    );
    refused(
        &format!("{GMAIL_I}\n[destinations.\"script:gmail\"]\nargv = [\"x\"]\n"),
        "destinations.\"script:gmail\": [bobbins.gmail] already defines",
    );
    refused(
        &format!("{GITHUB_CI}\n[[routes]]\nname = \"github-ci-push\"\nsource = \"github-ci\"\n"),
        "routes[0].name: github-ci-push is the route",
    );
}

#[test]
fn expand_rule_8_unknown_instance_keys() {
    refused(
        &GITHUB_CI.replace("bobbin =", "colour = \"red\"\nbobbin ="),
        "bobbins.github-ci.colour: unknown instance key",
    );
    refused(
        &GITHUB_CI.replace("bobbin =", "timeout_s = 5\nbobbin ="),
        "bobbins.github-ci.timeout_s: github.repo has no processor",
    );
}

#[test]
fn expand_rule_8_missing_bobbin_did_you_mean() {
    let e = errors("[bobbins.gmail]\nsettings = { owner = \"a@example.com\" }\n");
    assert_eq!(
        e,
        vec![
            "bobbins.gmail.bobbin: required (did you mean bobbin = \"google.gmail\"?)".to_string()
        ]
    );
    let e = errors("[bobbins.github-prs]\noutputs = { \"*\" = \"hermes:x\" }\n");
    assert!(
        e[0].contains("did you mean bobbin = \"github.repo\""),
        "{e:?}"
    );
    let e = errors("[bobbins.zzz]\noutputs = { \"*\" = \"hermes:x\" }\n");
    assert!(e[0].contains("bobbin list shows"), "{e:?}");
}

#[test]
fn expand_rule_8_dotted_header_refused_with_plain_form() {
    let e = errors("[bobbins.google.gmail]\nsettings = { owner = \"a@example.com\" }\n");
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("bobbins.google: [bobbins.google.gmail] is a dotted header"),
        "{e:?}"
    );
    assert!(
        e[0].contains("[bobbins.gmail] with bobbin = \"google.gmail\""),
        "{e:?}"
    );
}

#[test]
fn expand_rule_8_unknown_bobbin() {
    refused(
        &GITHUB_CI.replace("github.repo", "gitlab.projects"),
        "no bobbin gitlab.projects is installed; write one of github.repo",
    );
    refused(
        &GITHUB_CI.replace("github.repo", "github"),
        "exactly one dot",
    );
}

#[test]
fn expand_rule_8_required_setting_and_secret() {
    refused(
        &GMAIL_I.replace("settings = { owner = \"owner@example.com\" }", ""),
        "bobbins.gmail.settings.owner: required (the owner's mailbox)",
    );
    refused(
        &GMAIL_I.replace(
            "secrets.token = { file = \"/etc/hookspool/secrets/gmail_token\" }",
            "",
        ),
        "bobbins.gmail.secrets.token: required",
    );
}

#[test]
fn expand_rule_8_setting_type_and_unknown_names() {
    refused(
        &GMAIL_I.replace("owner = \"owner@example.com\"", "owner = 5"),
        "bobbins.gmail.settings.owner: must be of type string",
    );
    refused(
        &GMAIL_I.replace(
            "owner = \"owner@example.com\"",
            "owner = \"o@example.com\", colour = \"red\"",
        ),
        "bobbins.gmail.settings.colour: google.gmail has no setting colour",
    );
    refused(
        &GMAIL_I.replace("scheduling =", "nope = \"hermes:x\", scheduling ="),
        "bobbins.gmail.outputs.nope: google.gmail has no output nope",
    );
    refused(
        &GITHUB_CI.replace(
            "{ file = \"/etc/hookspool/secrets/github\" }",
            "\"plain-text\"",
        ),
        "not a secret reference",
    );
    refused(
        &GITHUB_CI.replace("secrets.secret", "secrets.token"),
        "github.repo has no secret token",
    );
}

#[test]
fn expand_rule_8_processor_output_destination_exists() {
    refused(
        &GMAIL_I.replace("\"hermes:mail-scheduling\"", "\"http:calendar\""),
        "bobbins.gmail.outputs.scheduling: no destination \"http:calendar\"",
    );
    let defined = format!(
        "{}\n[destinations.\"http:calendar\"]\ntype = \"http\"\nurl = \"https://x.example.org/\"\n",
        GMAIL_I.replace("\"hermes:mail-scheduling\"", "\"http:calendar\"")
    );
    assert!(expand(&defined).is_ok());
    refused(
        &GMAIL_I.replace("\"hermes:mail-scheduling\"", "\"quarantine\""),
        "quarantine is reserved",
    );
}

#[test]
fn expand_settings_template_values_and_unset() {
    let text = r#"
[bobbins.webhook]
bobbin = "hookspool.webhook"
secrets.secret = { file = "/etc/hookspool/secrets/webhook" }
settings = { scheme = "hmac-sha256-hex", header = "X-Signature", prefix = "", key = ["payload.id"] }
outputs = { "*" = "hermes:webhook" }
"#;
    let out = expand(text).expect("expands");
    let s = get(&out, &["sources", "webhook"]).as_table().unwrap();
    assert_eq!(s["type"].as_str(), Some("template"));
    assert_eq!(s["header"].as_str(), Some("X-Signature"));
    // "" and {} (given or default) mean unset: left out.
    assert!(s.get("prefix").is_none());
    assert!(s.get("attrs").is_none());
    assert!(s.get("event_type").is_none());
}

#[test]
fn expand_settings_template_maps_any_event_type_with_attrs_event_type() {
    let base = r#"
[bobbins.webhook]
bobbin = "hookspool.webhook"
secrets.secret = { file = "/etc/hookspool/secrets/webhook" }
settings = { scheme = "hmac-sha256-hex", header = "X-Signature", key = ["payload.id"], event_type = "header.X-Event" ATTRS }
outputs = { "*" = "hermes:webhook", "order.paid" = "hermes:orders" }
"#;
    let e = errors(&base.replace(" ATTRS", ""));
    assert!(
        e.iter()
            .any(|m| m.starts_with("bobbins.webhook.settings.attrs:")
                && m.contains("attrs = { event_type = \"header.X-Event\" }")),
        "{e:?}"
    );
    refused(
        &base.replace(" ATTRS", ", attrs = { event_type = \"payload.type\" }"),
        "attrs.event_type must be the event_type selector",
    );
    let out = expand(&base.replace(" ATTRS", ", attrs = { event_type = \"header.X-Event\" }"))
        .expect("expands");
    let routes = get(&out, &["routes"]).as_array().unwrap();
    assert_eq!(routes[0]["name"].as_str(), Some("webhook-order.paid"));
    assert_eq!(
        get(&out, &["sources", "webhook", "attrs", "event_type"]).as_str(),
        Some("header.X-Event")
    );
    // A bobbin with declared outputs does not take undeclared ones.
    refused(
        &GITHUB_CI.replace("push =", "\"order.paid\" ="),
        "github.repo has no output order.paid",
    );
}

#[test]
fn expand_instance_name_is_an_identifier() {
    let e = expand_instance(
        "Git.Hub",
        &Value::Table(root("bobbin = \"github.repo\"\nsecrets.secret = { file = \"/s\" }\noutputs = { \"*\" = \"hermes:x\" }")),
        &catalog(),
        &Table::new(),
        Path::new(HOME),
    )
    .unwrap_err();
    assert!(e[0].message.contains("plain identifier"), "{e:?}");
}

#[test]
fn expand_config_without_bobbins_is_unchanged() {
    let r = root("[sources.github]\ntype = \"github\"\n");
    assert_eq!(
        expand_config(&r, &catalog(), Path::new(HOME)).unwrap().root,
        r
    );
}

#[test]
fn expand_processor_network_follows_api_docs() {
    let network = |cat: &Catalog| {
        let out = expand_config(&root(GMAIL_I), cat, Path::new(HOME))
            .expect("expands")
            .root;
        get(
            &out,
            &["destinations", "script:gmail", "sandbox", "network"],
        )
        .clone()
    };
    // This manifest names no API reference: its processor gets no network.
    assert_eq!(network(&catalog()), Value::Boolean(false));
    let with_api = GMAIL.replace(
        "signature_docs = \"https://cloud.google.com/pubsub/docs/push\"",
        "signature_docs = \"https://cloud.google.com/pubsub/docs/push\"\napi_docs = \"https://developers.google.com/workspace/gmail/api/reference/rest\"",
    );
    let cat = catalog().with_entry(entry(&with_api, "google", "gmail"));
    assert_eq!(network(&cat), Value::Boolean(true));
}

#[test]
fn expand_processor_env_is_the_script_destinations_processor_env() {
    let out = expand_config(&root(GMAIL_I), &catalog(), Path::new(HOME))
        .expect("expands")
        .root;
    let env = get(&out, &["destinations", "script:gmail", "env"])
        .as_table()
        .expect("env table");
    let mut names: Vec<&str> = env.keys().map(String::as_str).collect();
    names.sort();
    let mut want = crate::destinations::script::PROCESSOR_ENV.to_vec();
    want.sort();
    assert_eq!(names, want);
}

#[test]
fn expand_instances_map_expanded_keys_to_instance_keys() {
    let e = expand_config(&root(GMAIL_I), &catalog(), Path::new(HOME)).expect("expands");
    let i = &e.instances;
    assert_eq!(
        i.config_key("destinations.\"script:gmail\".timeout_s"),
        "bobbins.gmail.timeout_s"
    );
    assert_eq!(
        i.config_key("destinations.\"script:gmail\".env"),
        "bobbins.gmail"
    );
    assert_eq!(
        i.config_key("sources.gmail.secrets.token"),
        "bobbins.gmail.secrets.token"
    );
    assert_eq!(
        i.config_key("sources.gmail.expect_every_s"),
        "bobbins.gmail.expect_every_s"
    );
    assert_eq!(i.config_key("intake.listen"), "intake.listen");
}

/// Issue 29: the built-in bobbins declare what their code requires of a setting, and the
/// expansion (check, start, reload) refuses a value that breaks it, at the instance's key.
#[test]
fn expand_refuses_a_setting_value_the_builtin_code_would_refuse() {
    let builtin = Catalog::builtin();
    let refusals = |text: &str| -> Vec<String> {
        expand_config(&root(text), &builtin, Path::new(HOME))
            .map(|_| Vec::new())
            .unwrap_or_else(|e| e.into_iter().map(|e| e.to_string()).collect())
    };
    let feed = |url: &str| {
        format!(
            "[bobbins.feed]\nbobbin = \"hookspool.feed\"\nsettings = {{ url = \"{url}\" }}\noutputs = {{ entry = \"hermes:feed\" }}\n"
        )
    };
    assert_eq!(
        refusals(&feed("https://feeds.example.org/a.xml")),
        Vec::<String>::new()
    );
    for bad in [
        "http://feeds.example.org/a.xml",
        "feeds.example.org/a.xml",
        "https://",
    ] {
        let e = refusals(&feed(bad));
        assert!(
            e.iter()
                .any(|m| m.starts_with("bobbins.feed.settings.url: ")
                    && m.contains("is not an https URL")),
            "{bad}: {e:#?}"
        );
    }
    let gmail = |settings: &str| {
        GMAIL_I.replace(
            "settings = { owner = \"owner@example.com\" }",
            &format!("settings = {{ owner = \"owner@example.com\", {settings} }}"),
        )
    };
    for (settings, needle) in [
        (
            "horizon_days = 90",
            "bobbins.gmail.settings.horizon_days: 90 is out of range; write a whole number from 1 to 60",
        ),
        (
            "min_window_minutes = 0",
            "bobbins.gmail.settings.min_window_minutes: 0 is too small; write a whole number of at least 1",
        ),
        (
            "rule_packs = [\"../x\"]",
            "bobbins.gmail.settings.rule_packs: \"../x\" does not match the pattern",
        ),
    ] {
        let text = gmail(settings).replace(
            "agent-mail = \"hermes:assistant-mail\"",
            "mail = \"hermes:assistant-mail\"",
        );
        let e = refusals(&text);
        assert!(e.iter().any(|m| m.contains(needle)), "{needle}: {e:#?}");
    }
}
