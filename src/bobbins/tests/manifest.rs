//! Every validation rule of spec 14.3.2 and 14.3.2a, one test each, named after the rule.

use crate::bobbins::manifest::{Body, Manifest, OutputKey, ProcessorImpl, SettingType, SourceImpl};

/// A valid fixed-template manifest (GitHub's signature rules).
pub const GITHUB: &str = r#"
name = "github.repo"
version = "1"
summary = "GitHub repository webhooks"

[provider]
vendor = "GitHub"
product = "Repository webhooks"
homepage = "https://github.com/"
webhook_docs = "https://docs.github.com/en/webhooks"
signature_docs = "https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries"

[source]
template = { scheme = "hmac-sha256-hex", header = "X-Hub-Signature-256", prefix = "sha256=", key = "payload.repository.full_name", event_type = "header.X-GitHub-Event", attrs = { event_type = "header.X-GitHub-Event" } }
span = "burst"
sender_retries = false

[secrets.secret]
description = "the webhook secret"

[outputs.push]
description = "a push"
[outputs.pull_request]
description = "a pull request changed"
[outputs."*"]
description = "every accepted event"
"#;

fn problems(text: &str) -> Vec<String> {
    match Manifest::parse(text) {
        Ok(_) => Vec::new(),
        Err(p) => p
            .into_iter()
            .map(|p| format!("{}: {}", p.line, p.message))
            .collect(),
    }
}

/// The manifest fails with a problem containing `needle`, on line `line` when given.
fn refused(text: &str, needle: &str, line: Option<usize>) {
    let p = problems(text);
    assert!(
        p.iter().any(|m| m.contains(needle)),
        "expected {needle:?} in {p:#?}"
    );
    if let Some(line) = line {
        assert!(
            p.iter()
                .any(|m| m.starts_with(&format!("{line}: ")) && m.contains(needle)),
            "expected line {line}: {p:#?}"
        );
    }
}

#[test]
fn manifest_valid_parses_into_types() {
    let m = Manifest::parse(GITHUB).expect("valid");
    assert_eq!(m.name.to_string(), "github.repo");
    assert_eq!(m.outputs.len(), 3);
    assert!(m.outputs.contains_key(&OutputKey::All));
    let Body::Push { source, processor } = &m.body else {
        panic!("push")
    };
    assert!(processor.is_none());
    assert!(matches!(source.imp, SourceImpl::Fixed(_)));
    assert_eq!(source.span.as_deref(), Some("burst"));
    assert!(m.secrets["secret"].required);
}

#[test]
fn manifest_rule_unknown_keys() {
    refused(
        &format!("colour = \"red\"\n{GITHUB}"),
        "colour: unknown key",
        Some(1),
    );
    refused(
        &GITHUB.replace("span = \"burst\"", "span = \"burst\"\nspin = 1"),
        "source.spin: unknown key",
        None,
    );
    refused(
        &GITHUB.replace(
            "description = \"the webhook secret\"",
            "description = \"x\"\nrotate = true",
        ),
        "secrets.secret.rotate",
        None,
    );
}

#[test]
fn manifest_rule_name_is_vendor_product() {
    refused(
        &GITHUB.replace("name = \"github.repo\"", "name = \"github\""),
        "exactly one dot",
        Some(2),
    );
    refused(
        &GITHUB.replace("name = \"github.repo\"", "name = \"GitHub.repo\""),
        "must start with a-z",
        Some(2),
    );
    refused(
        &GITHUB.replace("name = \"github.repo\"\n", ""),
        "name: required",
        None,
    );
}

#[test]
fn manifest_rule_both_or_neither_builtin_template() {
    refused(
        &GITHUB.replace("span = \"burst\"", "span = \"burst\"\nbuiltin = \"github\""),
        "exactly one of builtin or template",
        None,
    );
    let neither = GITHUB.replace(
        &GITHUB[GITHUB.find("template = {").unwrap()..GITHUB.find("span = \"burst\"").unwrap()],
        "",
    );
    refused(&neither, "give exactly one of builtin", None);
}

