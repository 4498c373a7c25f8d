//! The generic Standard Webhooks source (standardwebhooks.com): symmetric `v1` and
//! asymmetric `v1a` signatures.
//!
//! Owns: verification of `webhook-id`, `webhook-timestamp` and `webhook-signature` over
//! `id.timestamp.body` inside a two-sided window (`tolerance_s`, default 300 s): `v1` entries
//! (HMAC-SHA256, base64) against the `secret` secret (a `whsec_` base64 or raw value), `v1a`
//! entries (Ed25519) against the `public_key` secret (the sender's `whpk_` key). Each secret
//! is optional and at least one is needed ([`SecretsNeeded::AnyOne`]); a name that is not
//! configured is simply not checked, so a v1a-only instance answers a bad signature with 401,
//! never "could not decide". Also dedup on `webhook-id` (the spec makes it the idempotency
//! key), the event type from the payload's `type`, and optional `key` and `event_type`
//! selectors (see `select`) for senders whose grouping is known.
//!
//! Must not: use a `whpk_` value as an HMAC key (`verify::standard_webhooks_key` refuses it:
//! a public key is public), or answer anything before verification.

use std::collections::BTreeMap;

use serde_json::Value;

use super::opts::Opts;
use super::select::Expr;
use super::verify::{self, TOLERANCE_S_DEFAULT};
use super::{
    Declared, Request, SecretError, SecretSource, SecretsNeeded, Source, SourceConfigError,
    SourceError, names,
};

pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";
/// The symmetric secret (v1).
pub const SECRET: &str = "secret";
/// The sender's Ed25519 public key (v1a).
pub const PUBLIC_KEY: &str = "public_key";

pub struct StandardWebhooks {
    declared: Declared,
    key: Option<Expr>,
    event_type: Option<Expr>,
    tolerance_s: u64,
}

impl StandardWebhooks {
    pub fn build(name: &str, mut o: Opts<'_>) -> Result<Self, SourceConfigError> {
        let key = o
            .string("key", "\"payload.data.id\"")?
            .map(|k| Expr::parse("key", &k))
            .transpose()?;
        let event_type = o
            .string("event_type", "\"payload.type\"")?
            .map(|k| Expr::parse("event_type", &k))
            .transpose()?;
        let tolerance_s = o.tolerance_s()?.unwrap_or(TOLERANCE_S_DEFAULT);
        o.finish()?;
        Ok(StandardWebhooks {
            declared: Declared {
                secrets: &[SECRET, PUBLIC_KEY],
                secrets_needed: SecretsNeeded::AnyOne,
                auth_headers: names(&[SIGNATURE_HEADER]),
                keep_headers: names(&[ID_HEADER, TIMESTAMP_HEADER]),
                // A generic sender's burst pattern is unknown: the default span `immediate`
                // delivers at once unless config says more.
                // The Standard Webhooks spec asks senders to retry with backoff.
                sender_retries: true,
                ..Declared::builtin(name, "standard-webhooks")
            },
            key,
            event_type,
            tolerance_s,
        })
    }
}

/// Which signature versions `webhook-signature` carries (`v1`, `v1a`), so a secret that
/// cannot be read only matters when an entry of its version is there.
fn versions(signature_header: &str) -> (bool, bool) {
    let mut has = (false, false);
    for entry in signature_header.split(' ') {
        match entry.split_once(',') {
            Some(("v1", _)) => has.0 = true,
            Some(("v1a", _)) => has.1 = true,
            _ => {}
        }
    }
    has
}

/// The scheme as a whole, shared with the template source: `v1` entries against `v1_keys`
/// (`whsec_`/raw values; `whpk_` ones are skipped by the primitive), `v1a` entries against
/// `public_keys` (`whpk_` values; others match nothing).
pub(crate) fn verifies(
    req: &Request,
    v1_keys: &[Vec<u8>],
    public_keys: &[Vec<u8>],
    tolerance_s: u64,
) -> bool {
    let (Some(id), Some(ts), Some(sig)) = (
        req.header(ID_HEADER),
        req.header(TIMESTAMP_HEADER),
        req.header(SIGNATURE_HEADER),
    ) else {
        return false;
    };
    let v1 = verify::standard_webhooks(id, ts, sig, v1_keys, &req.body, req.now, tolerance_s);
    let v1a =
        verify::standard_webhooks_v1a(id, ts, sig, public_keys, &req.body, req.now, tolerance_s);
    v1 | v1a
}

