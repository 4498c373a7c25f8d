//! The Google processors through the real binary against a stub Google (a real HTTP server
//! on 127.0.0.1:0, `processor_stub`), with the repository's own bobbin directories and
//! manifests. Each answer shape follows Google's public REST reference, named where it is
//! built: OAuth "Refreshing an access token" (developers.google.com/identity/protocols/
//! oauth2/web-server), Gmail users.history.list / users.messages.get / users.getProfile,
//! Calendar events.list and freeBusy.query, Drive changes.list and
//! changes.getStartPageToken, and the error bodies of Gmail's "Resolve errors" page (the
//! same `error.code / errors[].reason / status` shape every Google REST API answers).

use std::collections::{HashSet, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use serde_json::{Value, json};

use super::killed;
use super::processor::{Instance, code, emits, stderr};
use super::processor_stub::{Req, Resp, Stub};

pub const CLIENT_SECRET: &str = "SENTINEL-client-secret";
pub const CLIENT_ID: &str = "client-1.apps.googleusercontent.com";
pub const REFRESH: &str = "SENTINEL-refresh-original";
pub const OWNER: &str = "owner@example.com";
const SUBJECT_SENTINEL: &str = "SENTINEL-subject";

/// The token side of the fake: which access tokens are valid, how long new ones last,
/// whether the next answer rotates the refresh token, and the refresh tokens accepted.
pub struct Tokens {
    pub issued: usize,
    pub valid: HashSet<String>,
    pub expires_in: i64,
    pub rotate_next: Option<String>,
    pub accepted_refresh: HashSet<String>,
    /// One-shot answers for paths ending with the suffix, before the API handler.
    pub forced: VecDeque<(String, Resp)>,
}

type Api = dyn Fn(&Req) -> Resp + Send + Sync;

/// A stub Google: the token endpoint of [`token_answer`], bearer checks, one-shot forced
/// answers, then the test's API handler. Shared with `processor_run`.
pub struct Fake {
    pub stub: Stub,
    pub tokens: Arc<Mutex<Tokens>>,
    api: Arc<Mutex<Arc<Api>>>,
}

/// Google's error body (Gmail "Resolve errors").
pub fn google_error(code: u16, reason: &str, message: &str, status: &str) -> Resp {
    Resp::json(
        code,
        json!({"error": {"code": code, "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
            "status": status}}),
    )
}

impl Fake {
    pub fn start() -> Fake {
        let tokens = Arc::new(Mutex::new(Tokens {
            issued: 0,
            valid: HashSet::new(),
            expires_in: 3599,
            rotate_next: None,
            accepted_refresh: HashSet::from([REFRESH.to_string()]),
            forced: VecDeque::new(),
        }));
        let api: Arc<Mutex<Arc<Api>>> =
            Arc::new(Mutex::new(Arc::new(|_: &Req| Resp::json(500, json!({})))));
        let (t, a) = (tokens.clone(), api.clone());
        let stub = Stub::start(move |r: &Req| {
            let mut t = t.lock().unwrap();
            if r.path == "/oauth2.googleapis.com/token" {
                return token_answer(&mut t, r);
            }
            if !r.bearer().is_some_and(|b| t.valid.contains(b)) {
                return google_error(
                    401,
                    "authError",
                    "Request had invalid authentication credentials.",
                    "UNAUTHENTICATED",
                );
            }
            if let Some(pos) = t
                .forced
                .iter()
                .position(|(s, _)| r.path.ends_with(s.as_str()))
            {
                return t.forced.remove(pos).map(|(_, resp)| resp).unwrap();
            }
            drop(t);
            let api = a.lock().unwrap().clone();
            api(r)
        });
        Fake { stub, tokens, api }
    }

    pub fn api(&self, f: impl Fn(&Req) -> Resp + Send + Sync + 'static) {
        *self.api.lock().unwrap() = Arc::new(f);
    }

    pub fn force(&self, suffix: &str, resp: Resp) {
        self.tokens
            .lock()
            .unwrap()
            .forced
            .push_back((suffix.into(), resp));
    }

    pub fn token_requests(&self) -> Vec<Req> {
        self.stub
            .requests()
            .into_iter()
            .filter(|r| r.path.ends_with("/token"))
            .collect()
    }

    pub fn api_requests(&self) -> Vec<Req> {
        self.stub
            .requests()
            .into_iter()
            .filter(|r| !r.path.ends_with("/token"))
            .collect()
    }
}

/// The refresh-token grant (RFC 6749 6; Google's "Refreshing an access token": the answer
/// holds access_token, expires_in, scope, token_type; a revoked refresh token is 400
/// invalid_grant).
fn token_answer(t: &mut Tokens, r: &Req) -> Resp {
    let ok = r.method == "POST"
        && r.form("grant_type").as_deref() == Some("refresh_token")
        && r.form("client_id").as_deref() == Some(CLIENT_ID)
        && r.form("client_secret").as_deref() == Some(CLIENT_SECRET)
        && r.form("refresh_token")
            .is_some_and(|rt| t.accepted_refresh.contains(&rt));
    if !ok {
        return Resp::json(
            400,
            json!({"error": "invalid_grant", "error_description": "Token has been expired or revoked."}),
        );
    }
    t.issued += 1;
    let access = format!("SENTINEL-access-{}", t.issued);
    t.valid.insert(access.clone());
    let mut body = json!({
        "access_token": access,
        "expires_in": t.expires_in,
        "scope": "https://www.googleapis.com/auth/gmail.readonly",
        "token_type": "Bearer",
    });
    if let Some(rotated) = t.rotate_next.take() {
        t.accepted_refresh.clear();
        t.accepted_refresh.insert(rotated.clone());
        body["refresh_token"] = json!(rotated);
    }
    Resp::json(200, body)
}

fn repo_bobbin(product: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("bobbins/google/{product}"))
}

