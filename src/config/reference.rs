//! The configuration reference (issue 29): every key the validator accepts, with its type,
//! its default, what it does and which reload applies it, rendered as `docs/configuration.md`
//! (`hookspool generate reference`) and as the hookspool.toml(5) man page (`hookspool
//! generate man`, beside the CLI's pages).
//!
//! It cannot drift from the validator: every default is read from a config validated from
//! an empty file (so it is the validator's own value, not a copy), the destination, template
//! and bobbin-instance keys are checked against the tables that accept them
//! (`destination::HTTP_KEYS` ..., `bobbins::template_keys::TEMPLATE_KEYS`,
//! `bobbins::expand::INSTANCE_KEYS`) by this module's tests, and the tidy test fails when a
//! field of the `raw` types has no row here or when the committed docs/configuration.md is
//! not what the generator prints.
//!
//! Must not: read the host (the defaults come from an empty config with no environment) or
//! describe a key the validator would refuse.

use super::{Config, PathInputs};

/// Which reload applies a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// The next reload of each half that reads it: a save of the file (both halves watch
    /// it) or SIGHUP (`systemctl reload`).
    Reload,
    /// Read when the process starts; a reload that changes it keeps the old value (the
    /// intake names its own such keys in a warning).
    Restart,
}

impl Reload {
    pub fn as_str(self) -> &'static str {
        match self {
            Reload::Reload => "reload",
            Reload::Restart => "restart",
        }
    }
}

