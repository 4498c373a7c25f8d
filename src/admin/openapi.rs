//! The OpenAPI 3.1 document of `/api/v1` (issue 31), served at `/api/v1/openapi.json`.
//! Written here beside the routes it describes, from the same constants (page sizes, the
//! state vocabularies); `tests/it/admin_openapi.rs` checks each schema against the Rust
//! types' serialized form and every read's real answer against its schema, and
//! schemathesis fuzzes the running service with it.
//!
//! Must not: describe a payload or header field as served by default (payloads are served
//! only with `payload=1`), or a field no answer carries.

use serde_json::{Value, json};

use super::act::{ENQUEUE_BODY_MAX, IDEMPOTENCY_KEY_MAX, REPLAY_IDS_MAX};
use super::api::{BACKLOG_HOURS_MAX, PAGE_MAX, PAGE_SCAN_MS, REJECTION_HOURS_MAX};
use crate::intake::metrics::Rejection;
use crate::vocab::{AttemptOutcome, BatchState, BreakerState, Klass};

fn r(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn nullable(t: &str) -> Value {
    json!({"type": [t, "null"]})
}

fn obj(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

fn strings(words: impl Iterator<Item = &'static str>) -> Vec<&'static str> {
    words.collect()
}

/// The answers every operation may give besides its success: an error document.
fn errors() -> Value {
    json!({"description": "a refusal: 400 bad request, 401 no token, 403 a foreign Host or no CSRF header, 404 not found, 405 wrong method, 409 wrong state or conflict, 413 too large, 503 busy", "content": {"application/json": {"schema": r("Error")}}})
}

fn read(summary: &str, params: Value, ok: Value) -> Value {
    json!({"get": {
        "summary": summary,
        "parameters": params,
        "responses": {"200": {"description": "the answer", "content": {"application/json": {"schema": ok}}},
            "default": errors()},
    }})
}

fn action(summary: &str, params: Value, body: Option<Value>) -> Value {
    let mut op = json!({
        "summary": summary,
        "parameters": params,
        "responses": {"200": {"description": "done", "content": {"application/json": {"schema": {"type": "object"}}}},
            "default": errors()},
    });
    let body = body.unwrap_or_else(|| obj(json!({}), &[]));
    op["requestBody"] =
        json!({"required": false, "content": {"application/json": {"schema": body}}});
    json!({"post": op})
}

fn q(name: &str, schema: Value, what: &str) -> Value {
    json!({"name": name, "in": "query", "required": false, "schema": schema, "description": what})
}

fn p(name: &str, schema: Value) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": schema})
}

/// The document.
pub fn document() -> Value {
    let batch_states = strings(BatchState::ALL.iter().map(|s| s.as_str()));
    let classes = strings(Klass::ALL.iter().map(|s| s.as_str()));
    let outcomes = strings(AttemptOutcome::ALL.iter().map(|s| s.as_str()));
    let breakers = strings(BreakerState::ALL.iter().map(|s| s.as_str()));
    let reasons = strings(Rejection::ALL.iter().map(|r| r.label()));
    let id = json!({"type": "integer", "format": "int64"});
    let batch_id = p("id", id.clone());
    let klass = json!({"type": ["string", "null"], "enum": classes.iter().map(|c| json!(c)).chain([Value::Null]).collect::<Vec<_>>()});
    let schemas = json!({
        "Error": obj(json!({"error": {"type": "string"}, "message": {"type": "string"}}), &["error", "message"]),
        "Status": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
            "description": "the /healthz document"},
        "Batch": obj(json!({
            "id": id, "route": {"type": "string"}, "source": {"type": "string"},
            "destination": {"type": "string"}, "key": {"type": "string"},
            "state": {"type": "string", "enum": batch_states},
            "first_at": {"type": "number"}, "last_at": {"type": "number"},
            "quiet_s": {"type": "number"}, "max_s": {"type": "number"},
            "max_events": {"type": "integer"}, "max_bytes": {"type": "integer"},
            "not_before": nullable("number"), "count": {"type": "integer"},
            "bytes": {"type": "integer"}, "sealed_at": nullable("number"),
            "content_hash": nullable("string"), "attempts": {"type": "integer"},
            "next_attempt_at": nullable("number"), "lease_until": nullable("number"),
            "lease_owner": nullable("string"), "last_error": nullable("string"),
            "last_class": klass, "delivered_at": nullable("number"),
            "result": nullable("string"), "dropped_at": nullable("number"),
        }), &["id", "route", "source", "destination", "key", "state", "first_at", "last_at",
            "quiet_s", "max_s", "max_events", "max_bytes", "not_before", "count", "bytes",
            "sealed_at", "content_hash", "attempts", "next_attempt_at", "lease_until",
            "lease_owner", "last_error", "last_class", "delivered_at", "result", "dropped_at"]),
        "Event": obj(json!({
            "id": id, "batch_id": id, "source": {"type": "string"}, "route": {"type": "string"},
            "event_type": {"type": "string"}, "dedup_id": nullable("string"),
            "received_at": {"type": "number"}, "size": {"type": "integer"},
            "excluded_at": nullable("number"),
            "payload": {"type": "string", "description": "only with payload=1"},
        }), &["id", "batch_id", "source", "route", "event_type", "dedup_id", "received_at", "size", "excluded_at"]),
        "Attempt": obj(json!({
            "id": id, "batch_id": id, "n": {"type": "integer"}, "destination": {"type": "string"},
            "started_at": {"type": "number"}, "finished_at": nullable("number"),
            "outcome": {"type": ["string", "null"], "enum": outcomes.iter().map(|c| json!(c)).chain([Value::Null]).collect::<Vec<_>>()},
            "klass": klass, "status": nullable("integer"), "error": nullable("string"),
            "duration_ms": nullable("integer"), "probe": {"type": "boolean"},
            "counted": {"type": "boolean"}, "delivery_id": nullable("string"),
            "events_delivered": nullable("integer"), "failed_event_id": nullable("integer"),
        }), &["id", "batch_id", "n", "destination", "started_at", "finished_at", "outcome", "klass",
            "status", "error", "duration_ms", "probe", "counted", "delivery_id", "events_delivered",
            "failed_event_id"]),
        "Issue": obj(json!({
            "id": id, "fingerprint": {"type": "string"}, "kind": {"type": "string"},
            "destination": nullable("string"), "route": nullable("string"),
            "state": {"type": "string", "enum": ["open", "acked", "resolved", "ignored"]},
            "first_at": {"type": "number"}, "last_at": {"type": "number"},
            "count": {"type": "integer"}, "sample_batch_id": nullable("integer"),
            "last_error": nullable("string"), "alerted_at": nullable("number"),
        }), &["id", "fingerprint", "kind", "destination", "route", "state", "first_at", "last_at",
            "count", "sample_batch_id", "last_error", "alerted_at"]),
        "Poll": obj(json!({
            "instance": {"type": "string"}, "next_at": {"type": "number"},
            "last_tick_at": nullable("number"), "last_batch_id": nullable("integer"),
            "delivered_at": nullable("number"), "delivered_tick_at": nullable("number"),
            "skipped": {"type": "integer"}, "created_at": {"type": "number"},
            "pending": {"type": "boolean"},
        }), &["instance", "next_at", "last_tick_at", "last_batch_id", "delivered_at",
            "delivered_tick_at", "skipped", "created_at", "pending"]),
        "BatchPage": obj(json!({"batches": {"type": "array", "items": r("Batch")},
            "next_before": {"type": ["integer", "null"], "description": "the next page's `before`: below the last batch when more match, or `scanned_to` when the page stopped on its scan budget; null at the end. Pages read this way neither skip nor repeat a batch"},
            "scanned_to": {"type": ["integer", "null"], "description": format!("set when the page stopped on its scan budget ({PAGE_SCAN_MS} ms) before it was full: every batch from this id up to the page's start was examined and the matches are in `batches` (possibly none), the batches below it were not; continue with before={{scanned_to}}. Filters an index answers (dedup_id, a narrow since/until window, state=dead or dropped) fill their pages; a JSON path, a search or a key prefix may stop")}}),
            &["batches", "next_before", "scanned_to"]),
        "BatchDetail": obj(json!({"batch": r("Batch"),
            "events": {"type": "array", "items": r("Event")},
            "attempts": {"type": "array", "items": r("Attempt")},
            "journalctl": {"type": "string"}, "replay": {"type": "string"}}),
            &["batch", "events", "attempts", "journalctl", "replay"]),
        "Issues": obj(json!({"issues": {"type": "array", "items": r("Issue")}}), &["issues"]),
        "EventsByDedup": obj(json!({"dedup_id": {"type": "string"}, "events": {"type": "array", "items": obj(json!({
            "event": r("Event"),
            "batch": obj(json!({"id": id, "state": {"type": "string", "enum": batch_states},
                "destination": {"type": "string"}, "route": {"type": "string"}}),
                &["id", "state", "destination", "route"]),
            "duplicates": {"type": "integer"}}), &["event", "batch", "duplicates"])}}),
            &["dedup_id", "events"]),
        "Destinations": obj(json!({"destinations": {"type": "array", "items": obj(json!({
            "name": {"type": "string"}, "configured": {"type": "boolean"},
            "breaker": {"type": "object", "properties": {"state": {"type": "string", "enum": breakers}}, "required": ["state"]},
            "pending": {"type": "integer"}, "oldest_pending_at": nullable("number"),
            "dead": {"type": "integer"},
            "latency_ms": obj(json!({"window_s": {"type": "number"}, "count": {"type": "integer"},
                "p50": nullable("integer"), "p90": nullable("integer"), "p99": nullable("integer")}),
                &["window_s", "count", "p50", "p90", "p99"]),
            "last_error": {"oneOf": [{"type": "null"}, obj(json!({"at": {"type": "number"},
                "batch_id": id, "klass": nullable("string"), "status": nullable("integer"),
                "error": nullable("string")}), &["at", "batch_id", "klass", "status", "error"])]},
        }), &["name", "configured", "breaker", "pending", "oldest_pending_at", "dead", "latency_ms", "last_error"])}}),
            &["destinations"]),
        "Sources": obj(json!({"sources": {"type": "array", "items": obj(json!({
            "name": {"type": "string"}, "configured": {"type": "boolean"},
            "kind": nullable("string"), "bobbin": nullable("string"),
            "last_event_at": nullable("number"), "window_s": {"type": "number"},
            "events": {"type": "integer"}, "duplicates": {"type": "integer"},
            "quarantined": {"type": "integer"},
            "rejected": {"type": "integer", "description": "requests answered without being stored over window_s, as the intake stored its counts (at most a few seconds late)"},
            "rejected_by_reason": {"type": "object", "additionalProperties": {"type": "integer"},
                "description": format!("the same by reason: {}", reasons.join(", "))}}),
            &["name", "configured", "kind", "bobbin", "last_event_at", "window_s", "events", "duplicates", "quarantined", "rejected", "rejected_by_reason"])},
            "bobbins": {"type": "array", "items": obj(json!({"instance": {"type": "string"},
                "bobbin": {"type": "string"}, "processor": {"type": "boolean"}, "poll": {"type": "boolean"}}),
                &["instance", "bobbin", "processor", "poll"])}}),
            &["sources", "bobbins"]),
        "Polls": obj(json!({"polls": {"type": "array", "items": r("Poll")}}), &["polls"]),
        "Rejections": obj(json!({"hours": {"type": "integer"},
            "from": {"type": "number", "description": "the start of the first hour counted (Unix seconds)"},
            "to": {"type": "number"},
            "total": {"type": "integer"},
            "by_reason": {"type": "object", "additionalProperties": {"type": "integer"},
                "description": format!("requests answered without being stored, by reason: {}", reasons.join(", "))},
            "by_source": {"type": "array", "items": obj(json!({"source": {"type": "string"},
                "reason": {"type": "string", "enum": reasons}, "count": {"type": "integer"}}),
                &["source", "reason", "count"])}}),
            &["hours", "from", "to", "total", "by_reason", "by_source"]),
        "Backlog": obj(json!({"from": {"type": "number"}, "to": {"type": "number"},
            "points": {"type": "integer"},
            "destinations": {"type": "object", "additionalProperties": {"type": "array", "items": obj(json!({
                "at": {"type": "number"}, "pending": {"type": "integer"},
                "oldest_age_s": nullable("number")}), &["at", "pending", "oldest_age_s"])}}}),
            &["from", "to", "points", "destinations"]),
        "FeedItem": {"oneOf": [
            obj(json!({"type": {"const": "event_queued"}, "event": id, "batch": id,
                "source": {"type": "string"}, "route": {"type": "string"},
                "event_type": {"type": "string"}, "at": {"type": "number"}}),
                &["type", "event", "batch", "source", "route", "event_type", "at"]),
            obj(json!({"type": {"const": "batch_sealed"}, "batch": id,
                "destination": {"type": "string"}, "count": {"type": "integer"}, "at": {"type": "number"}}),
                &["type", "batch", "destination", "count", "at"]),
            obj(json!({"type": {"const": "attempt_finished"}, "attempt": id, "batch": id,
                "destination": {"type": "string"}, "outcome": nullable("string"),
                "klass": nullable("string"), "status": nullable("integer"),
                "duration_ms": nullable("integer"), "at": {"type": "number"}}),
                &["type", "attempt", "batch", "destination", "outcome", "klass", "status", "duration_ms", "at"]),
            obj(json!({"type": {"const": "issue_opened"}, "issue": id,
                "fingerprint": {"type": "string"}, "kind": {"type": "string"}, "at": {"type": "number"}}),
                &["type", "issue", "fingerprint", "kind", "at"]),
        ]},
        "ReplayBody": {"oneOf": [
            obj(json!({"batches": {"type": "array", "items": id, "minItems": 1, "maxItems": REPLAY_IDS_MAX},
                "dry_run": {"type": "boolean"}}), &["batches"]),
            obj(json!({"state": {"type": "string", "enum": ["dead"]}, "destination": {"type": "string"},
                "source": {"type": "string"}, "since": {"type": "number"}, "until": {"type": "number"},
                "dry_run": {"type": "boolean"}}), &["state"]),
        ]},
        "EnqueueBody": obj(json!({
            "source": {"type": "string"}, "key": {"type": "string", "maxLength": 512},
            "destination": {"type": "string"}, "event_type": {"type": "string"},
            "dedup_id": {"type": "string"}, "payload": {"type": "object"}}),
            &["source", "key", "payload"]),
    });
    let text = |what: &str| q(what, json!({"type": "string"}), what);
    let batches_params = json!([
        q(
            "state",
            json!({"type": "string", "enum": batch_states}),
            "the batch state"
        ),
        text("source"),
        text("route"),
        text("destination"),
        q(
            "key_prefix",
            json!({"type": "string"}),
            "keys starting with this"
        ),
        q(
            "event_type",
            json!({"type": "string"}),
            "holding an event of this type"
        ),
        q(
            "dedup_id",
            json!({"type": "string"}),
            "holding the event a source recorded under this dedup (provider) id, within its dedup window"
        ),
        q(
            "json_path",
            json!({"type": "string", "pattern": r"^\$(\.[A-Za-z0-9_-]+|\[[0-9]{1,9}\]){0,16}$"}),
            "with json_value: an event's payload has this value at this path"
        ),
        q(
            "json_value",
            json!({"type": "string"}),
            "the value at json_path, as text (42, paid, true, null)"
        ),
        q(
            "search",
            json!({"type": "string"}),
            "key contains, or an event's dedup id or type is"
        ),
        q(
            "since",
            json!({"type": "number"}),
            "first event at or after (Unix seconds)"
        ),
        q(
            "until",
            json!({"type": "number"}),
            "first event before (Unix seconds)"
        ),
        q(
            "before",
            json!({"type": "integer", "format": "int64"}),
            "the previous page's next_before"
        ),
        q(
            "limit",
            json!({"type": "integer", "minimum": 1, "maximum": PAGE_MAX}),
            "page size"
        ),
    ]);
    let mut paths = serde_json::Map::new();
    let mut put = |path: &str, v: Value| {
        paths.insert(path.to_string(), v);
    };
    put(
        "/api/v1/status",
        read("the /healthz document", json!([]), r("Status")),
    );
    put(
        "/api/v1/batches",
        read(
            "batches, newest first, filtered, by keyset pages",
            batches_params,
            r("BatchPage"),
        ),
    );
    put(
        "/api/v1/batches/{id}",
        read(
            "one batch: its events' metadata, attempts, the commands to copy",
            json!([
                batch_id,
                q(
                    "payload",
                    json!({"type": "string", "enum": ["1"]}),
                    "1: include the payloads"
                )
            ]),
            r("BatchDetail"),
        ),
    );
    put(
        "/api/v1/events",
        read(
            "events by dedup (provider) id",
            json!([
                json!({"name": "dedup_id", "in": "query", "required": true, "schema": {"type": "string", "minLength": 1}}),
                text("source")
            ]),
            r("EventsByDedup"),
        ),
    );
    put(
        "/api/v1/issues",
        read(
            "open and acked issues (all=1: every state)",
            json!([q("all", json!({"type": "string"}), "1: every state")]),
            r("Issues"),
        ),
    );
    put(
        "/api/v1/destinations",
        read(
            "destinations: breaker, backlog, latency, last error",
            json!([]),
            r("Destinations"),
        ),
    );
    put(
        "/api/v1/sources",
        read("sources and bobbin instances", json!([]), r("Sources")),
    );
    put(
        "/api/v1/polls",
        read("poll instances", json!([]), r("Polls")),
    );
    put(
        "/api/v1/backlog",
        read(
            "pending and oldest age per destination over the last hours",
            json!([q(
                "hours",
                json!({"type": "integer", "minimum": 1, "maximum": BACKLOG_HOURS_MAX}),
                "how far back"
            )]),
            r("Backlog"),
        ),
    );
    put(
        "/api/v1/rejections",
        read(
            "the intake's rejections by reason and by source over the last hours (never a body, header value or query string)",
            json!([q(
                "hours",
                json!({"type": "integer", "minimum": 1, "maximum": REJECTION_HOURS_MAX}),
                "how far back, in whole hours"
            )]),
            r("Rejections"),
        ),
    );
    put(
        "/api/v1/openapi.json",
        read("this document", json!([]), json!({"type": "object"})),
    );
    put(
        "/api/v1/events/stream",
        json!({"get": {
        "summary": "server-sent events: each data line is a FeedItem; Last-Event-ID resumes",
        "responses": {"200": {"description": "the stream", "content": {"text/event-stream": {"schema": {"type": "string"}, "itemSchema": r("FeedItem")}}},
            "default": errors()}}}),
    );
    for verb in ["replay", "retry", "drop"] {
        put(
            &format!("/api/v1/batches/{{id}}/{verb}"),
            action(
                &format!("{verb} one batch"),
                json!([p("id", id.clone())]),
                None,
            ),
        );
    }
    put(
        "/api/v1/batches/{id}/split",
        action(
            "split a batch",
            json!([p("id", id.clone())]),
            Some(json!({"oneOf": [
                obj(json!({"max_events": {"type": "integer", "minimum": 1}}), &["max_events"]),
                obj(json!({"max_bytes": {"type": "integer", "minimum": 1}}), &["max_bytes"]),
                obj(json!({"at": id}), &["at"]),
            ]})),
        ),
    );
    put(
        "/api/v1/batches/{id}/exclude",
        action(
            "exclude events from a batch",
            json!([p("id", id.clone())]),
            Some(obj(
                json!({"events": {"type": "array", "items": id, "minItems": 1}}),
                &["events"],
            )),
        ),
    );
    put(
        "/api/v1/replay",
        action(
            "replay batches by id, or dead batches by filter (dry_run counts first)",
            json!([]),
            Some(r("ReplayBody")),
        ),
    );
    put("/api/v1/enqueue", {
        let mut a = action(
            "enqueue an event (as hookspool enqueue); Idempotency-Key answers a repeat with the original and a reuse for other content with 409",
            json!([{"name": "Idempotency-Key", "in": "header", "required": false, "schema": {"type": "string", "minLength": 1, "maxLength": IDEMPOTENCY_KEY_MAX}}]),
            Some(r("EnqueueBody")),
        );
        a["post"]["requestBody"]["required"] = json!(true);
        a["post"]["description"] = json!(format!("The body is at most {ENQUEUE_BODY_MAX} bytes."));
        a
    });
    let name = p("name", json!({"type": "string"}));
    put(
        "/api/v1/destinations/{name}/pause",
        action(
            "pause a destination",
            json!([name]),
            Some(obj(json!({"reason": {"type": "string"}}), &[])),
        ),
    );
    put(
        "/api/v1/destinations/{name}/resume",
        action("resume a destination", json!([name]), None),
    );
    for (verb, what) in [
        ("ack", "acknowledge"),
        ("resolve", "resolve"),
        ("ignore", "ignore"),
    ] {
        put(
            &format!("/api/v1/issues/{{issue}}/{verb}"),
            action(
                &format!("{what} an issue (by id or fingerprint)"),
                json!([p("issue", json!({"type": "string"}))]),
                None,
            ),
        );
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "hookspool admin API", "version": env!("CARGO_PKG_VERSION"),
            "description": "The management API of hookspool (issue 31). Every request needs a loopback Host; on TCP the token as Authorization: Bearer; every POST the header X-Hookspool-CSRF: 1."},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"},
                "csrf": {"type": "apiKey", "in": "header", "name": "X-Hookspool-CSRF"}},
        },
        "security": [{"token": []}],
    })
}