fn instance(fake: &Fake, product: &str) -> (Instance, PathBuf) {
    let mut i = Instance::new(
        product,
        &format!("google.{product}"),
        Some(&repo_bobbin(product)),
    );
    let cred = i.secret_file(
        "cred_owner",
        &json!({
            "type": "authorized_user",
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
            "refresh_token": REFRESH,
        })
        .to_string(),
    );
    i.env.push((
        "HOOKSPOOL_TEST_PROVIDER_BASE".into(),
        fake.stub.base.clone(),
    ));
    (i, cred)
}

/// No run's stderr carries a token, the client secret or a message subject.
fn assert_no_sentinel(outs: &[&std::process::Output]) {
    for o in outs {
        let e = stderr(o);
        assert!(!e.contains("SENTINEL"), "a sentinel reached stderr: {e}");
    }
}

// ---------------------------------------------------------------- gmail

/// A Pub/Sub push as the gmail source stores it (Gmail "Push notifications": message.data is
/// base64 JSON {emailAddress, historyId}).
fn push(history: u64) -> Value {
    let data = base64::engine::general_purpose::STANDARD
        .encode(json!({"emailAddress": OWNER, "historyId": history.to_string()}).to_string());
    json!({"message": {"data": data, "messageId": format!("m{history}"), "publishTime": "2026-05-01T09:00:00Z"},
           "subscription": "projects/p/subscriptions/s"})
}

/// users.messages.get with format=metadata.
pub fn message(id: &str, from: &str, subject: &str) -> Value {
    json!({"id": id, "threadId": format!("t-{id}"), "labelIds": ["INBOX", "UNREAD"],
        "snippet": "snippet of the message", "historyId": "1009", "internalDate": "1777626000000",
        "sizeEstimate": 2048,
        "payload": {"partId": "", "headers": [
            {"name": "From", "value": from},
            {"name": "To", "value": OWNER},
            {"name": "Subject", "value": subject},
            {"name": "Date", "value": "Fri, 1 May 2026 09:00:00 +0000"}]}})
}

/// history.list pages from startHistoryId 1000 to 1010, messages m1..m3 (m3 deleted since:
/// 404), free/busy with one busy hour, the profile at history 5000.
fn gmail_api(r: &Req) -> Resp {
    gmail_api_of(OWNER, r)
}