#[test]
fn manifest_rule_module_refused_with_advice() {
    let m = GITHUB.replace("span = \"burst\"", "span = \"burst\"\nmodule = \"source\"");
    refused(&m, "this build has no source modules: write builtin", None);
    let p = format!("{GITHUB}\n[processor]\nmodule = \"processor\"\n");
    refused(
        &p,
        "processor.module: this build has no processor modules: write exec",
        None,
    );
}

#[test]
fn manifest_rule_builtin_names_a_source_kind() {
    let b = GITHUB.replace(
        &GITHUB[GITHUB.find("template = {").unwrap()..GITHUB.find("span = \"burst\"").unwrap()],
        "builtin = \"github\"\n",
    );
    let m = Manifest::parse(&b).expect("builtin github");
    assert!(matches!(
        m.source().unwrap().imp,
        SourceImpl::Builtin("github")
    ));
    refused(
        &b.replace("builtin = \"github\"", "builtin = \"gitlab\""),
        "not a built-in source; write one of github, zoom",
        None,
    );
    refused(
        &b.replace("builtin = \"github\"", "builtin = \"template\""),
        "the template source is not a builtin",
        None,
    );
}

#[test]
fn manifest_rule_template_is_table_or_settings() {
    let s = GITHUB.replace(
        &GITHUB[GITHUB.find("template = {").unwrap()..GITHUB.find("span = \"burst\"").unwrap()],
        "template = \"fixed\"\n",
    );
    refused(&s, "template = \"settings\"", None);
}

#[test]
fn manifest_rule_span_is_a_preset() {
    refused(
        &GITHUB.replace("span = \"burst\"", "span = \"bursty\""),
        "not a span preset; write one of burst, mail",
        None,
    );
}

#[test]
fn manifest_rule_setting_needs_a_type() {
    let m = format!("{GITHUB}\n[settings.attrs]\ndescription = \"x\"\ndefault = {{}}\n");
    refused(&m, "settings.attrs.type: required", None);
    let m = format!(
        "{GITHUB}\n[settings.attrs]\ndescription = \"x\"\ntype = \"map\"\ndefault = {{}}\n"
    );
    refused(
        &m,
        "\"map\" is not a setting type; write one of string|int|bool|list|path|table",
        None,
    );
}

#[test]
fn manifest_rule_default_of_the_right_type() {
    for (ty, bad) in [
        ("string", "3"),
        ("int", "\"3\""),
        ("bool", "\"yes\""),
        ("list", "\"a\""),
        ("table", "[]"),
        ("path", "\"relative/hooks.py\""),
    ] {
        let m = format!(
            "{GITHUB}\n[settings.owner]\ndescription = \"x\"\ntype = \"{ty}\"\ndefault = {bad}\n[processor]\nexec = \"processor\"\n"
        );
        refused(&m, "settings.owner.default: the default", None);
    }
    for (ty, good) in [
        ("string", "\"\""),
        ("int", "3"),
        ("bool", "false"),
        ("list", "[]"),
        ("table", "{}"),
        ("path", "\"/etc/hookspool/hooks.py\""),
    ] {
        let m = format!(
            "{GITHUB}\n[settings.owner]\ndescription = \"x\"\ntype = \"{ty}\"\ndefault = {good}\n[processor]\nexec = \"processor\"\n"
        );
        assert_eq!(problems(&m), Vec::<String>::new(), "{ty}");
        let parsed = Manifest::parse(&m).unwrap();
        assert_eq!(parsed.settings["owner"].ty.as_str(), ty);
    }
}

#[test]
fn manifest_rule_non_required_setting_needs_a_default() {
    let m = format!(
        "{GITHUB}\n[settings.owner]\ndescription = \"x\"\ntype = \"string\"\n[processor]\nexec = \"processor\"\n"
    );
    refused(&m, "a setting that is not required needs a default", None);
    let ok = m.replace(
        "type = \"string\"\n",
        "type = \"string\"\nrequired = true\n",
    );
    assert_eq!(problems(&ok), Vec::<String>::new());
}

