//! The poll rules of spec 14.4 in the manifest, the expansion and the config loader, one
//! test each, named after the rule.

use std::path::{Path, PathBuf};

use toml::{Table, Value};

use crate::bobbins::catalog::{Catalog, Entry, Origin};
use crate::bobbins::expand::expand_config;
use crate::bobbins::manifest::{Body, Manifest, ProcessorImpl};

const TASKS: &str = r#"
name = "acme.tasks"
version = "1"
summary = "Acme task lists, polled"
[provider]
vendor = "Acme"
product = "Tasks"
homepage = "https://acme.com/"
api_docs = "https://developers.acme.com/tasks"
no_push_note = "The Tasks API has no webhooks."
no_push_docs = "https://developers.acme.com/tasks"
[poll]
every_s = 900
builtin = "acme.tasks"
timeout_s = 120
[secrets.cred]
description = "the OAuth credential"
processor = true
[settings.list]
description = "the task list"
type = "string"
default = "@default"
[outputs.changed]
description = "a task changed"
"#;

const HOME: &str = "/var/lib/hookspool";

const INSTANCE: &str = r#"
[bobbins.tasks]
bobbin = "acme.tasks"
secrets.cred = { file = "/etc/hookspool/secrets/cred.json" }
outputs = { changed = "hermes:tasks" }
"#;

fn catalog() -> Catalog {
    Catalog::default().with_entry(Entry {
        manifest: Manifest::parse(TASKS).expect("test manifest"),
        origin: Origin::Path(PathBuf::from("/etc/hookspool/bobbins")),
        vendor_dir: "acme".into(),
        product_dir: "tasks".into(),
        installed: None,
    })
}

fn expand(text: &str) -> Result<Table, Vec<String>> {
    let root: Table = toml::from_str(text).unwrap();
    expand_config(&root, &catalog(), Path::new(HOME))
        .map(|e| e.root)
        .map_err(|e| e.into_iter().map(|e| e.to_string()).collect())
}

fn load(text: &str) -> Result<crate::config::Config, Vec<String>> {
    let inputs = crate::config::PathInputs {
        home_flag: Some(HOME.into()),
        ..Default::default()
    };
    crate::config::parse_with_catalog(text, None, &inputs, true, &catalog())
        .map(|(c, _)| c)
        .map_err(|e| e.into_iter().map(|p| p.to_string()).collect())
}

fn refused(text: &str, needle: &str) {
    let e = load(text).expect_err("refused");
    assert!(
        e.iter().any(|m| m.contains(needle)),
        "{needle:?} not in {e:#?}"
    );
}

#[test]
fn poll_manifest_builtin_or_exec_and_default_jitter() {
    let m = Manifest::parse(TASKS).unwrap();
    let Body::Poll(p) = &m.body else {
        panic!("poll")
    };
    assert_eq!(p.imp, ProcessorImpl::Builtin("acme.tasks".into()));
    assert_eq!((p.every_s, p.jitter_s, p.jitter_given), (900, 90, false));
    // 10 % of every_s, capped at 300.
    let long = Manifest::parse(&TASKS.replace("every_s = 900", "every_s = 86400")).unwrap();
    let Body::Poll(p) = &long.body else {
        panic!("poll")
    };
    assert_eq!(p.jitter_s, 300);
    let both = TASKS.replace(
        "builtin = \"acme.tasks\"",
        "builtin = \"acme.tasks\"\nexec = \"poller\"",
    );
    let e = Manifest::parse(&both).unwrap_err();
    assert!(
        e[0].message.contains("exactly one of exec or builtin"),
        "{e:?}"
    );
    let neither = TASKS.replace("builtin = \"acme.tasks\"\n", "");
    let e = Manifest::parse(&neither).unwrap_err();
    assert!(e[0].message.contains("give exec"), "{e:?}");
}

#[test]
fn poll_expansion_source_is_type_poll_with_schedule_and_immediate_span() {
    let out = expand(INSTANCE).unwrap();
    let s = out["sources"]["tasks"].as_table().unwrap();
    assert_eq!(s["type"].as_str(), Some("poll"));
    assert_eq!(s["every_s"].as_integer(), Some(900));
    assert_eq!(s["jitter_s"].as_integer(), Some(90));
    assert_eq!(s["span"].as_str(), Some("immediate"));
    assert_eq!(s["action"].as_str(), Some("script:tasks"));
    assert!(s.contains_key("secrets"));
    let keys: Vec<&str> = s.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["action", "every_s", "jitter_s", "secrets", "span", "type"]
    );
}