/// [`gmail_api`] for the mailbox `owner`.
pub fn gmail_api_of(owner: &str, r: &Req) -> Resp {
    let p = r.path.as_str();
    if p.ends_with("/gmail/v1/users/me/history") {
        return match (r.q("startHistoryId"), r.q("pageToken")) {
            (Some("1000"), None) => Resp::json(
                200,
                json!({
                "history": [
                    {"id": "1003", "messages": [{"id": "m1", "threadId": "t-m1"}],
                     "messagesAdded": [{"message": {"id": "m1", "threadId": "t-m1", "labelIds": ["INBOX"]}}]},
                    {"id": "1005", "messages": [{"id": "m2", "threadId": "t-m2"}],
                     "messagesAdded": [{"message": {"id": "m2", "threadId": "t-m2", "labelIds": ["INBOX"]}}]}],
                "nextPageToken": "page-2",
                "historyId": "1010"}),
            ),
            (Some("1000"), Some("page-2")) => Resp::json(
                200,
                json!({
                "history": [
                    {"id": "1008", "messages": [{"id": "m3", "threadId": "t-m3"}],
                     "messagesAdded": [{"message": {"id": "m3", "threadId": "t-m3", "labelIds": ["INBOX"]}},
                                       {"message": {"id": "m1", "threadId": "t-m1", "labelIds": ["INBOX"]}}]}],
                "historyId": "1010"}),
            ),
            (Some(_), None) => Resp::json(200, json!({"historyId": "1020"})),
            _ => Resp::json(400, json!({})),
        };
    }
    if p.ends_with("/users/me/messages/m1") {
        return Resp::json(
            200,
            message(
                "m1",
                "Ann <ann@example.com>",
                "Are you free for a call on Thursday?",
            ),
        );
    }
    if p.ends_with("/users/me/messages/m2") {
        return Resp::json(
            200,
            message(
                "m2",
                "billing@acme.example",
                &format!("Invoice 4711 {SUBJECT_SENTINEL}"),
            ),
        );
    }
    if p.ends_with("/users/me/messages/m3") {
        return google_error(
            404,
            "notFound",
            "Requested entity was not found.",
            "NOT_FOUND",
        );
    }
    if p.ends_with("/users/me/profile") {
        return Resp::json(
            200,
            json!({"emailAddress": owner, "messagesTotal": 10,
            "threadsTotal": 8, "historyId": "5000"}),
        );
    }
    if p.ends_with("/calendar/v3/freeBusy") && r.method == "POST" {
        let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        let (min, max) = (body["timeMin"].clone(), body["timeMax"].clone());
        // The busy hour starts two hours into the horizon (freeBusy.query's response).
        let start =
            hookspool::processor::providers::google::parse_rfc3339(min.as_str().unwrap_or(""))
                .unwrap_or(0.0);
        let g = hookspool::processor::providers::google::rfc3339;
        return Resp::json(
            200,
            json!({"kind": "calendar#freeBusy", "timeMin": min, "timeMax": max,
            "calendars": {owner: {"busy": [{"start": g(start + 7200.0), "end": g(start + 10800.0)}]}}}),
        );
    }
    Resp::json(404, json!({}))
}

fn gmail_instance(fake: &Fake) -> (Instance, PathBuf) {
    let (mut i, cred) = instance(fake, "gmail");
    i.settings = json!({
        "owner": OWNER, "tz": "Europe/Berlin", "label": "INBOX", "horizon_days": 2,
        "min_window_minutes": 30, "rule_packs": ["scheduling"], "body": false,
        "rules": {"invoice": {"from": "billing@(?P<vendor>[a-z]+)\\.example", "subject": "Invoice (?P<number>\\d+)", "output": "invoice"}},
    });
    i.routes = json!({"mail": "hermes:mail", "scheduling": "hermes:mail-scheduling"});
    (i, cred)
}