/// A key's default.
#[derive(Clone, Copy)]
pub enum Default {
    /// Read from the config an empty file validates to.
    Of(fn(&Config) -> String),
    /// Not a value: "none", "required", "the source's", ...
    Text(&'static str),
}

/// One key of the file.
pub struct Key {
    /// The key's path: `dispatch.breaker.trip_after`, `sources.<name>.span`,
    /// `routes[].match` (`routes` is an array of tables).
    pub key: &'static str,
    pub ty: &'static str,
    pub default: Default,
    pub reload: Reload,
    pub doc: &'static str,
}

/// One table of the file and its keys.
pub struct Section {
    /// As written in the file: `[spool]`, `[[routes]]`.
    pub heading: &'static str,
    pub about: &'static str,
    pub keys: &'static [Key],
}

const R: Reload = Reload::Reload;
const RESTART: Reload = Reload::Restart;

fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn strings(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", items.join(", "))
}

macro_rules! key {
    ($key:literal, $ty:literal, text $default:literal, $reload:expr, $doc:literal) => {
        Key {
            key: $key,
            ty: $ty,
            default: Default::Text($default),
            reload: $reload,
            doc: $doc,
        }
    };
    ($key:literal, $ty:literal, |$c:ident| $default:expr, $reload:expr, $doc:literal) => {
        Key {
            key: $key,
            ty: $ty,
            default: Default::Of(|$c: &Config| $default),
            reload: $reload,
            doc: $doc,
        }
    };
}

/// Every table of the file, in the order the reference lists them.
pub const SECTIONS: &[Section] = &[
    Section {
        heading: "[spool]",
        about: "Where the spool lives. Paths: the --home/--config flags, then HOOKSPOOL_HOME, HOOKSPOOL_CONFIG and HOOKSPOOL_DB, then this file, then the default.",
        keys: &[
            key!(
                "spool.home",
                "path",
                |c| c.home.display().to_string(),
                RESTART,
                "The spool home: spool.db, the lock, the wake-up socket and the processors' state live here. HOOKSPOOL_HOME and --home override it; `~/` is the user's home."
            ),
            key!("spool.db", "path", text "spool.db", RESTART,
                "The SQLite spool, relative to the home unless absolute. HOOKSPOOL_DB overrides it."),
            key!(
                "spool.backend",
                "\"sqlite\" | \"postgres\"",
                |c| format!("{:?}", c.backend.as_str()),
                RESTART,
                "Where the spool lives: the SQLite file at spool.db, or a PostgreSQL database at spool.url. Every service and command runs on either with the same behaviour; `hookspool spool copy` moves a spool between the two (README: Moving to PostgreSQL)."
            ),
            key!("spool.url", "secret reference", text "(none)", RESTART,
                "The PostgreSQL connection as a libpq URL (postgresql://user:password@host:port/db?sslmode=verify-full), read from a secret reference such as { file = \"/etc/hookspool/secrets/pg-url\" }, never written inline (it may carry a password). sslmode=require or verify-full uses TLS (rustls); verify-full checks the certificate against sslrootcert, else the system's roots. Only with backend = \"postgres\"."),
            key!(
                "spool.store_raw",
                "bool",
                |c| c.store_raw.to_string(),
                R,
                "Keep each request's original body beside its payload, for replay and `source test`; a source's own store_raw overrides it."
            ),
            key!("spool.bobbin_path", "array of paths", text "[]", R,
                "Directories of private bobbins, searched after the built-in ones; re-read at every load. Each root and each bobbin in it must be owned by root or the service user and not group/other-writable."),
        ],
    },
    Section {
        heading: "[intake]",
        about: "The HTTP intake that answers senders.",
        keys: &[
            key!(
                "intake.listen",
                "string or array of strings",
                |c| strings(&c.intake.listen),
                RESTART,
                "Addresses to listen on: `127.0.0.1:PORT`, `[::1]:PORT`, `localhost:PORT` or `unix:/absolute/path`. Under systemd the sockets come from hookspool-intake.socket and this is not used."
            ),
            key!(
                "intake.max_body_bytes",
                "integer (bytes)",
                |c| c.intake.max_body_bytes.to_string(),
                R,
                "The largest request body accepted (413 above it); a source's max_body_bytes defaults to the smaller of this and its batch max_bytes."
            ),
            key!(
                "intake.busy_timeout_s",
                "number (seconds)",
                |c| num(c.intake.busy_timeout_s),
                RESTART,
                "How long the intake's store connection waits for the write lock before answering 503."
            ),
            key!("intake.threads", "integer", text "one per CPU", RESTART,
                "Worker threads of the intake's runtime."),
            key!(
                "intake.allow_remote",
                "bool",
                |c| c.intake.allow_remote.to_string(),
                RESTART,
                "Allow a listen address that is not loopback. hookspool belongs behind a reverse proxy; set this only if you mean it."
            ),
            key!(
                "intake.group_events_max",
                "integer",
                |c| c.intake.group_events_max.to_string(),
                RESTART,
                "Group commit: at most this many requests share one transaction."
            ),
            key!(
                "intake.group_wait_ms",
                "number (milliseconds)",
                |c| num(c.intake.group_wait_ms),
                RESTART,
                "Group commit: how long the writer waits to fill a group (0: commit what is waiting now)."
            ),
            key!(
                "intake.pipelined_sync",
                "boolean",
                |c| c.intake.pipelined_sync.to_string(),
                RESTART,
                "Group commit: COMMIT does not sync; another thread syncs the WAL and answers the group after it, while the next group is written. Equally durable; faster only where the disk's sync, not the CPU, bounds the intake (on a 2-core host it was slower)."
            ),
        ],
    },
    Section {
        heading: "[dispatch]",
        about: "The dispatcher that delivers sealed batches.",
        keys: &[
            key!(
                "dispatch.parallel",
                "integer",
                |c| c.dispatch.parallel.to_string(),
                R,
                "Attempts in flight at once, over every destination."
            ),
            key!(
                "dispatch.poll_s",
                "number (seconds)",
                |c| num(c.dispatch.poll_s),
                R,
                "The longest the dispatcher sleeps between ticks when nothing wakes it (at least 0.01)."
            ),
            key!(
                "dispatch.heartbeat_s",
                "number (seconds)",
                |c| num(c.dispatch.heartbeat_s),
                R,
                "How often the dispatcher writes its heartbeat (what status and /healthz read)."
            ),
            key!(
                "dispatch.lease_grace_s",
                "number (seconds)",
                |c| num(c.dispatch.lease_grace_s),
                R,
                "A lease lasts the destination's timeout_s plus this; a lease past it is recovered and the batch delivered again."
            ),
            key!(
                "dispatch.max_attempts",
                "integer",
                |c| c.dispatch.max_attempts.to_string(),
                R,
                "Counted (batch-class) attempts before a batch is dead."
            ),
            key!(
                "dispatch.backoff_base_s",
                "number (seconds)",
                |c| num(c.dispatch.backoff_base_s),
                R,
                "The first retry's delay; each retry doubles it, with jitter."
            ),
            key!(
                "dispatch.backoff_cap_s",
                "number (seconds)",
                |c| num(c.dispatch.backoff_cap_s),
                R,
                "The longest retry delay."
            ),
            key!(
                "dispatch.throttle_alert_s",
                "number (seconds)",
                |c| num(c.dispatch.throttle_alert_s),
                R,
                "A destination that has answered only throttles (429, Retry-After) for this long opens a delivery issue."
            ),
        ],
    },
    Section {
        heading: "[dispatch.breaker]",
        about: "Each destination's circuit breaker (also written inline: `breaker = { trip_after = 3 }`).",
        keys: &[
            key!(
                "dispatch.breaker.trip_after",
                "integer",
                |c| c.dispatch.breaker.trip_after.to_string(),
                R,
                "Consecutive destination-class failures that open the breaker."
            ),
            key!(
                "dispatch.breaker.cooldown_initial_s",
                "number (seconds)",
                |c| num(c.dispatch.breaker.cooldown_initial_s),
                R,
                "How long an open breaker waits before its first probe."
            ),
            key!(
                "dispatch.breaker.cooldown_max_s",
                "number (seconds)",
                |c| num(c.dispatch.breaker.cooldown_max_s),
                R,
                "The longest cooldown; each failed probe doubles it up to this."
            ),
        ],
    },
    Section {
        heading: "[coalesce]",
        about: "The window every batch falls back to. A window field is taken from the route, then the source, then the source's span preset, then here.",
        keys: &[
            key!(
                "coalesce.quiet_s",
                "number (seconds)",
                |c| num(c.coalesce.quiet_s),
                R,
                "A batch seals after this long without a new event."
            ),
            key!(
                "coalesce.max_s",
                "number (seconds)",
                |c| num(c.coalesce.max_s),
                R,
                "A batch seals this long after its first event, however busy."
            ),
            key!(
                "coalesce.max_events",
                "integer",
                |c| c.coalesce.max_events.to_string(),
                R,
                "A batch seals at this many events."
            ),
            key!(
                "coalesce.max_bytes",
                "integer (bytes)",
                |c| c.coalesce.max_bytes.to_string(),
                R,
                "A batch seals before its payloads pass this size; check requires it to be at most 0.75 of the destination's max_body_bytes."
            ),
        ],
    },
    Section {
        heading: "[limits]",
        about: "Resource limits.",
        keys: &[key!(
            "limits.min_free_bytes",
            "integer (bytes)",
            |c| c.min_free_bytes.to_string(),
            R,
            "Below this much free space on the spool's filesystem the intake answers 503 instead of storing (0: no limit). SQLite only: on PostgreSQL the database's disk is the server's, and a write it refuses for space is answered 503 (spool:full)."
        )],
    },
    Section {
        heading: "[retention]",
        about: "How long finished rows are kept; the dispatcher prunes older ones.",
        keys: &[
            key!(
                "retention.delivered_days",
                "number (days)",
                |c| num(c.retention.delivered_days),
                R,
                "Delivered batches and their events."
            ),
            key!(
                "retention.attempts_days",
                "number (days)",
                |c| num(c.retention.attempts_days),
                R,
                "The attempt history."
            ),
            key!(
                "retention.dropped_days",
                "number (days)",
                |c| num(c.retention.dropped_days),
                R,
                "Dropped batches and quarantined requests."
            ),
            key!(
                "retention.issues_days",
                "number (days)",
                |c| num(c.retention.issues_days),
                R,
                "Resolved and ignored issues."
            ),
        ],
    },
    Section {
        heading: "[alerts]",
        about: "How issues reach a human.",
        keys: &[
            key!(
                "alerts.argv",
                "array of strings",
                |c| strings(&c.alerts.argv),
                R,
                "The command run for each alert, with the alert text on stdin. Replace it with your chat sender."
            ),
            key!(
                "alerts.dry",
                "bool",
                |c| c.alerts.dry.to_string(),
                R,
                "Log alerts instead of running argv."
            ),
            key!(
                "alerts.rate_limit_s",
                "number (seconds)",
                |c| num(c.alerts.rate_limit_s),
                R,
                "At most one alert per issue in this period."
            ),
            key!(
                "alerts.timeout_s",
                "number (seconds)",
                |c| num(c.alerts.timeout_s),
                R,
                "How long the alert command may run before it is killed."
            ),
        ],
    },
    Section {
        heading: "[hermes]",
        about: "The Hermes gateway every `hermes:<route>` destination delivers to (each may override these keys).",
        keys: &[
            key!(
                "hermes.base_url",
                "string (URL)",
                |c| format!("{:?}", c.hermes.base_url),
                R,
                "The gateway's base URL; a batch goes to <base_url>/webhooks/<route>."
            ),
            key!("hermes.subscriptions_path", "path", text "\"~/.hermes/webhook_subscriptions.json\"", R,
                "The gateway's subscriptions file, where each route's secret is read and which check reads."),
            key!(
                "hermes.timeout_s",
                "number (seconds)",
                |c| num(c.hermes.timeout_s),
                R,
                "One delivery attempt's timeout."
            ),
            key!(
                "hermes.max_body_bytes",
                "integer (bytes)",
                |c| c.hermes.max_body_bytes.to_string(),
                R,
                "The gateway's own body limit; must match its webhook max_body_bytes."
            ),
            key!(
                "hermes.legacy_signature",
                "bool",
                |c| c.hermes.legacy_signature.to_string(),
                R,
                "Also send X-Hub-Signature-256."
            ),
        ],
    },
    Section {
        heading: "[admin]",
        about: "The management API (`/api/v1`) that `hookspool run` serves in-process beside the intake, on loopback only; its start banner prints a ready-to-paste curl with the token. (`hookspool admin` takes its address and token from its flags.)",
        keys: &[
            key!(
                "admin.listen",
                "string",
                |c| format!(
                    "{:?}",
                    c.admin.listen.map(|a| a.to_string()).unwrap_or_default()
                ),
                RESTART,
                "`127.0.0.1:PORT`, `[::1]:PORT` or `localhost:PORT` (0 picks a free port); \"\" turns the admin API off. When the port is taken, `run` serves on a free port of the same address and its banner says which."
            ),
            key!("admin.token", "secret reference", text "none (a new token each start)", RESTART,
                "The token requests send as `Authorization: Bearer <token>` ({ file = \"...\" }, { env = \"NAME\" } or { env_file = \"...\", key = \"NAME\" }; at least 16 characters). Without it `run` generates one at start and prints it in its banner only, never in a log line; when stderr is the journal or JSON lines (no banner) the admin API then stays off."),
            key!("admin.socket", "path (absolute)", text "none", RESTART,
                "Also serve the admin API on this Unix socket, created mode 0660: a request on it needs no token (the file's mode and group are the gate), keeps the Host and CSRF rules, and its actions are audited as the caller's uid (`uid:<n>`, from SO_PEERCRED). `hookspool admin` serves it too when --socket is not given."),
        ],
    },
    Section {
        heading: "[telemetry]",
        about: "OpenTelemetry traces, off by default: a span per intake request (continuing the sender's traceparent), per batch and per delivery attempt, exported with OTLP over HTTP; each delivery carries its attempt's traceparent header. Attributes are ids and names only, never a body, header value or secret. Read at start.",
        keys: &[
            key!("telemetry.otlp_endpoint", "string (URL)", text "\"\" (no traces)", RESTART,
                "The collector's OTLP/HTTP address, e.g. \"http://127.0.0.1:4318\"; spans are POSTed to <otlp_endpoint>/v1/traces from a thread of their own, so a slow or absent collector never slows the intake or a delivery."),
            key!("telemetry.queue_spans", "integer", text "2048", RESTART,
                "Finished spans waiting for export at most (1 to 1000000); past it spans are dropped and counted in hookspool_trace_spans_dropped_total."),
        ],
    },
    Section {
        heading: "[spans.<name>]",
        about: "Window presets a source names with `span`. The built-in presets (burst, mail, calendar, sync, meeting, immediate) can be redefined; a new name adds one.",
        keys: &[
            key!("spans.<name>.quiet_s", "number (seconds)", text "the preset's", R,
                "The preset's quiet_s."),
            key!("spans.<name>.max_s", "number (seconds)", text "the preset's", R,
                "The preset's max_s."),
        ],
    },
    Section {
        heading: "[sources.<name>]",
        about: "A sender: its URL is /hooks/<name>. Most sources are written as bobbin instances ([bobbins.<name>]), which expand to this table. A source named after a built-in type is that type unless `type` says otherwise.",
        keys: &[
            key!("sources.<name>.type", "string", text "the name if it is a built-in type, else \"template\"", R,
                "One of github, zoom, trello, plaid, gmail, calendar, kaneo, slack, standard-webhooks, template. The built-in types' own keys are named by `hookspool check` when one is wrong."),
            key!("sources.<name>.secrets", "table of secret references", text "{}", R,
                "The type's secrets by name, each { file = \"...\" }, { env = \"NAME\" } or { env_file = \"...\", key = \"NAME\" }; read at every request, never stored in the file."),
            key!("sources.<name>.span", "string", text "the type's preset", R,
                "A [spans] preset for this source's windows."),
            key!("sources.<name>.quiet_s", "number (seconds)", text "inherited", R,
                "This source's window quiet_s."),
            key!("sources.<name>.max_s", "number (seconds)", text "inherited", R,
                "This source's window max_s."),
            key!("sources.<name>.max_events", "integer", text "inherited", R,
                "This source's window max_events."),
            key!("sources.<name>.max_bytes", "integer (bytes)", text "inherited", R,
                "This source's window max_bytes."),
            key!("sources.<name>.expect_every_s", "number (seconds)", text "0", R,
                "A silence longer than this opens a liveness issue (0: no expectation)."),
            key!("sources.<name>.dedup_window_s", "number (seconds)", text "the type's (86400; plaid 600)", R,
                "A delivery id seen within this window is a duplicate and not stored again."),
            key!("sources.<name>.max_body_bytes", "integer (bytes)", text "the smaller of intake.max_body_bytes and the window's max_bytes", R,
                "The largest body this source accepts; must not exceed its window's max_bytes."),
            key!("sources.<name>.action", "string", text "the type's", R,
                "The destination of an event no route claims."),
            key!("sources.<name>.keep_headers", "array of strings", text "[]", R,
                "Request headers kept in each event's document; an auth or credential header is refused."),
            key!("sources.<name>.store_raw", "bool", text "spool.store_raw", R,
                "Keep this source's original bodies."),
            key!("sources.<name>.event_header", "string", text "none", R,
                "The header a hermes destination without its own event_header sends the event type in."),
            key!("sources.<name>.every_s", "integer (seconds)", text "required for a poll source", R,
                "A poll source's period (type = \"poll\", from a poll bobbin's expansion only)."),
            key!("sources.<name>.jitter_s", "integer (seconds)", text "0", R,
                "A poll source's random delay added to each period (type = \"poll\" only)."),
            key!("sources.<name>.audience", "string", text "none (gmail)", R,
                "type = \"gmail\": check the OIDC ID token an authenticated Pub/Sub push subscription sends (Authorization: Bearer, RS256 against Google's published keys, iss accounts.google.com or https://accounts.google.com, exp not passed), whose aud must equal this (the subscription's audience); the query token is still required. The recommended mode."),
            key!("sources.<name>.service_account", "string (email)", text "none (gmail)", R,
                "type = \"gmail\", with audience: the token's email claim must be this service account, with email_verified true."),
            key!("sources.<name>.jwks_url", "string (URL)", text "\"https://www.googleapis.com/oauth2/v3/certs\" (gmail, with audience)", R,
                "type = \"gmail\", with audience: where Google's keys are fetched (guarded cache: at most one fetch a minute, refreshed after an hour, a key used at most six hours after its fetch)."),
            key!("sources.<name>.jwks_allow_private", "array of address blocks", text "[] (gmail, with audience)", R,
                "type = \"gmail\", with audience: address blocks the egress policy admits for the key fetch (a test's stub: [\"127.0.0.1/32\"]); jwks_url may then be http:// on such an address."),
            key!("sources.<name>.env", "string", text "\"production\" (plaid)", R,
                "type = \"plaid\": the Plaid environment whose keys verify the webhooks: production, sandbox or development."),
            key!("sources.<name>.scheme", "string", text "required (template) unless recipe", R,
                "type = \"template\" (or recipe): how requests are verified: hmac-sha256-hex, hmac-sha256-base64, hmac-sha1-base64-url, hmac-sha1-base64-url-form (Twilio's forms), hmac-sha1-base64-url-json (Twilio's JSON bodies: ?bodySHA256=), standard-webhooks, timestamped or static-token."),
            key!("sources.<name>.recipe", "table", text "none (template; instead of scheme)", R,
                "type = \"template\": what the sender does to sign, in parts (instead of scheme): algorithm (hmac-sha1, hmac-sha256, hmac-sha512, ed25519, ecdsa-p256, jws-hs256, jws-es256, jws-rs256), key (text, hex, base64, whsec; for ecdsa-p256 and jws-es256 the sender's public key as pem, der-base64, jwk or jwks, a JWK Set whose keys are all tried), signed (an ordered list of method, url, body, timestamp, header:<Name>, field:<json.path> (a field of the JSON body), literal:<text>; without body only with body_unsigned = true and a timestamp, for a sender such as Mailgun that signs a timestamp and a token), header, or field (the JSON body field holding the signature, e.g. \"signature.signature\"), prefix, list/pair/name (a `t=..,v1=..` list; every matching entry is tried, for rotation), encoding (hex, base64, base64url), timestamp (header:<Name>, list:<entry> or field:<json.path>; signed as a part, \"timestamp\" in signed, unless it is a field of a body the recipe signs, as Linear's webhookTimestamp), timestamp_unit (s, ms or rfc3339) and tolerance_s (the two-sided window, 30 to 3600 s, default 300); a JWS recipe (jws-hs256, jws-es256, jws-rs256; RS256 with the sender's RSA keys as key = \"jwk\" or \"jwks\") instead takes header, prefix, body_claim (the claim holding the body's hex SHA-256), issuer (a string or a list), audience (the aud claim must hold it; with audience, body_claim may be left out for a bearer ID token that covers no body and must carry exp), email (the email claim, with email_verified true), jwks_url (an https URL whose JWK Set holds the keys: fetched on first use and on an unknown kid, at most once a minute per URL, refreshed after an hour, never used more than six hours after the fetch; no key and no secret then) with jwks_allow_private (address blocks the egress policy admits for that fetch, e.g. [\"127.0.0.1/32\"]; http:// only for such an address) and timestamp = \"claim:<name>\", and an exp claim must not have passed. A recipe that signs url takes callback_url. The schemes hmac-sha256-hex, hmac-sha256-base64, hmac-sha1-base64-url and timestamped are presets of it."),
            key!("sources.<name>.accepted_reply", "string (JSON)", text "none (template)", R,
                "type = \"template\": the JSON body answered with 200 once a delivery is stored (queued, duplicate or replayed) instead of {\"status\":\"queued\"}, for a sender that reads the answer: Discord's deferred interaction response '{\"type\":5}'. A constant."),
            key!("sources.<name>.handshake", "table", text "none (template)", R,
                "type = \"template\": a handshake the sender makes, answered instead of enqueued: kind = \"echo\" (when = a rule on the signed body, field = the challenge's selector, reply = \"text\" or \"json:<member>\"; answered after verification), \"ping\" (when, reply = the JSON answer; after verification) or \"query\" (challenge = the query parameter, answered as text/plain; with token = the parameter holding a verify token, only a GET whose token equals the secret verify_token, compared in constant time; without token before verification, since the answer is the sender's own text) or \"header\" (challenge = the header a GET carries, e.g. Okta's X-Okta-Verification-Challenge, reply as for echo; answered after the scheme verifies the GET's credential)."),
            key!("sources.<name>.header", "string", text "none (template)", R,
                "type = \"template\": the header holding the signature or token (every scheme but standard-webhooks; static-token takes header or param)."),
            key!("sources.<name>.prefix", "string", text "\"\" (template)", R,
                "type = \"template\": text before the signature or token in header (\"sha256=\", \"Bearer \")."),
            key!("sources.<name>.param", "string", text "none (template)", R,
                "type = \"template\": the query parameter holding the token (static-token only)."),
            key!("sources.<name>.callback_url", "string (URL)", text "required by the url schemes (template, trello)", R,
                "type = \"template\" or \"trello\": the URL the signature covers, exactly as configured at the sender (hmac-sha1-base64-url, hmac-sha1-base64-url-form and hmac-sha1-base64-url-json; for the Twilio schemes the URL with its default port written out or its port left out holds too)."),
            key!("sources.<name>.tolerance_s", "integer (seconds)", text "300 (template, standard-webhooks)", R,
                "type = \"template\" or \"standard-webhooks\": the replay window of a timestamped scheme (timestamped, standard-webhooks), 30 to 3600."),
            key!("sources.<name>.head_handshake", "bool", text "false (template)", R,
                "type = \"template\": answer HEAD with an empty 200 before verification."),
            key!("sources.<name>.key", "string or array of strings", text "required (template)", R,
                "type = \"template\": the coalesce key's selectors (payload.x, header.X); list items are joined with `:`."),
            key!("sources.<name>.dedup", "string", text "none (template)", R,
                "type = \"template\": the selector of the delivery id (no value: no dedup)."),
            key!("sources.<name>.ignore", "string or array of strings", text "[] (template)", R,
                "type = \"template\": rules (`selector=value`, `selector!=value`) whose requests are answered 2xx and not stored."),
            key!("sources.<name>.event_type", "string", text "\"\" (template)", R,
                "type = \"template\": the selector of the event type."),
            key!("sources.<name>.attrs", "table of strings", text "{} (template)", R,
                "type = \"template\": route-match attributes, each a selector."),
            key!("sources.<name>.body", "string", text "\"json\" (template)", R,
                "type = \"template\": how the payload is read: \"json\", \"form\" or \"form-json:<field>\" (hmac-sha1-base64-url-form takes only \"form\")."),
            key!("sources.<name>.sender_retries", "bool", text "false (template)", R,
                "type = \"template\": whether the sender retries a non-2xx answer."),
        ],
    },
    Section {
        heading: "[[routes]]",
        about: "Routes send a source's events to destinations by their attributes; an event no route claims goes to the source's action. Window fields override the source's.",
        keys: &[
            key!("routes[].name", "string", text "required", R,
                "The route's name: a batch group of its own; letters, digits, '-' and '_'."),
            key!("routes[].source", "string", text "required", R,
                "The [sources.*] name whose events it takes."),
            key!("routes[].match", "table of strings", text "{} (every event)", R,
                "Attributes an event must have (event_type, class, ...)."),
            key!("routes[].destination", "string", text "the source's action", R,
                "Where its batches go: a [destinations.*] name or an implicit hermes:<route>."),
            key!("routes[].tee", "bool", text "false", R,
                "Also deliver a copy of matching events here, beside the route that claims them."),
            key!("routes[].quiet_s", "number (seconds)", text "inherited", R,
                "This route's window quiet_s."),
            key!("routes[].max_s", "number (seconds)", text "inherited", R,
                "This route's window max_s."),
            key!("routes[].max_events", "integer", text "inherited", R,
                "This route's window max_events."),
            key!("routes[].max_bytes", "integer (bytes)", text "inherited", R,
                "This route's window max_bytes."),
        ],
    },
    Section {
        heading: "[destinations.<name>]",
        about: "Where batches are delivered. A name `hermes:<route>` or `script:<name>` implies its type; a hermes destination needs no table at all.",
        keys: &[
            key!("destinations.<name>.type", "string", text "implied by the name", R,
                "http, hermes or script."),
            key!("destinations.<name>.max_inflight", "integer", text "http 4, hermes 2, script 1", R,
                "Attempts in flight to this destination at once."),
            key!("destinations.<name>.max_per_s", "number (attempts a second)", text "none (no limit)", R,
                "Attempts the dispatcher may start a second (a token bucket beside max_inflight); a batch held by it stays due, keeps its place in its key and is no attempt. 0 < max_per_s <= 100000."),
            key!("destinations.<name>.burst", "integer", text "max(1, ceil(max_per_s))", R,
                "Attempts that may start back to back under max_per_s (1 to 100000; only with max_per_s)."),
            key!("destinations.<name>.timeout_s", "number (seconds)", text "http and hermes 30, script 300", R,
                "One attempt's timeout."),
            key!("destinations.<name>.max_body_bytes", "integer (bytes)", text "1048576", R,
                "The receiver's body limit (http, hermes)."),
            key!("destinations.<name>.url", "string (URL)", text "required (http)", R,
                "http: where batches are POSTed; https unless allow_insecure."),
            key!("destinations.<name>.secret", "secret reference", text "required (http)", R,
                "http: the Standard Webhooks signing secret (whsec_...)."),
            key!("destinations.<name>.secret_previous", "secret reference", text "none (http)", R,
                "http: the previous secret, also signed with during a rotation."),
            key!("destinations.<name>.headers", "table of strings", text "{} (http)", R,
                "http: extra request headers."),
            key!("destinations.<name>.allow_insecure", "bool", text "false (http)", R,
                "http: allow an http:// URL."),
            key!("destinations.<name>.allow_private", "bool or array of address blocks", text "false (http); [\"127.0.0.1/32\", \"::1/128\"] (hermes)", R,
                "http, hermes: the egress policy refuses loopback, private, link-local, unspecified, multicast and CGNAT addresses after DNS resolution (and connects only to the address it checked); true admits them all for this destination, a list admits those blocks, e.g. [\"127.0.0.1/32\"] for a receiver on this host."),
            key!("destinations.<name>.unwrap", "bool", text "false (http, hermes)", R,
                "http, hermes: one request per event with the event's payload as the body, instead of one batch document."),
            key!("destinations.<name>.event_header", "string", text "the source's (http, hermes)", R,
                "http, hermes: the header the event type is sent in."),
            key!("destinations.<name>.dedup_header", "string", text "none (http, hermes)", R,
                "http, hermes: the header an unwrapped event's dedup id is sent in."),
            key!("destinations.<name>.profile", "string", text "none (hermes)", R,
                "hermes: the gateway profile the route belongs to."),
            key!("destinations.<name>.base_url", "string (URL)", text "hermes.base_url (hermes)", R,
                "hermes: this destination's gateway."),
            key!("destinations.<name>.subscriptions_path", "path", text "hermes.subscriptions_path (hermes)", R,
                "hermes: this destination's subscriptions file."),
            key!("destinations.<name>.legacy_signature", "bool", text "hermes.legacy_signature (hermes)", R,
                "hermes: also send X-Hub-Signature-256."),
            key!("destinations.<name>.argv", "array of strings", text "required unless processor (script)", R,
                "script: the program and its arguments, run sandboxed with the batch document on stdin."),
            key!("destinations.<name>.processor", "string", text "none (script)", R,
                "script: the bobbin instance whose processor this is (written by a bobbin's expansion only)."),
            key!("destinations.<name>.cwd", "path", text "none (script)", R,
                "script: the working directory."),
            key!("destinations.<name>.env_file", "path", text "none (script)", R,
                "script: a file of NAME=value lines added to the environment."),
            key!("destinations.<name>.env", "table of strings", text "{} (script)", R,
                "script: environment variables."),
            key!("destinations.<name>.state_dir", "path (absolute)", text "none (script)", R,
                "script: a directory the sandboxed program may write."),
            key!("destinations.<name>.sandbox", "table", text "the defaults (script)", R,
                "script: sandbox settings (`hookspool check --sandbox-selftest` shows what the host enforces)."),
        ],
    },
    Section {
        heading: "[bobbins.<name>]",
        about: "A bobbin instance: a packaged source (and its processor or poller) expanded into [sources.<name>], routes and destinations at every load. `hookspool bobbin show <bobbin>` lists a bobbin's secrets, settings and outputs.",
        keys: &[
            key!("bobbins.<name>.bobbin", "string", text "required", R,
                "The bobbin: <vendor>.<product>, e.g. github.repo."),
            key!("bobbins.<name>.secrets", "table of secret references", text "{}", R,
                "The bobbin's secrets by name."),
            key!("bobbins.<name>.settings", "table", text "the manifest's defaults", R,
                "The bobbin's settings by name."),
            key!("bobbins.<name>.outputs", "table of strings", text "required", R,
                "Where each output goes (\"*\" = every event), a destination name."),
            key!("bobbins.<name>.expect", "bool", text "false", R,
                "Take the manifest's expect_every_s as this source's liveness expectation."),
            key!("bobbins.<name>.span", "string", text "the manifest's", R,
                "The source's span preset."),
            key!("bobbins.<name>.quiet_s", "number (seconds)", text "inherited", R,
                "The source's window quiet_s."),
            key!("bobbins.<name>.max_s", "number (seconds)", text "inherited", R,
                "The source's window max_s."),
            key!("bobbins.<name>.max_events", "integer", text "inherited", R,
                "The source's window max_events."),
            key!("bobbins.<name>.max_bytes", "integer (bytes)", text "inherited", R,
                "The source's window max_bytes."),
            key!("bobbins.<name>.expect_every_s", "number (seconds)", text "0", R,
                "The source's liveness expectation."),
            key!("bobbins.<name>.dedup_window_s", "number (seconds)", text "the type's", R,
                "The source's dedup window."),
            key!("bobbins.<name>.max_body_bytes", "integer (bytes)", text "inherited", R,
                "The source's largest body."),
            key!("bobbins.<name>.timeout_s", "number (seconds)", text "the manifest's", R,
                "The processor's or poller's timeout."),
            key!("bobbins.<name>.state_dir", "path (absolute)", text "<home>/bobbins/<name>", R,
                "The processor's private state directory."),
            key!("bobbins.<name>.every_s", "integer (seconds)", text "the manifest's", R,
                "A poll bobbin's period."),
            key!("bobbins.<name>.jitter_s", "integer (seconds)", text "the manifest's", R,
                "A poll bobbin's jitter."),
        ],
    },
];

/// The config an empty file validates to, with no flag or environment: the defaults.
fn defaults() -> Config {
    let inputs = PathInputs::default();
    match super::parse("", None, &inputs, false) {
        Ok((c, _)) => c,
        // An empty file always validates (this module's tests prove it); the fallback
        // keeps `generate` total.
        Err(_) => super::fallback(&inputs),
    }
}

fn default_text(k: &Key, c: &Config) -> String {
    match k.default {
        Default::Of(f) => f(c),
        Default::Text(t) => t.to_string(),
    }
}

const TITLE: &str = "hookspool.toml: the configuration reference";
const INTRO: &str = "The file is TOML: `<home>/config.toml`, or the file --config or HOOKSPOOL_CONFIG names. Every key is optional unless marked required. `hookspool check` refuses an unknown key; the services warn about one and leave it out. A save is applied by both the intake and the dispatcher within a second (both watch the file; SIGHUP, which `systemctl reload <unit>` sends, reloads that process at once); a file with an error keeps the previous config and opens the config:file issue. \"restart\" keys are read when the process starts: a reload keeps their old value (the intake names its own in a warning).";

/// docs/configuration.md.
pub fn markdown() -> String {
    let c = defaults();
    let mut out = format!(
        "<!-- Generated by `hookspool generate reference docs`; do not edit (tests/tidy.rs checks it). -->\n\n# {TITLE}\n\n{INTRO}\n"
    );
    for s in SECTIONS {
        out.push_str(&format!("\n## `{}`\n\n{}\n\n", s.heading, s.about));
        out.push_str("| key | type | default | applied by | what it does |\n");
        out.push_str("| --- | --- | --- | --- | --- |\n");
        for k in s.keys {
            out.push_str(&format!(
                "| `{}` | {} | `{}` | {} | {} |\n",
                k.key,
                k.ty,
                default_text(k, &c).replace('|', "\\|"),
                k.reload.as_str(),
                k.doc.replace('|', "\\|")
            ));
        }
    }
    out
}

/// roff text: a leading `.` or `'` would be a request, a backslash an escape.
fn roff(s: &str) -> String {
    let s = s.replace('\\', "\\e").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}

/// hookspool.toml(5).
pub fn man_page() -> String {
    let c = defaults();
    let version = env!("CARGO_PKG_VERSION");
    let mut out = format!(
        ".TH HOOKSPOOL.TOML 5 \"\" \"hookspool {version}\" \"File Formats\"\n.SH NAME\nhookspool.toml \\- {}\n.SH DESCRIPTION\n{}\n",
        roff("the configuration file of hookspool"),
        roff(INTRO)
    );
    for s in SECTIONS {
        out.push_str(&format!(".SH {}\n{}\n", roff(s.heading), roff(s.about)));
        for k in s.keys {
            out.push_str(&format!(
                ".TP\n.B {}\n{}. Default: {}. Applied by: {}.\n.br\n{}\n",
                roff(k.key),
                roff(k.ty),
                roff(&default_text(k, &c)),
                k.reload.as_str(),
                roff(k.doc)
            ));
        }
    }
    out.push_str(".SH SEE ALSO\n\\fBhookspool\\fR(1)\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_under(prefix: &str) -> Vec<&'static str> {
        SECTIONS
            .iter()
            .flat_map(|s| s.keys)
            .filter_map(|k| k.key.strip_prefix(prefix))
            .collect()
    }

    #[test]
    fn an_empty_file_validates_so_every_default_is_the_validators() {
        assert!(super::super::parse("", None, &PathInputs::default(), false).is_ok());
    }

    #[test]
    fn every_destination_type_key_has_a_row() {
        let documented = keys_under("destinations.<name>.");
        for k in super::super::destination::HTTP_KEYS
            .iter()
            .chain(super::super::destination::HERMES_KEYS)
            .chain(super::super::destination::SCRIPT_KEYS)
        {
            assert!(documented.contains(k), "destinations.<name>.{k} has no row");
        }
    }

    #[test]
    fn every_template_key_has_a_row() {
        let documented = keys_under("sources.<name>.");
        for k in crate::bobbins::template_keys::TEMPLATE_KEYS {
            assert!(
                documented.contains(&k.name),
                "sources.<name>.{} has no row",
                k.name
            );
        }
    }

    /// The built-in source types' own keys, as each type names them when it refuses an
    /// unknown one (the kit's options build each type; one key more is refused with the
    /// list of the keys it accepts).
    #[test]
    fn every_key_of_a_built_in_source_type_has_a_row() {
        let documented = keys_under("sources.<name>.");
        for kind in crate::sources::KINDS.iter().filter(|k| **k != "template") {
            let kit = crate::kit::signer::Kit::builtin(kind, b"reference").expect("kit");
            let mut options = kit.options.clone();
            options.insert("reference_probe".into(), toml::Value::Boolean(true));
            match crate::sources::build("probe", kind, &options) {
                Err(crate::sources::SourceConfigError::UnknownKey { accepted, .. }) => {
                    for key in accepted.split(", ").filter(|k| *k != "none") {
                        assert!(
                            documented.contains(&key),
                            "{kind}: sources.<name>.{key} has no row"
                        );
                    }
                }
                Err(e) => panic!("{kind}: {e}"),
                Ok(_) => panic!("{kind}: an unknown key was accepted"),
            }
        }
    }

    #[test]
    fn every_instance_key_has_a_row_and_no_other() {
        let mut documented = keys_under("bobbins.<name>.");
        let mut accepted = crate::bobbins::expand::INSTANCE_KEYS.to_vec();
        documented.sort_unstable();
        accepted.sort_unstable();
        assert_eq!(documented, accepted);
    }

    #[test]
    fn the_restart_keys_are_the_ones_the_intake_names_at_a_reload() {
        // Snapshot::restart_only_changes names these; a key it names must be "restart" here.
        let c = defaults();
        for (key, _) in crate::intake::snapshot::restart_only(&c, &c) {
            let row = SECTIONS
                .iter()
                .flat_map(|s| s.keys)
                .find(|k| k.key == key)
                .unwrap_or_else(|| panic!("{key} has no row"));
            assert_eq!(row.reload, Reload::Restart, "{key}");
        }
    }
}
