//! Destination tests against real local receivers (hyper on 127.0.0.1:0, a rustls server
//! with a CA made by rcgen); no mocks. Signatures are checked by the independent verifier
//! in `verify`, itself proven first on the Standard Webhooks vector SW-A.

mod egress;
mod hermes_dest;
mod http_dest;
mod receiver;
mod sentinel;
mod tls;
mod unwrap;
mod verify;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::http::StaticSecrets;
use super::{Delivery, HttpConfig, HttpDestination, TlsRoots, UnwrapEvent};

/// The third-party vectors the repository carries (tests/vectors, each folder with its
/// SOURCE.md).
pub fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

pub const INSTANCE: &str = "inst7";

pub fn delivery(body: &str) -> Delivery {
    Delivery {
        batch_id: 42,
        attempt_n: 3,
        attempt_id: 900,
        instance_id: INSTANCE.into(),
        route: "github-ci".into(),
        body: body.as_bytes().to_vec(),
        event_type: Some("workflow_run".into()),
        source_event_header: None,
        events: Vec::new(),
        deadline: Instant::now() + Duration::from_secs(30),
        traceparent: None,
    }
}

pub fn event(id: i64, event_type: &str, dedup: Option<&str>, payload: &str) -> UnwrapEvent {
    UnwrapEvent {
        id,
        event_type: event_type.into(),
        dedup_id: dedup.map(str::to_owned),
        payload: payload.as_bytes().to_vec(),
    }
}

/// A plain-http destination for the tests' receivers, which listen on 127.0.0.1: the egress
/// policy admits exactly that address, as a deployment's `allow_private` would.
pub fn insecure(url: &str) -> HttpConfig {
    HttpConfig {
        allow_insecure: true,
        allow_private: crate::egress::Allow::Blocks(vec!["127.0.0.1/32".parse().expect("cidr")]),
        ..HttpConfig::new(url)
    }
}

pub fn http_dest(cfg: HttpConfig, secrets: &[&str]) -> HttpDestination {
    let s = StaticSecrets(secrets.iter().map(|s| s.as_bytes().to_vec()).collect());
    HttpDestination::new(cfg, Arc::new(s), TlsRoots::Platform).unwrap()
}

#[test]
fn signer_and_verifier_agree_with_sw_a_vector() {
    let path = vectors_dir().join("standard-webhooks/vectors.json");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let v = &doc["vectors"][0];
    assert_eq!(v["id"], "SW-A");
    let (secret, id, ts, payload, expected) = (
        v["secret"].as_str().unwrap(),
        v["msg_id"].as_str().unwrap(),
        v["timestamp"].as_i64().unwrap(),
        v["payload"].as_str().unwrap(),
        v["expected_signature"].as_str().unwrap(),
    );
    // The crate's signer produces the published signature...
    let both =
        super::sign::webhook_signature(&[secret.as_bytes().to_vec()], id, ts, payload.as_bytes());
    assert_eq!(both.as_deref(), Ok(expected));
    // ...and the independent verifier accepts it at the vector's time, and only then.
    let tss = ts.to_string();
    verify::sw_verify_parts(secret, id, &tss, expected, payload.as_bytes(), ts).unwrap();
    assert!(
        verify::sw_verify_parts(secret, id, &tss, expected, payload.as_bytes(), ts + 301).is_err()
    );
    assert!(
        verify::sw_verify_parts(secret, id, &tss, expected, payload.as_bytes(), ts - 301).is_err()
    );
    for neg in doc["negative_vectors"].as_array().unwrap() {
        if let Some(sig) = neg["signature"].as_str() {
            assert!(
                verify::sw_verify_parts(secret, id, &tss, sig, payload.as_bytes(), ts).is_err()
            );
        }
        if let Some(list) = neg["signatures"].as_array() {
            let mut all: Vec<&str> = list.iter().map(|s| s.as_str().unwrap()).collect();
            assert!(
                verify::sw_verify_parts(secret, id, &tss, &all.join(" "), payload.as_bytes(), ts)
                    .is_err()
            );
            all.push(expected);
            verify::sw_verify_parts(secret, id, &tss, &all.join(" "), payload.as_bytes(), ts)
                .unwrap();
        }
    }
    // The padding cases: secrets given without '=' padding still sign.
    for unpadded in [
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwBr",
    ] {
        let sig = super::sign::webhook_signature(
            &[unpadded.as_bytes().to_vec()],
            id,
            ts,
            payload.as_bytes(),
        )
        .unwrap();
        verify::sw_verify_parts(unpadded, id, &tss, &sig, payload.as_bytes(), ts).unwrap();
    }
}

#[test]
fn delivery_ids_by_type() {
    use super::{HermesConfig, HermesDestination, Idempotency};
    let d1 = delivery("{}");
    let d2 = Delivery {
        attempt_id: 901,
        attempt_n: 4,
        ..delivery("{}")
    };
    let http = http_dest(HttpConfig::new("https://example.invalid/h"), &["s"]);
    assert_eq!(http.idempotency(), Idempotency::PerBatch);
    assert_eq!(http.delivery_id(&d1), "hs_inst7_42");
    assert_eq!(http.delivery_id(&d2), "hs_inst7_42");
    let hermes = HermesDestination::new("ci", HermesConfig::default(), TlsRoots::Platform).unwrap();
    assert_eq!(hermes.idempotency(), Idempotency::PerAttempt);
    assert_eq!(hermes.delivery_id(&d1), "hs_inst7_42_900");
    assert_eq!(hermes.delivery_id(&d2), "hs_inst7_42_901");
    let unwrap = HermesDestination::new(
        "ci",
        HermesConfig {
            unwrap: true,
            ..HermesConfig::default()
        },
        TlsRoots::Platform,
    )
    .unwrap();
    assert_eq!(unwrap.idempotency(), Idempotency::PerEvent);
    assert_eq!(unwrap.idempotency().as_str(), "per-event");
    assert_eq!(super::event_delivery_id(INSTANCE, 42, 5), "hs_inst7_42_5");
}

#[test]
fn deliver_futures_are_send() {
    // The dispatcher spawns attempts on a multi-threaded runtime.
    fn is_send<T: Send>(_: &T) {}
    let d = delivery("{}");
    let http = http_dest(HttpConfig::new("https://example.invalid/h"), &["s"]);
    is_send(&http.deliver(&d));
    let hermes =
        super::HermesDestination::new("ci", super::HermesConfig::default(), TlsRoots::Platform)
            .unwrap();
    is_send(&hermes.deliver(&d));
    fn is_sync<T: Send + Sync>(_: &T) {}
    is_sync(&http);
    is_sync(&hermes);
}