#[test]
fn gmail_first_push_is_a_silent_baseline_then_pages_of_history_become_items_once() {
    let fake = Fake::start();
    fake.api(gmail_api);
    let (i, cred) = gmail_instance(&fake);
    let cred_before = std::fs::read(&cred).unwrap();

    let first = i.run(1, OWNER, &[push(1000)], None);
    assert_eq!(code(&first), Some(0), "{}", stderr(&first));
    assert!(emits(&first).is_empty(), "the first push announces nothing");
    assert_eq!(i.state()["history_id"], "1000");
    assert!(
        fake.stub.requests().is_empty(),
        "the baseline needs no call"
    );

    let second = i.run(2, OWNER, &[push(1004), push(1010)], None);
    assert_eq!(code(&second), Some(0), "{}", stderr(&second));
    let e = emits(&second);
    let summary: Vec<(String, String)> = e
        .iter()
        .map(|x| {
            let id = x["payload"]["id"]
                .as_str()
                .or(x["payload"]["message"]["id"].as_str());
            (
                x["event_type"].as_str().unwrap().to_string(),
                id.unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("mail".into(), "m1".into()),
            ("scheduling".into(), "m1".into()),
            ("mail".into(), "m2".into())
        ],
        "m1 once although two records name it; m3 is gone; invoice is unmapped"
    );
    assert_eq!(e[0]["destination"], "hermes:mail");
    assert_eq!(e[0]["key"], OWNER, "the batch key (spec 14.3.4)");
    assert_eq!(
        e[0]["payload"]["subject"],
        "Are you free for a call on Thursday?"
    );
    assert_eq!(e[0]["payload"]["from"], "Ann <ann@example.com>");
    assert_eq!(e[0]["payload"]["labelIds"], json!(["INBOX", "UNREAD"]));
    assert_eq!(
        e[0]["payload"]["rules"][0]["rule"],
        "scheduling/availability"
    );
    let sched = &e[1]["payload"];
    assert_eq!(e[1]["destination"], "hermes:mail-scheduling");
    assert_eq!(sched["tz"], "Europe/Berlin");
    let windows = sched["free_windows"].as_array().unwrap();
    assert_eq!(windows.len(), 2, "before and after the busy hour: {sched}");
    let m2 = &e[2]["payload"];
    assert_eq!(
        m2["rules"][0]["values"],
        json!({"vendor": "acme", "number": "4711"})
    );
    assert_eq!(i.state()["history_id"], "1010");
    let err = stderr(&second);
    assert_eq!(
        err.matches("the manifest does not declare as outputs: invoice x1")
            .count(),
        1,
        "one line per batch for the rule's undeclared output: {err}"
    );

    let history: Vec<Req> = fake
        .api_requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/history"))
        .collect();
    assert_eq!(history.len(), 2, "two pages");
    assert_eq!(history[0].q("historyTypes"), Some("messageAdded"));
    assert_eq!(history[0].q("labelId"), Some("INBOX"));
    assert_eq!(history[1].q("pageToken"), Some("page-2"));
    let get = fake
        .api_requests()
        .into_iter()
        .find(|r| r.path.ends_with("/messages/m1"))
        .unwrap();
    assert_eq!(get.q("format"), Some("metadata"));
    assert_eq!(fake.stub.count("/freeBusy"), 1);
    assert_eq!(fake.token_requests().len(), 1);

    // The retry of batch 2 replays the journal: no request at all.
    fake.stub.clear();
    let replay = i.run(2, OWNER, &[push(1004), push(1010)], None);
    assert_eq!(emits(&replay), e);
    assert!(fake.stub.requests().is_empty());

    // A later push reuses the cached access token.
    let third = i.run(3, OWNER, &[push(1020)], None);
    assert_eq!(code(&third), Some(0), "{}", stderr(&third));
    assert!(emits(&third).is_empty());
    assert_eq!(i.state()["history_id"], "1020");
    assert_eq!(
        fake.token_requests().len(),
        0,
        "the cached token was still valid"
    );
    assert_eq!(
        std::fs::read(&cred).unwrap(),
        cred_before,
        "the credential file is never rewritten"
    );
    assert_no_sentinel(&[&first, &second, &replay, &third]);
}

#[test]
fn gmail_a_sweep_event_pages_from_the_stored_history_without_a_push() {
    let fake = Fake::start();
    fake.api(gmail_api);
    let (i, _) = gmail_instance(&fake);
    assert_eq!(code(&i.run(1, OWNER, &[push(1000)], None)), Some(0));
    // An old push (already processed) needs no call at all.
    let old = i.run(2, OWNER, &[push(900)], None);
    assert_eq!(code(&old), Some(0));
    assert!(fake.stub.requests().is_empty());
    // The daily sweep's event (`hookspool enqueue ... '{"sweep": true}'`) looks anyway.
    let sweep = i.run(3, OWNER, &[json!({"sweep": true})], None);
    assert_eq!(code(&sweep), Some(0), "{}", stderr(&sweep));
    assert_eq!(emits(&sweep).len(), 3, "what the pushes missed");
    assert_eq!(i.state()["history_id"], "1010");
}

#[test]
fn gmail_sigkill_after_the_state_apply_retries_without_asking_google_again() {
    let fake = Fake::start();
    fake.api(gmail_api);
    let (i, _) = gmail_instance(&fake);
    assert_eq!(code(&i.run(1, OWNER, &[push(1000)], None)), Some(0));
    let out = i.run(2, OWNER, &[push(1010)], Some("processor.after_apply"));
    assert!(killed(&out.status));
    assert_eq!(i.state()["history_id"], "1010", "applied before the kill");
    let asked = fake.stub.requests().len();
    let retry = i.run(2, OWNER, &[push(1010)], None);
    assert_eq!(code(&retry), Some(0));
    assert_eq!(emits(&retry).len(), 3);
    assert_eq!(
        fake.stub.requests().len(),
        asked,
        "the journal answered, not Google"
    );
}

#[test]
fn gmail_a_too_old_history_id_resynchronises_without_announcing() {
    let fake = Fake::start();
    fake.api(gmail_api);
    let (i, _) = gmail_instance(&fake);
    assert_eq!(code(&i.run(1, OWNER, &[push(1000)], None)), Some(0));
    // Gmail answers 404 for a startHistoryId outside its history ("Synchronize clients").
    fake.force(
        "/history",
        google_error(
            404,
            "notFound",
            "Requested entity was not found.",
            "NOT_FOUND",
        ),
    );
    let out = i.run(2, OWNER, &[push(1010)], None);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    assert!(emits(&out).is_empty());
    assert_eq!(
        i.state()["history_id"],
        "5000",
        "the profile's current history id"
    );
    assert!(stderr(&out).contains("resynchronised without announcing"));
}

#[test]
fn google_expired_token_refreshed_401_refreshed_once_and_rotated_refresh_token_kept() {
    let fake = Fake::start();
    fake.api(gmail_api);
    let (i, cred) = gmail_instance(&fake);
    let cred_before = std::fs::read(&cred).unwrap();
    assert_eq!(code(&i.run(1, OWNER, &[push(1000)], None)), Some(0));
    {
        let mut t = fake.tokens.lock().unwrap();
        // Two seconds: used for the rest of this run, refreshed after a second.
        t.expires_in = 2;
        t.rotate_next = Some("SENTINEL-rotated-1".into());
    }
    let a = i.run(2, OWNER, &[push(1020)], None);
    assert_eq!(code(&a), Some(0), "{}", stderr(&a));
    assert_eq!(
        fake.token_requests().len(),
        1,
        "one refresh serves the whole run"
    );
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let b = i.run(3, OWNER, &[push(1030)], None);
    assert_eq!(code(&b), Some(0), "{}", stderr(&b));
    let tokens = fake.token_requests();
    assert_eq!(tokens.len(), 2, "the expired token was refreshed");
    assert_eq!(tokens[0].form("refresh_token").as_deref(), Some(REFRESH));
    assert_eq!(
        tokens[1].form("refresh_token").as_deref(),
        Some("SENTINEL-rotated-1"),
        "the rotated refresh token is used from then on"
    );
    assert_eq!(
        std::fs::read(&cred).unwrap(),
        cred_before,
        "never written back to the file"
    );
    let runtime = i.state_dir.join("runtime.json");
    assert_eq!(
        std::fs::metadata(&runtime).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // A 401 to a token the cache still thinks valid: one refresh, then the call succeeds.
    fake.tokens.lock().unwrap().expires_in = 3599;
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let long_lived = i.run(4, OWNER, &[push(1035)], None);
    assert_eq!(code(&long_lived), Some(0), "{}", stderr(&long_lived));
    fake.tokens.lock().unwrap().valid.clear();
    fake.stub.clear();
    let c = i.run(40, OWNER, &[push(1040)], None);
    assert_eq!(code(&c), Some(0), "{}", stderr(&c));
    assert_eq!(fake.token_requests().len(), 1);
    let api = fake.api_requests();
    assert!(
        api.len() >= 2 && api[0].bearer() != api[1].bearer(),
        "retried with the new token"
    );

    // A revoked refresh token is the operator's to fix: 78 (config) with a fixed reason.
    {
        let mut t = fake.tokens.lock().unwrap();
        t.accepted_refresh.clear();
        t.valid.clear();
    }
    let d = i.run(5, OWNER, &[push(1050)], None);
    assert_eq!(code(&d), Some(78), "{}", stderr(&d));
    assert!(stderr(&d).contains("invalid_grant"));
    assert_no_sentinel(&[&a, &b, &long_lived, &c, &d]);
}

#[test]
fn google_5xx_and_429_are_retried_and_403_is_config() {
    let fake = Fake::start();
    fake.api(gmail_api);
    let (i, _) = gmail_instance(&fake);
    assert_eq!(code(&i.run(1, OWNER, &[push(1000)], None)), Some(0));

    fake.force(
        "/history",
        google_error(503, "backendError", "Backend Error", "UNAVAILABLE"),
    );
    let out = i.run(2, OWNER, &[push(1010)], None);
    assert_eq!(code(&out), Some(75), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    assert_eq!(i.state()["history_id"], "1000", "nothing advanced");
    // The retry of the same batch (the dispatcher's backoff) succeeds.
    let retry = i.run(2, OWNER, &[push(1010)], None);
    assert_eq!(code(&retry), Some(0), "{}", stderr(&retry));
    assert_eq!(emits(&retry).len(), 3);

    // A short Retry-After is waited out inside the request; a long one is the retry's hint.
    fake.force(
        "/history",
        google_error(
            429,
            "rateLimitExceeded",
            "Rate Limit Exceeded",
            "RESOURCE_EXHAUSTED",
        )
        .header("Retry-After", "1"),
    );
    let out = i.run(3, OWNER, &[push(1020)], None);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    fake.force(
        "/history",
        google_error(
            429,
            "rateLimitExceeded",
            "Rate Limit Exceeded",
            "RESOURCE_EXHAUSTED",
        )
        .header("Retry-After", "120"),
    );
    let out = i.run(4, OWNER, &[push(1030)], None);
    assert_eq!(code(&out), Some(75));
    assert!(
        stderr(&out).contains("retry after 120 s"),
        "{}",
        stderr(&out)
    );

    // Google's 403 rate limit is a retry; a 403 for a missing scope needs a person.
    fake.force(
        "/history",
        google_error(
            403,
            "userRateLimitExceeded",
            "User Rate Limit Exceeded",
            "PERMISSION_DENIED",
        ),
    );
    let out = i.run(5, OWNER, &[push(1040)], None);
    assert_eq!(code(&out), Some(75), "{}", stderr(&out));
    fake.force(
        "/history",
        google_error(
            403,
            "insufficientPermissions",
            "Request had insufficient authentication scopes.",
            "PERMISSION_DENIED",
        ),
    );
    let out = i.run(6, OWNER, &[push(1050)], None);
    assert_eq!(code(&out), Some(78), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("403 insufficientPermissions"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn google_a_credential_naming_another_token_host_is_refused() {
    let fake = Fake::start();
    fake.api(gmail_api);
    let (mut i, _) = gmail_instance(&fake);
    i.secret_file(
        "cred_owner",
        &json!({"client_id": "c", "client_secret": CLIENT_SECRET, "refresh_token": REFRESH,
                "token_uri": "https://attacker.example/token"})
        .to_string(),
    );
    // Refused when the credential is read, before any request, even the silent baseline.
    let out = i.run(1, OWNER, &[push(1000)], None);
    assert_eq!(code(&out), Some(78));
    assert!(stderr(&out).contains("token_uri is not the provider's token endpoint"));
    assert!(fake.token_requests().is_empty(), "the secret never left");
    assert_no_sentinel(&[&out]);
}

// ---------------------------------------------------------------- calendar

/// A watch-channel notification as the calendar source stores it.
fn channel(state: &str, n: u64) -> Value {
    json!({"channel_id": "chan-1", "message_number": n.to_string(), "resource_id": "res-1",
           "resource_state": state, "resource_uri": "https://www.googleapis.com/calendar/v3/calendars/owner@example.com/events"})
}

/// events.list: a full sync in two pages ending in nextSyncToken s1; from s1, two pages of
/// changes ending in s2; from s2 (when told) 410 fullSyncRequired.
pub fn calendar_api(r: &Req) -> Resp {
    if !r
        .path
        .ends_with("/calendar/v3/calendars/owner@example.com/events")
    {
        return Resp::json(404, json!({}));
    }
    let event = |id: &str, status: &str, summary: &str| {
        json!({"kind": "calendar#event", "id": id,
        "status": status, "summary": summary, "updated": "2026-05-01T08:00:00.000Z",
        "start": {"dateTime": "2026-05-04T10:00:00+02:00", "timeZone": "Europe/Berlin"},
        "end": {"dateTime": "2026-05-04T11:00:00+02:00", "timeZone": "Europe/Berlin"},
        "htmlLink": "https://www.google.com/calendar/event?eid=x"})
    };
    let page = |items: Vec<Value>, next: (&str, &str)| {
        let mut v = json!({"kind": "calendar#events", "summary": OWNER, "timeZone": "Europe/Berlin",
            "updated": "2026-05-01T08:00:00.000Z", "accessRole": "owner", "items": items});
        v[next.0] = json!(next.1);
        Resp::json(200, v)
    };
    match (r.q("syncToken"), r.q("pageToken")) {
        (None, None) => page(
            vec![event("old1", "confirmed", "old")],
            ("nextPageToken", "full-2"),
        ),
        (None, Some("full-2")) => page(
            vec![event("old2", "confirmed", "old")],
            ("nextSyncToken", "s1"),
        ),
        (Some("s1"), None) => page(
            vec![
                event("e1", "confirmed", "Planning"),
                json!({"kind": "calendar#event", "id": "e2", "status": "cancelled"}),
            ],
            ("nextPageToken", "inc-2"),
        ),
        (Some("s1"), Some("inc-2")) => page(
            vec![event("e3", "tentative", "Review")],
            ("nextSyncToken", "s2"),
        ),
        (Some("s2"), None) => Resp::json(
            410,
            json!({"error": {"errors": [{"domain": "global",
            "reason": "fullSyncRequired", "message": "Sync token is no longer valid, a full sync is required."}],
            "code": 410, "message": "Sync token is no longer valid, a full sync is required."}}),
        ),
        _ => Resp::json(400, json!({})),
    }
}

#[test]
fn calendar_sync_token_paging_changed_items_and_410_resync() {
    let fake = Fake::start();
    fake.api(calendar_api);
    let (mut i, _) = instance(&fake, "calendar");
    i.settings = json!({"owner": OWNER, "tz": "Europe/Berlin"});
    i.routes = json!({"changed": "hermes:calendar"});

    let sync = i.run(1, "chan-1", &[channel("sync", 1)], None);
    assert_eq!(code(&sync), Some(0), "{}", stderr(&sync));
    assert!(
        emits(&sync).is_empty() && fake.stub.requests().is_empty(),
        "sync is acknowledged"
    );

    let first = i.run(2, "chan-1", &[channel("exists", 2)], None);
    assert_eq!(code(&first), Some(0), "{}", stderr(&first));
    assert!(
        emits(&first).is_empty(),
        "the full sync sets the baseline silently"
    );
    assert_eq!(i.state()["sync_token"], "s1");

    let next = i.run(
        3,
        "chan-1",
        &[channel("exists", 3), channel("exists", 4)],
        None,
    );
    assert_eq!(code(&next), Some(0), "{}", stderr(&next));
    let e = emits(&next);
    let ids: Vec<&str> = e
        .iter()
        .map(|x| x["payload"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["e1", "e2", "e3"], "in order, over two pages");
    assert_eq!(e[0]["destination"], "hermes:calendar");
    assert_eq!(e[0]["event_type"], "changed");
    let p = &e[0]["payload"];
    assert_eq!(p["summary"], "Planning");
    assert_eq!(p["status"], "confirmed");
    assert_eq!(p["start"]["dateTime"], "2026-05-04T10:00:00+02:00");
    assert_eq!(p["updated"], "2026-05-01T08:00:00.000Z");
    assert!(p.get("htmlLink").is_none(), "only the item's fields");
    assert_eq!(e[1]["payload"]["status"], "cancelled");
    assert_eq!(i.state()["sync_token"], "s2");

    let gone = i.run(4, "chan-1", &[channel("exists", 5)], None);
    assert_eq!(code(&gone), Some(0), "{}", stderr(&gone));
    assert!(
        emits(&gone).is_empty(),
        "410: a full resync, nothing re-announced"
    );
    assert_eq!(i.state()["sync_token"], "s1");
    assert!(stderr(&gone).contains("full resync"));

    fake.force(
        "/events",
        google_error(500, "backendError", "Backend Error", "INTERNAL"),
    );
    let out = i.run(5, "chan-1", &[channel("exists", 6)], None);
    assert_eq!(code(&out), Some(75));
    assert_no_sentinel(&[&sync, &first, &next, &gone, &out]);
}

// ---------------------------------------------------------------- drive

/// changes.getStartPageToken answers 100 (then 200); changes.list from 100 gives two pages
/// ending in newStartPageToken 105; a token of 105 is rejected with Drive's 400 naming
/// pageToken.
pub fn drive_api(r: &Req) -> Resp {
    if r.path.ends_with("/drive/v3/changes/startPageToken") {
        return Resp::json(
            200,
            json!({"kind": "drive#startPageToken", "startPageToken": "100"}),
        );
    }
    if !r.path.ends_with("/drive/v3/changes") {
        return Resp::json(404, json!({}));
    }
    let change = |id: &str, removed: bool| {
        let mut c = json!({"kind": "drive#change", "changeType": "file", "removed": removed,
            "fileId": id, "time": "2026-05-01T08:00:00.000Z"});
        if !removed {
            c["file"] = json!({"kind": "drive#file", "id": id, "name": format!("{id}.txt"),
                "mimeType": "text/plain", "modifiedTime": "2026-05-01T07:59:00.000Z", "trashed": false});
        }
        c
    };
    match r.q("pageToken") {
        Some("100") => Resp::json(
            200,
            json!({"kind": "drive#changeList", "nextPageToken": "101",
            "changes": [change("f1", false), change("f2", true)]}),
        ),
        Some("101") => Resp::json(
            200,
            json!({"kind": "drive#changeList", "newStartPageToken": "105",
            "changes": [change("f3", false),
                        {"kind": "drive#change", "changeType": "drive", "driveId": "d1", "removed": false}]}),
        ),
        _ => Resp::json(
            400,
            json!({"error": {"code": 400, "message": "Invalid Value", "errors": [{
            "domain": "global", "reason": "invalid", "message": "Invalid Value",
            "locationType": "parameter", "location": "pageToken"}]}}),
        ),
    }
}

#[test]
fn drive_start_page_token_paging_changed_items_and_rejected_token_resync() {
    let fake = Fake::start();
    fake.api(drive_api);
    let (mut i, _) = instance(&fake, "drive");
    i.settings = json!({"owner": OWNER});
    i.routes = json!({"changed": "hermes:drive"});

    let first = i.run(1, "chan-1", &[channel("change", 1)], None);
    assert_eq!(code(&first), Some(0), "{}", stderr(&first));
    assert!(emits(&first).is_empty());
    assert_eq!(i.state()["page_token"], "100");

    let next = i.run(2, "chan-1", &[channel("change", 2)], None);
    assert_eq!(code(&next), Some(0), "{}", stderr(&next));
    let e = emits(&next);
    let ids: Vec<&str> = e
        .iter()
        .map(|x| x["payload"]["fileId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["f1", "f2", "f3"], "file changes only, in order");
    let p = &e[0]["payload"];
    assert_eq!(
        (p["name"].as_str(), p["mimeType"].as_str()),
        (Some("f1.txt"), Some("text/plain"))
    );
    assert_eq!(p["modifiedTime"], "2026-05-01T07:59:00.000Z");
    assert_eq!(p["removed"], false);
    assert_eq!(e[1]["payload"]["removed"], true);
    assert_eq!(i.state()["page_token"], "105");
    let list = fake
        .api_requests()
        .into_iter()
        .find(|r| r.q("pageToken") == Some("100"))
        .unwrap();
    assert_eq!(list.q("includeRemoved"), Some("true"));
    assert!(list.q("fields").is_some_and(|f| f.contains("modifiedTime")));

    let rejected = i.run(3, "chan-1", &[channel("change", 3)], None);
    assert_eq!(code(&rejected), Some(0), "{}", stderr(&rejected));
    assert!(emits(&rejected).is_empty());
    assert_eq!(
        i.state()["page_token"],
        "100",
        "a new start token, nothing announced"
    );

    fake.force(
        "/changes",
        google_error(
            429,
            "rateLimitExceeded",
            "Rate Limit Exceeded",
            "RESOURCE_EXHAUSTED",
        ),
    );
    let out = i.run(4, "chan-1", &[channel("change", 4)], None);
    assert_eq!(code(&out), Some(75));
    assert_no_sentinel(&[&first, &next, &rejected, &out]);
}

// ---------------------------------------------------------------- hooks (spec 14.3.6)

/// A hooks program (issue 29) that records each call's input in `calls.jsonl` beside it and
/// answers from the hook's name: gmail's `classify` gives a message from ann@ the values
/// `who = ann` (no output) and has no opinion on the rest; calendar's `travel` proposes a
/// block for the event called Planning.
const HOOKS_SH: &str = r#"#!/bin/sh
input=$(cat)
printf '%s\n' "$input" >> "$(dirname "$0")/calls.jsonl"
# serde_json writes keys sorted: args (day_events, then event), hook, instance, settings.
case "$input" in
  *'"hook":"classify"'*)
    case "$input" in *ann@example.com*) printf '{"values":{"who":"ann"}}' ;; *) printf 'null' ;; esac ;;
  *'"event":{'*'"id":"e1"'*'"hook":"travel"'*) printf '{"before_minutes":30}' ;;
  *) printf 'null' ;;
esac
"#;

fn hooks_program(i: &Instance) -> PathBuf {
    let dir = i.root().join("hooks");
    std::fs::create_dir(&dir).unwrap();
    let p = dir.join("hooks.sh");
    std::fs::write(&p, HOOKS_SH).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn hook_calls(program: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(program.with_file_name("calls.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn gmail_calls_the_hooks_classify_before_its_own_rules() {
    let fake = Fake::start();
    fake.api(gmail_api);
    let (mut i, _) = gmail_instance(&fake);
    let program = hooks_program(&i);
    i.settings["hooks"] = json!(program);
    let first = i.run(1, OWNER, &[push(1000)], None);
    assert_eq!(code(&first), Some(0), "{}", stderr(&first));
    let second = i.run(2, OWNER, &[push(1010)], None);
    assert_eq!(code(&second), Some(0), "{}", stderr(&second));
    let calls = hook_calls(&program);
    let ids: Vec<&str> = calls
        .iter()
        .map(|c| c["args"]["message"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m1", "m2"], "one classify per message: {calls:#?}");
    assert_eq!(calls[0]["hook"], "classify");
    assert_eq!(calls[0]["args"]["account"], OWNER);
    assert_eq!(calls[0]["instance"], "gmail");
    let e = emits(&second);
    let m1 = &e[0]["payload"];
    assert_eq!(m1["id"], "m1");
    assert_eq!(
        m1["rules"][0],
        json!({"rule": "hooks/classify", "values": {"who": "ann"}}),
        "the hook's match comes before the rules': {m1:#}"
    );
    assert_eq!(m1["rules"][1]["rule"], "scheduling/availability");
    let m2 = e.iter().find(|x| x["payload"]["id"] == "m2").unwrap();
    assert_eq!(
        m2["payload"]["rules"][0]["rule"], "invoice",
        "null: the rules alone"
    );
}

#[test]
fn calendar_calls_the_hooks_travel_for_each_changed_event() {
    let fake = Fake::start();
    fake.api(calendar_api);
    let (mut i, _) = instance(&fake, "calendar");
    let program = hooks_program(&i);
    i.settings = json!({"owner": OWNER, "tz": "Europe/Berlin", "hooks": program});
    i.routes = json!({"changed": "hermes:calendar"});
    let first = i.run(1, "chan-1", &[channel("exists", 1)], None);
    assert_eq!(code(&first), Some(0), "{}", stderr(&first));
    let next = i.run(2, "chan-1", &[channel("exists", 2)], None);
    assert_eq!(code(&next), Some(0), "{}", stderr(&next));
    let calls = hook_calls(&program);
    let ids: Vec<&str> = calls
        .iter()
        .map(|c| c["args"]["event"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["e1", "e3"], "not for the cancelled e2: {calls:#?}");
    assert_eq!(calls[0]["hook"], "travel");
    let day: Vec<&str> = calls[0]["args"]["day_events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(day, ["e3"], "the batch's other events of that day");
    let e = emits(&next);
    assert_eq!(e[0]["payload"]["travel"], json!({"before_minutes": 30}));
    assert!(e[2]["payload"].get("travel").is_none(), "null: no block");
}