/// One optional secret: its candidates, none when it is not configured, or the error (a
/// configured secret with no value is one, as for every other source).
fn optional(secrets: &dyn SecretSource, name: &str) -> Result<Vec<Vec<u8>>, SecretError> {
    match secrets.candidates(name) {
        Ok(c) if c.iter().all(Vec::is_empty) => Err(SecretError::Empty {
            name: name.to_string(),
        }),
        Ok(c) => Ok(c),
        Err(SecretError::NotConfigured { .. }) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

impl Source for StandardWebhooks {
    fn declared(&self) -> &Declared {
        &self.declared
    }

    fn payload_is_body(&self, req: &Request) -> bool {
        super::body_is_payload(req)
    }

    fn verify(&self, req: &Request, secrets: &dyn SecretSource) -> Result<bool, SourceError> {
        let Some(sig) = req.header(SIGNATURE_HEADER) else {
            return Ok(false);
        };
        let (has_v1, has_v1a) = versions(sig);
        let v1 = optional(secrets, SECRET);
        let v1a = optional(secrets, PUBLIC_KEY);
        let (v1_keys, v1a_keys) = (
            v1.as_deref().unwrap_or_default(),
            v1a.as_deref().unwrap_or_default(),
        );
        if v1.as_ref().is_ok_and(Vec::is_empty) && v1a.as_ref().is_ok_and(Vec::is_empty) {
            // Neither is set: a configuration problem, not a forged request.
            return Err(SecretError::NotConfigured {
                name: format!("{SECRET} (or {PUBLIC_KEY})"),
            }
            .into());
        }
        if verifies(req, v1_keys, v1a_keys, self.tolerance_s) {
            return Ok(true);
        }
        // Not verified by what could be read. When the secret of a version the request
        // carries could not be read, that secret might have verified it: undecided, so the
        // sender retries, rather than a 401 it would not.
        match (v1, v1a) {
            (Err(e), _) if has_v1 => Err(e.into()),
            (_, Err(e)) if has_v1a => Err(e.into()),
            _ => Ok(false),
        }
    }

    fn key(&self, payload: &Value, req: &Request) -> Result<String, SourceError> {
        match &self.key {
            Some(k) => k.eval_required(payload, req),
            // Without a key every event of the source shares one group.
            None => Ok(self.declared.name.clone()),
        }
    }

    fn dedup_id(&self, _payload: &Value, req: &Request) -> Result<Option<String>, SourceError> {
        Ok(req
            .header(ID_HEADER)
            .filter(|s| !s.is_empty())
            .map(str::to_string))
    }

    fn event_type(&self, payload: &Value, req: &Request) -> Result<String, SourceError> {
        match &self.event_type {
            Some(e) => Ok(e.eval(payload, req)?.unwrap_or_default()),
            None => Ok(payload
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()),
        }
    }

    fn attrs(
        &self,
        payload: &Value,
        req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        Ok(BTreeMap::from([(
            "event_type".to_string(),
            self.event_type(payload, req)?,
        )]))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Verdict, build, evaluate};
    use super::*;
    use crate::kit::signer::MapSecrets;

    /// tests/vectors/standard-webhooks-v1a (SOURCE.md there): SW-A's id, timestamp and body
    /// signed v1a with key 1.
    const V1A: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/vectors/standard-webhooks-v1a/vectors.json"
    ));

    fn v1a_request(now: f64) -> (Request, String, String) {
        let v: Value = serde_json::from_str(V1A).expect("vector json");
        let req = Request::new("POST", "/hooks/sw", now)
            .with_header(ID_HEADER, v["msg_id"].as_str().expect("id"))
            .with_header(
                TIMESTAMP_HEADER,
                &v["timestamp"].as_i64().expect("ts").to_string(),
            )
            .with_header(SIGNATURE_HEADER, v["sig1"].as_str().expect("sig"))
            .with_body(v["body"].as_str().expect("body"));
        let key = v["public_key"].as_str().expect("key").to_string();
        let other = v["public_key2"].as_str().expect("key2").to_string();
        (req, key, other)
    }

    fn source(options: &str) -> std::sync::Arc<dyn Source> {
        build("sw", "standard-webhooks", &options.parse().expect("toml")).expect("builds")
    }

    #[test]
    fn a_v1a_only_instance_accepts_its_key_and_refuses_others_with_401() {
        let ts = 1_614_265_330.0;
        let (req, key, other) = v1a_request(ts);
        let s = source("");
        let mine = MapSecrets::new().with(PUBLIC_KEY, key.as_bytes());
        assert!(matches!(
            evaluate(s.as_ref(), &req, &mine),
            Verdict::Accept(_)
        ));
        let theirs = MapSecrets::new().with(PUBLIC_KEY, other.as_bytes());
        assert!(matches!(
            evaluate(s.as_ref(), &req, &theirs),
            Verdict::Unauthorized
        ));
        // Rotation: the old key second still verifies.
        let both = MapSecrets::new()
            .with(PUBLIC_KEY, other.as_bytes())
            .with(PUBLIC_KEY, key.as_bytes());
        assert!(matches!(
            evaluate(s.as_ref(), &req, &both),
            Verdict::Accept(_)
        ));
        // Stale and future-dated by more than the window: refused, also with 401.
        for now in [ts + 301.0, ts - 301.0] {
            let (late, ..) = v1a_request(now);
            assert!(matches!(
                evaluate(s.as_ref(), &late, &mine),
                Verdict::Unauthorized
            ));
        }
        // A v1a key configured as the v1 secret never verifies anything.
        let misplaced = MapSecrets::new().with(SECRET, key.as_bytes());
        assert!(matches!(
            evaluate(s.as_ref(), &req, &misplaced),
            Verdict::Unauthorized
        ));
    }

    #[test]
    fn neither_secret_configured_is_undecided_and_an_unreadable_one_only_for_its_version() {
        let (req, key, _) = v1a_request(1_614_265_330.0);
        let s = source("");
        match evaluate(s.as_ref(), &req, &MapSecrets::new()) {
            Verdict::Undecided(e) => assert_eq!(
                e.to_string(),
                "secret secret (or public_key): not configured"
            ),
            other => panic!("{other:?}"),
        }
        // The v1 secret cannot be read, but the request carries only v1a: decided by v1a.
        struct V1Broken(MapSecrets);
        impl SecretSource for V1Broken {
            fn candidates(&self, name: &str) -> Result<Vec<Vec<u8>>, SecretError> {
                if matches!(name, SECRET) {
                    return Err(SecretError::Unreadable {
                        name: name.into(),
                        reason: "missing file".into(),
                    });
                }
                self.0.candidates(name)
            }
        }
        let broken = V1Broken(MapSecrets::new().with(PUBLIC_KEY, key.as_bytes()));
        assert!(matches!(
            evaluate(s.as_ref(), &req, &broken),
            Verdict::Accept(_)
        ));
        let mut bad = req.clone();
        bad.body.push(b' ');
        assert!(matches!(
            evaluate(s.as_ref(), &bad, &broken),
            Verdict::Unauthorized
        ));
        // With a v1 entry too, the unreadable v1 secret might have verified it: undecided.
        let mut with_v1 = bad.clone();
        with_v1.remove_header(SIGNATURE_HEADER);
        let sig = format!("v1,AAAA {}", req.header(SIGNATURE_HEADER).expect("sig"));
        with_v1 = with_v1.with_header(SIGNATURE_HEADER, &sig);
        assert!(matches!(
            evaluate(s.as_ref(), &with_v1, &broken),
            Verdict::Undecided(_)
        ));
    }

    #[test]
    fn tolerance_s_is_bounded_and_widens_the_window_both_ways() {
        for (bad, want) in [
            (
                "tolerance_s = 5",
                "tolerance_s: must be a whole number from 30 to 3600; write tolerance_s = 300",
            ),
            ("tolerance_s = 86400", "from 30 to 3600"),
            ("tolerance_s = \"300\"", "write tolerance_s = 300"),
            ("tolerance_s = -1", "from 30 to 3600"),
        ] {
            let err = build("sw", "standard-webhooks", &bad.parse().expect("toml"))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(want), "{bad}: {err}");
        }
        let ts = 1_614_265_330.0;
        let (_, key, _) = v1a_request(ts);
        let secrets = MapSecrets::new().with(PUBLIC_KEY, key.as_bytes());
        let wide = source("tolerance_s = 600");
        for (now, accepted) in [
            (ts + 600.0, true),
            (ts - 600.0, true),
            (ts + 601.0, false),
            (ts - 601.0, false),
        ] {
            let (req, ..) = v1a_request(now);
            assert_eq!(
                matches!(evaluate(wide.as_ref(), &req, &secrets), Verdict::Accept(_)),
                accepted,
                "at {now}"
            );
        }
    }
}
