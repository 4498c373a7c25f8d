//! Issue 31: the OpenAPI 3.1 document of `/api/v1`. Its schemas are checked against the
//! Rust types (each row type's serialized form has exactly the schema's properties and
//! validates against it), the running service serves the document and every read's real
//! answer validates against its schema, and schemathesis (PyPI) fuzzes the running service
//! over a seeded spool: no 5xx, every response conforms to its schema, status code and
//! content type.

use std::collections::BTreeSet;
use std::process::Command;

use hookspool::admin::openapi;
use hookspool::store::{FeedItem, NewIssue};
use serde_json::{Value, json};

use super::admin::{AdminProc, TOKEN, home_with_token};
use super::admin_reads::seed;
use super::open;
use super::skip::skip_or_fail;

/// Resolve a `$ref` inside the document.
fn deref<'a>(doc: &'a Value, s: &'a Value) -> &'a Value {
    match s.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.trim_start_matches("#/components/schemas/");
            &doc["components"]["schemas"][name]
        }
        None => s,
    }
}

/// The JSON Schema subset the document uses: $ref, oneOf, const, type (one or a list),
/// enum, properties, required, additionalProperties, items. An error names the path.
fn validate(doc: &Value, schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    let s = deref(doc, schema);
    if let Some(alts) = s.get("oneOf").and_then(Value::as_array) {
        let ok = alts
            .iter()
            .filter(|a| validate(doc, a, v, at).is_ok())
            .count();
        return if ok == 1 {
            Ok(())
        } else {
            Err(format!("{at}: {ok} of oneOf match {v}"))
        };
    }
    if let Some(c) = s.get("const")
        && c != v
    {
        return Err(format!("{at}: {v} is not {c}"));
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(t) => vec![t.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let fits = types.iter().any(|t| match *t {
            "null" => v.is_null(),
            "boolean" => v.is_boolean(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "array" => v.is_array(),
            "object" => v.is_object(),
            _ => false,
        });
        if !fits {
            return Err(format!("{at}: {v} is not {t}"));
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array)
        && !e.contains(v)
    {
        return Err(format!("{at}: {v} is not one of {e:?}"));
    }
    if let Some(o) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let r = r.as_str().unwrap_or("");
            if !o.contains_key(r) {
                return Err(format!("{at}: required {r} missing in {v}"));
            }
        }
        for (k, val) in o {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => validate(doc, ps, val, &format!("{at}.{k}"))?,
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        return Err(format!("{at}: {k} is not in the schema"));
                    }
                    Some(extra @ Value::Object(_)) => {
                        validate(doc, extra, val, &format!("{at}.{k}"))?
                    }
                    _ => {}
                },
            }
        }
    }
    if let (Some(items), Some(a)) = (s.get("items"), v.as_array()) {
        for (i, x) in a.iter().enumerate() {
            validate(doc, items, x, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn the_document_matches_the_rust_types() {
    let doc = openapi::document();
    assert_eq!(doc["openapi"], "3.1.0");
    let home = tempfile::tempdir().unwrap();
    let db = home.path().join("spool.db");
    let s = seed(&db);
    let mut st = open(&db);
    st.issue_open_or_bump(
        &NewIssue {
            fingerprint: "delivery:http:r0:permanent".into(),
            kind: "delivery".into(),
            destination: Some("http:r0".into()),
            route: None,
            sample_batch_id: Some(s.b),
            last_error: Some("http 500".into()),
        },
        s.t0,
    )
    .unwrap();
    let schema = |name: &str| doc["components"]["schemas"][name].clone();
    let check = |name: &str, v: Value, exact: bool| {
        validate(&doc, &schema(name), &v, name).unwrap_or_else(|e| panic!("{e}"));
        if exact {
            let props = keys(&schema(name)["properties"]);
            assert_eq!(
                keys(&v),
                props,
                "{name}: the Rust type's fields and the schema's"
            );
        }
    };
    let batches = st
        .list_batches(&hookspool::store::BatchFilter {
            limit: 10,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(batches.len(), 3);
    for b in &batches {
        check("Batch", serde_json::to_value(b).unwrap(), true);
    }
    let with_payload = st.events(s.a, true).unwrap();
    check(
        "Event",
        serde_json::to_value(&with_payload[0]).unwrap(),
        true,
    );
    let without = serde_json::to_value(&st.events(s.a, false).unwrap()[0]).unwrap();
    assert!(without.get("payload").is_none());
    check("Event", without, false);
    for a in st.attempts(s.b).unwrap() {
        check("Attempt", serde_json::to_value(&a).unwrap(), true);
    }
    for i in st.issues(&["open"], 10).unwrap() {
        check("Issue", serde_json::to_value(&i).unwrap(), true);
    }
    for p in st.polls().unwrap() {
        check("Poll", serde_json::to_value(&p).unwrap(), true);
    }
    let (items, _) = st
        .feed_since(&hookspool::store::FeedCursor::default())
        .unwrap();
    let kinds: BTreeSet<String> = items
        .iter()
        .map(|i| {
            let v = serde_json::to_value(i).unwrap();
            check("FeedItem", v.clone(), false);
            v["type"].as_str().unwrap().to_string()
        })
        .collect();
    assert!(
        kinds.contains("event_queued") && kinds.contains("issue_opened"),
        "{kinds:?}"
    );
    // The variants without a seeded row are checked from values.
    for item in [
        FeedItem::BatchSealed {
            batch: 1,
            destination: "http:x".into(),
            count: 2,
            at: 1.5,
        },
        FeedItem::AttemptFinished {
            attempt: 1,
            batch: 1,
            destination: "http:x".into(),
            outcome: Some("ok".into()),
            klass: None,
            status: Some(200),
            duration_ms: Some(3),
            at: 2.0,
        },
    ] {
        check("FeedItem", serde_json::to_value(&item).unwrap(), false);
    }
    // A field the schema does not know fails, as does one it requires and the value lacks.
    let mut extra = serde_json::to_value(&batches[0]).unwrap();
    extra["secret"] = json!("x");
    assert!(validate(&doc, &schema("Batch"), &extra, "Batch").is_err());
    let mut short = serde_json::to_value(&batches[0]).unwrap();
    short.as_object_mut().unwrap().remove("state");
    assert!(validate(&doc, &schema("Batch"), &short, "Batch").is_err());
    // Every $ref names a schema that exists.
    let text = doc.to_string();
    for r in text.split("\"#/components/schemas/").skip(1) {
        let name = r.split('"').next().unwrap();
        assert!(doc["components"]["schemas"].get(name).is_some(), "{name}");
    }
}

/// The read operations of the document: their paths (with the seeded ids filled in) and
/// their 200 schema.
fn reads(doc: &Value, a: i64) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let Some(get) = item.get("get") else { continue };
        if path.ends_with("/stream") {
            continue;
        }
        let schema = get["responses"]["200"]["content"]["application/json"]["schema"].clone();
        let concrete = match path.as_str() {
            "/api/v1/batches/{id}" => format!("/api/v1/batches/{a}?payload=1"),
            "/api/v1/events" => "/api/v1/events?dedup_id=evt_A".to_string(),
            "/api/v1/issues" => "/api/v1/issues?all=1".to_string(),
            "/api/v1/batches" => "/api/v1/batches?limit=2".to_string(),
            p => p.to_string(),
        };
        out.push((concrete, schema));
    }
    out
}

#[test]
fn every_read_of_the_running_service_answers_as_its_schema_says() {
    let (home, token) = home_with_token();
    let s = seed(&home.path().join("spool.db"));
    let api = AdminProc::start(home.path(), &token);
    let (st, served) = api.get("/api/v1/openapi.json");
    assert_eq!(st, 200);
    assert_eq!(
        served,
        openapi::document(),
        "the served document is the code's"
    );
    let doc = served;
    let ops = reads(&doc, s.a);
    assert!(ops.len() >= 10, "{ops:?}");
    for (path, schema) in ops {
        let (st, v) = api.get(&path);
        assert_eq!(st, 200, "{path}: {v}");
        validate(&doc, &schema, &v, &path).unwrap_or_else(|e| panic!("{e}"));
    }
    // A refusal is the Error schema.
    let (st, v) = api.get("/api/v1/batches?limit=0");
    assert_eq!(st, 400);
    validate(
        &doc,
        &json!({"$ref": "#/components/schemas/Error"}),
        &v,
        "error",
    )
    .unwrap();
}

/// Schemathesis against the running service over the seeded spool: the operations'
/// answers never 5xx and conform to the document (schema, status code, content type).
/// The live stream is left out (it never ends).
#[test]
fn schemathesis_finds_no_server_error_and_no_answer_off_schema() {
    let st = std::env::var("HOOKSPOOL_SCHEMATHESIS").unwrap_or_else(|_| "schemathesis".into());
    if Command::new(&st).arg("--version").output().is_err() {
        skip_or_fail(
            "schemathesis is not installed (pip install schemathesis; or set HOOKSPOOL_SCHEMATHESIS)",
        );
        return;
    }
    let (home, token) = home_with_token();
    seed(&home.path().join("spool.db"));
    let api = AdminProc::start(home.path(), &token);
    let url = format!("http://127.0.0.1:{}/api/v1/openapi.json", api.addr.port());
    let out = Command::new(&st)
        .args(["run", &url])
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .args(["-H", "X-Hookspool-CSRF: 1"])
        .args(["--exclude-path", "/api/v1/events/stream"])
        .args([
            "-c",
            "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance",
        ])
        .args(["--max-examples", "25", "--seed", "31"])
        .env("NO_COLOR", "1")
        .current_dir(home.path())
        .output()
        .expect("run schemathesis");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let summary: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("generated") || l.contains("passed") || l.contains("failed"))
        .collect();
    println!("schemathesis: {}", summary.join(" | "));
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("generated"), "{text}");
    let log = api.log();
    assert!(!log.contains(TOKEN), "the token is never logged");
}