#[test]
fn manifest_rule_provider_values_are_strings() {
    refused(
        &GITHUB.replace("vendor = \"GitHub\"", "vendor = 7"),
        "provider.vendor: must be a string",
        None,
    );
    refused(
        &GITHUB.replace("[provider]\n", "[provider]\nlogo = \"x\"\n"),
        "provider.logo: not a [provider] key",
        None,
    );
    refused(
        &GITHUB.replace("[provider]", "[providers]"),
        "provider: required",
        None,
    );
}

#[test]
fn manifest_rule_output_keys_are_event_type_tokens() {
    refused(
        &GITHUB.replace("[outputs.push]", "[outputs.\"push event\"]"),
        "is not an event-type token",
        None,
    );
    refused(
        &GITHUB.replace("[outputs.push]", "[outputs.\"**\"]"),
        "is not an event-type token",
        None,
    );
    let m = GITHUB.replace("[outputs.push]", "[outputs.\"meeting.started\"]");
    assert_eq!(problems(&m), Vec::<String>::new());
}

#[test]
fn manifest_rule_outputs_required() {
    let cut = &GITHUB[..GITHUB.find("[outputs.push]").unwrap()];
    refused(cut, "declare at least one output", None);
}

#[test]
fn manifest_rule_fixed_template_keys_never_overridden() {
    let m = format!(
        "{GITHUB}\n[settings.header]\ndescription = \"x\"\ntype = \"string\"\ndefault = \"\"\n"
    );
    refused(&m, "the fixed template already sets header", None);
}

#[test]
fn manifest_rule_template_setting_type_follows_key() {
    let m = format!(
        "{GITHUB}\n[settings.head_handshake]\ndescription = \"x\"\ntype = \"string\"\ndefault = \"\"\n"
    );
    refused(&m, "head_handshake is a template key of type bool", None);
    let m =
        format!("{GITHUB}\n[settings.dedup]\ndescription = \"x\"\ntype = \"list\"\ndefault = []\n");
    refused(&m, "dedup is a template key of type string", None);
}

#[test]
fn manifest_rule_template_without_processor_declares_only_template_keys() {
    let m = format!(
        "{GITHUB}\n[settings.owner]\ndescription = \"x\"\ntype = \"string\"\ndefault = \"\"\n"
    );
    refused(
        &m,
        "owner is not a template key, and a template bobbin without a processor would drop it",
        None,
    );
}

#[test]
fn manifest_rule_settings_form_needs_scheme_and_key() {
    let m = GITHUB.replace(
        &GITHUB[GITHUB.find("template = {").unwrap()..GITHUB.find("span = \"burst\"").unwrap()],
        "template = \"settings\"\n",
    );
    refused(&m, "add [settings.scheme]", None);
    refused(&m, "add [settings.key]", None);
}

#[test]
fn manifest_rule_builtin_settings_reach_the_source_through_config() {
    let b = GITHUB.replace(
        &GITHUB[GITHUB.find("template = {").unwrap()..GITHUB.find("span = \"burst\"").unwrap()],
        "builtin = \"plaid\"\nconfig = [\"env\"]\n",
    );
    let with_env = format!(
        "{b}\n[settings.env]\ndescription = \"sandbox or production\"\ntype = \"string\"\ndefault = \"production\"\n"
    );
    assert_eq!(problems(&with_env), Vec::<String>::new());
    refused(&b, "\"env\" is not a declared setting", None);
    let extra = format!(
        "{with_env}\n[settings.owner]\ndescription = \"x\"\ntype = \"string\"\ndefault = \"\"\n"
    );
    refused(&extra, "add \"owner\" to [source] config", None);
}