#[test]
fn poll_expansion_destination_is_the_processor_destination() {
    let out = expand(INSTANCE).unwrap();
    let d = out["destinations"]["script:tasks"].as_table().unwrap();
    assert_eq!(d["processor"].as_str(), Some("tasks"));
    assert_eq!(d["timeout_s"].as_integer(), Some(120));
    assert_eq!(d["max_inflight"].as_integer(), Some(1));
    assert_eq!(
        d["state_dir"].as_str(),
        Some("/var/lib/hookspool/bobbins/tasks")
    );
    let env = d["env"].as_table().unwrap();
    assert_eq!(env["HOOKSPOOL_BOBBIN"].as_str(), Some("acme.tasks"));
    assert!(
        env["HOOKSPOOL_SECRET_REFS"]
            .as_str()
            .unwrap()
            .contains("cred.json")
    );
    assert_eq!(
        env["HOOKSPOOL_DELTA_ROUTES"].as_str(),
        Some(r#"{"changed":"hermes:tasks"}"#)
    );
    // The poller calls the provider's API: the manifest names api_docs.
    assert_eq!(d["sandbox"]["network"].as_bool(), Some(true));
    assert!(
        out.get("routes").is_none(),
        "a poll bobbin generates no routes"
    );
}

#[test]
fn poll_instance_overrides_every_s_and_jitter_s_within_the_bounds() {
    let out = expand(&format!("{INSTANCE}every_s = 3600\n")).unwrap();
    let s = &out["sources"]["tasks"];
    // The default jitter follows the instance's period.
    assert_eq!(
        (s["every_s"].as_integer(), s["jitter_s"].as_integer()),
        (Some(3600), Some(300))
    );
    let out = expand(&format!("{INSTANCE}every_s = 600\njitter_s = 0\n")).unwrap();
    let s = &out["sources"]["tasks"];
    assert_eq!(
        (s["every_s"].as_integer(), s["jitter_s"].as_integer()),
        (Some(600), Some(0))
    );
    for (extra, needle) in [
        (
            "every_s = 59\n",
            "bobbins.tasks.every_s: a whole number of seconds from 60",
        ),
        (
            "jitter_s = 301\n",
            "bobbins.tasks.jitter_s: a whole number of seconds from 0 to 300",
        ),
        (
            "every_s = \"900\"\n",
            "bobbins.tasks.every_s: has the wrong type",
        ),
    ] {
        let e = expand(&format!("{INSTANCE}{extra}")).unwrap_err();
        assert!(
            e.iter().any(|m| m.contains(needle)),
            "{needle:?} not in {e:?}"
        );
    }
}

#[test]
fn poll_instance_refuses_window_expect_and_body_keys() {
    for k in [
        "expect = true",
        "span = \"burst\"",
        "quiet_s = 5",
        "max_s = 5",
        "max_events = 5",
        "max_bytes = 5000",
        "expect_every_s = 60",
        "dedup_window_s = 60",
        "max_body_bytes = 500",
    ] {
        let key = k.split(' ').next().unwrap();
        let e = expand(&format!("{INSTANCE}{k}\n")).unwrap_err();
        assert!(
            e.iter()
                .any(|m| m.starts_with(&format!("bobbins.tasks.{key}:"))
                    && m.contains("a poll has no sender and no window")),
            "{k}: {e:?}"
        );
    }
}

#[test]
fn poll_only_keys_are_refused_on_a_webhook_bobbin() {
    let text = r#"
[bobbins.demo]
bobbin = "hookspool.webhook"
secrets.secret = { file = "/etc/hookspool/secrets/demo" }
settings = { scheme = "hmac-sha256-hex", header = "X-Sig", key = "id" }
outputs = { "*" = "hermes:demo" }
every_s = 900
"#;
    let inputs = crate::config::PathInputs {
        home_flag: Some(HOME.into()),
        ..Default::default()
    };
    let e = crate::config::parse(text, None, &inputs, true).unwrap_err();
    assert!(
        e.iter()
            .any(|p| p.key == "bobbins.demo.every_s" && p.message.contains("is not polled")),
        "{e:?}"
    );
}

#[test]
fn poll_source_loads_with_its_schedule_and_route() {
    let c = load(INSTANCE).unwrap();
    let s = &c.sources["tasks"];
    assert!(s.is_poll());
    let p = s.poll.unwrap();
    assert_eq!((p.every_s, p.jitter_s), (900.0, 90.0));
    assert_eq!(s.action.as_deref(), Some("script:tasks"));
    assert!(
        c.bobbins
            .get("tasks")
            .is_some_and(|o| o.poll && o.processor)
    );
}

#[test]
fn poll_kind_only_from_a_poll_bobbins_expansion() {
    refused(
        "[sources.tick]\ntype = \"poll\"\nevery_s = 900\naction = \"hermes:x\"\n",
        "sources.tick.type: type = \"poll\" is written by a poll bobbin's",
    );
    // Beside a real poll instance, a hand-written one is still refused.
    refused(
        &format!("{INSTANCE}\n[sources.other]\ntype = \"poll\"\nevery_s = 900\n"),
        "sources.other.type",
    );
}

#[test]
fn poll_source_keys_are_only_a_poll_sources() {
    // A key the expansion never writes is named with the keys a poll source has.
    let root: Table = toml::from_str(INSTANCE).unwrap();
    let mut expanded = expand_config(&root, &catalog(), Path::new(HOME))
        .unwrap()
        .root;
    let src = expanded["sources"]["tasks"].as_table_mut().unwrap();
    src.insert("quiet_s".into(), Value::Integer(5));
    src.insert("header".into(), Value::String("X-Sig".into()));
    let raw: crate::config::raw::RawConfig = Value::Table(expanded).try_into().unwrap();
    let inputs = crate::config::PathInputs {
        home_flag: Some(HOME.into()),
        ..Default::default()
    };
    let e = crate::config::validate_raw(raw, Vec::new(), None, &inputs, true).unwrap_err();
    for key in ["quiet_s", "header"] {
        assert!(
            e.iter().any(|p| p.key == format!("sources.tasks.{key}")
                && p.message.contains("a poll source's keys: type, every_s")),
            "{key}: {e:?}"
        );
    }
    // every_s on a webhook source.
    let e = crate::config::parse(
        "[sources.gh]\ntype = \"github\"\nevery_s = 900\n",
        None,
        &crate::config::PathInputs::default(),
        true,
    )
    .unwrap_err();
    assert!(e.iter().any(|p| p.key == "sources.gh.every_s"), "{e:?}");
}
