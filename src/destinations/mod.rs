//! Destinations: one delivery attempt to one receiver, reported as an [`Outcome`] (spec 6.4,
//! 6.4.1, 6.5, 14.2).
//!
//! Owns the wire side of delivery: delivery ids by type, Standard Webhooks and
//! X-Hub-Signature-256 signing, the shared HTTP status mapping, the `http` and `hermes`
//! destination types (document mode and unwrap mode), and the `check` validation of their
//! configs. `script` lives beside these and is wired by the dispatcher.
//!
//! Invariants:
//! - A destination never touches the store, never reads the dispatcher's clock for state
//!   (wall time is read only for `webhook-timestamp` and an HTTP-date Retry-After), and never
//!   outlives `Delivery::deadline`.
//! - No body, secret, header value or query string ever reaches a log record, an
//!   `Outcome::reason` or an `Outcome::detail`. Reasons are fixed phrases, codes and ids.
//! - Redirects are never followed; TLS is verified (rustls); `http` requires https unless
//!   `allow_insecure = true`.

pub mod hermes;
pub mod http;
pub mod outcome;
pub mod retry_after;
pub mod script;
pub mod sign;
pub mod subscriptions;
mod wire;

#[cfg(test)]
mod tests;

use std::time::Instant;

use crate::store::DeliveryId;

pub use hermes::{HermesConfig, HermesDestination};
pub use http::{HttpConfig, HttpDestination, SecretSource};
pub use outcome::{Klass, Outcome, OutcomeKind};
pub use wire::{BuildError, TlsRoots, header_name_problem};

/// `User-Agent` on every request (spec 6.4).
pub const USER_AGENT: &str = concat!("hookspool/", env!("CARGO_PKG_VERSION"));

/// One stored event, as unwrap mode sends it (spec 6.4.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnwrapEvent {
    /// `events.id`: fixes the order and the per-event webhook-id.
    pub id: i64,
    pub event_type: String,
    pub dedup_id: Option<String>,
    /// The stored payload, byte for byte; it is the request body.
    pub payload: Vec<u8>,
}

/// Everything one attempt needs; built by the dispatcher per attempt.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub batch_id: i64,
    /// The attempt number (`X-Hookspool-Attempt`), 1 for the first.
    pub attempt_n: i64,
    /// The attempt row id: part of the per-attempt (hermes) delivery id.
    pub attempt_id: i64,
    /// The spool's instance id (the `hs_<instance_id>_...` prefix).
    pub instance_id: String,
    /// The hookspool route the batch belongs to (for the caller's logs; the hermes route is
    /// the destination's own name).
    pub route: String,
    /// The rendered JSON document (document mode).
    pub body: Vec<u8>,
    /// The document's `event_type` (the last event's type). Sent in `event_header` in
    /// document mode when one is configured (spec 6.4, 14.2).
    pub event_type: Option<String>,
    /// The feeding source's `event_header`: the fallback a hermes destination uses when it
    /// sets none (spec 6.4.1). Ignored by `http`.
    pub source_event_header: Option<String>,
    /// The batch's events in `events.id` order; only read in unwrap mode.
    pub events: Vec<UnwrapEvent>,
    /// The worker deadline (lease_until - 5 s): no request outlives it.
    pub deadline: Instant,
    /// The attempt span's W3C traceparent, sent as the `traceparent` header when traces
    /// are on (issue 35).
    pub traceparent: Option<String>,
}

/// How a destination type names its deliveries (spec 6.4). Fixed by the type and its mode;
/// there is no per-destination setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idempotency {
    /// `hs_<instance>_<batch>`: http and script documents.
    PerBatch,
    /// `hs_<instance>_<batch>_<attempt_id>`: hermes documents.
    PerAttempt,
    /// `hs_<instance>_<batch>_<event id>` on the wire: unwrap mode (http or hermes).
    PerEvent,
}

impl Idempotency {
    pub fn as_str(self) -> &'static str {
        match self {
            Idempotency::PerBatch => "per-batch",
            Idempotency::PerAttempt => "per-attempt",
            Idempotency::PerEvent => "per-event",
        }
    }

    /// The id the dispatcher renders into the document's `delivery_id` and records for the
    /// attempt. Pure. In unwrap mode no document goes on the wire and each request carries
    /// its own [`event_delivery_id`]; the batch id names the attempt as a whole.
    pub fn delivery_id(self, d: &Delivery) -> String {
        self.id_for(&d.instance_id, d.batch_id, d.attempt_id)
    }

    /// The same id from its parts, for the dispatcher, which records it with the claim
    /// before the `Delivery` exists.
    pub fn id_for(self, instance_id: &str, batch_id: i64, attempt_id: i64) -> String {
        self.claim_id(instance_id, batch_id).for_attempt(attempt_id)
    }

    /// The ids of a batch's attempts, as the store records them with a claim (whose attempt
    /// id the store draws).
    pub fn claim_id(self, instance_id: &str, batch_id: i64) -> DeliveryId {
        match self {
            Idempotency::PerBatch | Idempotency::PerEvent => {
                DeliveryId::Batch(batch_delivery_id(instance_id, batch_id))
            }
            Idempotency::PerAttempt => {
                DeliveryId::per_attempt(format!("{}_", batch_delivery_id(instance_id, batch_id)))
            }
        }
    }
}

/// `hs_<instance_id>_<batch_id>`.
pub fn batch_delivery_id(instance_id: &str, batch_id: i64) -> String {
    format!("{}{batch_id}", batch_delivery_id_prefix(instance_id))
}

/// `hs_<instance_id>_`: what a batch's delivery id has before the batch's id (the store
/// makes the ids of the claims it chooses itself from it, `FastGate`).
pub fn batch_delivery_id_prefix(instance_id: &str) -> String {
    format!("hs_{instance_id}_")
}

/// `hs_<instance_id>_<batch_id>_<event_id>`.
pub fn event_delivery_id(instance_id: &str, batch_id: i64, event_id: i64) -> String {
    format!("hs_{instance_id}_{batch_id}_{event_id}")
}