#[test]
fn manifest_rule_processor_exec_or_builtin() {
    let p = Manifest::parse(&format!(
        "{GITHUB}\n[processor]\nexec = \"bin/processor\"\ntimeout_s = 120\nstate = false\n"
    ))
    .expect("exec");
    let proc_ = p.processor().unwrap();
    assert_eq!(proc_.imp, ProcessorImpl::Exec("bin/processor".into()));
    assert_eq!((proc_.timeout_s, proc_.state), (120, false));
    let b =
        Manifest::parse(&format!("{GITHUB}\n[processor]\nbuiltin = \"gmail\"\n")).expect("builtin");
    assert_eq!(
        b.processor().unwrap().imp,
        ProcessorImpl::Builtin("gmail".into())
    );
    assert_eq!(b.processor().unwrap().timeout_s, 300);
    assert!(b.processor().unwrap().state);
    refused(
        &format!("{GITHUB}\n[processor]\nexec = \"../x\"\n"),
        "a file inside this bobbin's directory",
        None,
    );
    refused(
        &format!("{GITHUB}\n[processor]\nexec = \"/usr/bin/x\"\n"),
        "a file inside this bobbin's directory",
        None,
    );
    refused(
        &format!("{GITHUB}\n[processor]\nexec = \"p\"\nbuiltin = \"p\"\n"),
        "exactly one of exec or builtin",
        None,
    );
    refused(
        &format!("{GITHUB}\n[processor]\nexec = \"p\"\ntimeout_s = 0\n"),
        "whole number from 1 to 3600",
        None,
    );
}

/// Issue 29: the files a processor loads are declared, so 14.3.6's owner and mode rules
/// reach them (`catalog::check_code`); each is a file inside the bobbin.
#[test]
fn manifest_rule_processor_loads_are_files_in_the_bobbin() {
    let m = Manifest::parse(&format!(
        "{GITHUB}\n[processor]\nexec = \"bin/p\"\nloads = [\"lib/a.sh\", \"data.json\"]\n"
    ))
    .expect("loads");
    let files: Vec<(String, &str)> = m.code_files();
    assert_eq!(
        files,
        [
            ("processor.exec".to_string(), "bin/p"),
            ("processor.loads[0]".to_string(), "lib/a.sh"),
            ("processor.loads[1]".to_string(), "data.json"),
        ]
    );
    for bad in ["[\"../a\"]", "[\"/etc/a\"]", "[\"a//b\"]", "\"a\"", "[1]"] {
        refused(
            &format!("{GITHUB}\n[processor]\nexec = \"p\"\nloads = {bad}\n"),
            "processor.loads",
            None,
        );
    }
}

#[test]
fn manifest_rule_poll_parsed_and_exclusive() {
    let cut = GITHUB.replace(
        &GITHUB[GITHUB.find("[source]").unwrap()..GITHUB.find("[secrets.secret]").unwrap()],
        "[poll]\nevery_s = 900\nexec = \"poller\"\n",
    );
    let m = Manifest::parse(&cut).expect("poll");
    let Body::Poll(p) = &m.body else {
        panic!("poll")
    };
    assert_eq!(
        (p.every_s, p.jitter_s, p.timeout_s, p.state),
        (900, 90, 300, true)
    );
    refused(
        &cut.replace("every_s = 900", "every_s = 30"),
        "from 60",
        None,
    );
    refused(
        &cut.replace("every_s = 900", "every_s = 900\njitter_s = 301"),
        "from 0 to 300",
        None,
    );
    refused(
        &cut.replace("exec = \"poller\"", "module = \"poller\""),
        "poll.module: this build has no processor modules",
        None,
    );
    refused(
        &format!("{GITHUB}\n[poll]\nevery_s = 900\nexec = \"poller\"\n"),
        "has [poll] and no [source] or [processor]",
        None,
    );
}

#[test]
fn manifest_rule_secret_and_setting_shapes() {
    refused(
        &GITHUB.replace("description = \"the webhook secret\"", "processor = true"),
        "secrets.secret.description: required",
        None,
    );
    refused(
        &GITHUB.replace("[secrets.secret]", "[secrets.Secret]"),
        "a secret name is lowercase",
        None,
    );
    let m = GITHUB.replace(
        "description = \"the webhook secret\"",
        "description = \"x\"\nrequired = false\nprocessor = true",
    );
    let parsed = Manifest::parse(&m).expect("valid");
    assert!(!parsed.secrets["secret"].required && parsed.secrets["secret"].processor);
}

#[test]
fn manifest_rule_not_toml_names_the_line() {
    let p = problems("name = \"a.b\"\nversion = \n");
    assert!(p[0].starts_with("2: not valid TOML"), "{p:?}");
}

#[test]
fn manifest_setting_types_vocabulary() {
    assert_eq!(
        SettingType::ALL.map(SettingType::as_str),
        ["string", "int", "bool", "list", "path", "table"]
    );
}

/// Issue 29: a setting states what its code needs beyond its type (`format`, `min`/`max`,
/// `pattern`), each only on a type it fits, and its default meets them.
#[test]
fn manifest_rule_setting_constraints() {
    let with = |setting: &str| {
        format!(
            "{GITHUB}\n[processor]\nexec = \"p\"\n[settings.x]\ndescription = \"x\"\n{setting}\n"
        )
    };
    let m = Manifest::parse(&with(
        "type = \"string\"\nrequired = true\nformat = \"https-url\"\npattern = \"[a-z:/.]+\"",
    ))
    .expect("constraints");
    let c = &m.settings["x"].constraints;
    assert_eq!(c.format.map(|f| f.as_str()), Some("https-url"));
    assert_eq!(c.pattern.as_deref(), Some("[a-z:/.]+"));
    let spec = &m.settings["x"];
    assert!(
        spec.check(&toml::Value::from("https://a.example/x"))
            .is_ok()
    );
    let why = spec
        .check(&toml::Value::from("http://a.example/x"))
        .unwrap_err();
    assert!(why.contains("is not an https URL"), "{why}");
    for (setting, needle) in [
        (
            "type = \"int\"\ndefault = 1\nformat = \"url\"",
            "format applies to a string setting only",
        ),
        (
            "type = \"string\"\ndefault = \"\"\nmin = 1",
            "min applies to an int setting only",
        ),
        (
            "type = \"bool\"\ndefault = true\npattern = \"x\"",
            "pattern applies to a string or list setting only",
        ),
        (
            "type = \"string\"\ndefault = \"\"\nformat = \"email\"",
            "\"email\" is not a format; write one of https-url, url",
        ),
        (
            "type = \"int\"\ndefault = 5\nmin = 10\nmax = 1",
            "min 10 is above max 1",
        ),
        (
            "type = \"int\"\ndefault = 5\nmin = \"1\"",
            "must be a whole number",
        ),
        (
            "type = \"string\"\ndefault = \"\"\npattern = \"(\"",
            "is not a regular expression",
        ),
        (
            "type = \"int\"\ndefault = 0\nmin = 1\nmax = 60",
            "the default: 0 is out of range; write a whole number from 1 to 60",
        ),
        (
            "type = \"list\"\ndefault = [\"ok\", \"NO\"]\npattern = \"[a-z]+\"",
            "\"NO\" does not match the pattern",
        ),
    ] {
        refused(&with(setting), needle, None);
    }
    // An empty default of a setting that is not required means unset: no constraint applies.
    let m = Manifest::parse(&with("type = \"string\"\ndefault = \"\"\nformat = \"url\""))
        .expect("empty default");
    assert!(m.settings["x"].check(&toml::Value::from("")).is_ok());
}

/// Spec 14.3.6: a bobbin that supports hooks declares `[settings.hooks]` of type path.
#[test]
fn manifest_rule_hooks_setting_is_a_path() {
    let with = |ty: &str, default: &str| {
        format!(
            "{GITHUB}\n[processor]\nexec = \"p\"\n[settings.hooks]\ndescription = \"x\"\ntype = \"{ty}\"\ndefault = {default}\n"
        )
    };
    assert!(Manifest::parse(&with("path", "\"\"")).is_ok());
    refused(
        &with("string", "\"\""),
        "the hooks setting names the deployment's hooks program; write type = \"path\"",
        None,
    );
}
