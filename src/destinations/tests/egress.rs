//! The egress policy through a real http destination (issue 35): a name that resolves into
//! each refused range is a `config` outcome naming the rule and no connection is made (the
//! loopback listener that name points at sees nothing); an answer that changes between the
//! check and the connect cannot slip through, since the address connected to is the one the
//! guard checked; an IP-literal URL is checked too; a redirect to a private address is not
//! followed; the allow-list admits exactly its blocks. Names resolve through a test
//! [`Lookup`] whose answers the test scripts; the sockets are real.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::receiver::{Receiver, Reply};
use super::{delivery, insecure};
use crate::destinations::http::StaticSecrets;
use crate::destinations::outcome::{Klass, OutcomeKind};
use crate::destinations::{HttpConfig, HttpDestination, TlsRoots};
use crate::egress::{Allow, Lookup, LookupFuture};

const SECRET: &str = "whsec_ZWdyZXNzLXRlc3Qtc2VjcmV0LWVncmVzcyE=";

/// Answers each lookup with the next of its scripted answers (the last repeats), and counts
/// the lookups.
struct Scripted {
    answers: Mutex<Vec<Vec<IpAddr>>>,
    lookups: AtomicUsize,
}

impl Scripted {
    fn new(answers: &[&[&str]]) -> Arc<Scripted> {
        Arc::new(Scripted {
            answers: Mutex::new(
                answers
                    .iter()
                    .map(|a| a.iter().map(|s| s.parse().unwrap()).collect())
                    .collect(),
            ),
            lookups: AtomicUsize::new(0),
        })
    }
}

impl Lookup for Scripted {
    fn lookup(&self, _host: &str) -> LookupFuture {
        let n = self.lookups.fetch_add(1, Ordering::SeqCst);
        let answers = self.answers.lock().unwrap();
        let a = answers[n.min(answers.len() - 1)].clone();
        Box::pin(async move { Ok(a) })
    }
}

fn dest(url: String, allow: Allow, lookup: Arc<Scripted>) -> HttpDestination {
    HttpDestination::with_lookup(
        HttpConfig {
            allow_private: allow,
            ..insecure(&url)
        },
        Arc::new(StaticSecrets(vec![SECRET.as_bytes().to_vec()])),
        TlsRoots::Platform,
        lookup,
    )
    .unwrap()
}

fn loopback_only() -> Allow {
    Allow::Blocks(vec!["127.0.0.1/32".parse().unwrap()])
}

#[tokio::test]
async fn a_name_in_each_refused_range_is_a_config_outcome_and_nothing_connects() {
    let rx = Receiver::start(vec![]).await;
    let port = rx.addr.port();
    for (ip, rule) in [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.20.30.40", "private"),
        ("172.16.5.4", "private"),
        ("192.168.0.10", "private"),
        ("fd00::7", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.251", "multicast"),
        ("ff02::1", "multicast"),
        ("100.64.12.34", "cgnat"),
    ] {
        let lookup = Scripted::new(&[&[ip]]);
        let d = dest(
            format!("http://receiver.test:{port}/in?token=SENTINEL"),
            Allow::None,
            lookup.clone(),
        );
        let o = d.deliver(&delivery("{}")).await;
        assert_eq!(
            (o.kind, o.klass),
            (OutcomeKind::Retry, Some(Klass::Config)),
            "{ip}: {o:?}"
        );
        assert_eq!(o.reason, format!("egress refused: {rule}"), "{ip}");
        let detail = format!("{o:?}");
        assert!(
            detail.contains(&format!("receiver.test resolves to {ip}")),
            "{detail}"
        );
        assert!(!detail.contains("SENTINEL"), "{detail}");
        assert_eq!(lookup.lookups.load(Ordering::SeqCst), 1, "{ip}");
    }
    assert_eq!(rx.connections(), 0, "no request left for a refused address");
    // An IP-literal URL never reaches a resolver: it is checked before sending.
    let lookup = Scripted::new(&[&["203.0.113.1"]]);
    let o = dest(rx.url("/in"), Allow::None, lookup.clone())
        .deliver(&delivery("{}"))
        .await;
    assert_eq!(o.reason, "egress refused: loopback", "{o:?}");
    assert_eq!(lookup.lookups.load(Ordering::SeqCst), 0);
    assert_eq!(rx.connections(), 0);
}

#[tokio::test]
async fn an_answer_that_changes_between_check_and_connect_is_caught_at_connect() {
    let rx = Receiver::start(vec![]).await;
    // The first lookup (a `check`, or a warm-up) says public; the connect's says loopback.
    let lookup = Scripted::new(&[&["203.0.113.9"], &["127.0.0.1"]]);
    let policy = crate::egress::Policy::default();
    let first = lookup.lookup("rebind.test").await.unwrap();
    assert!(
        policy.refused_of("rebind.test", &first).is_empty(),
        "the check saw a public address"
    );
    let d = dest(
        format!("http://rebind.test:{}/in", rx.addr.port()),
        Allow::None,
        lookup.clone(),
    );
    let o = d.deliver(&delivery("{}")).await;
    assert_eq!(
        (o.klass, o.reason.as_str()),
        (Some(Klass::Config), "egress refused: loopback"),
        "{o:?}"
    );
    assert_eq!(lookup.lookups.load(Ordering::SeqCst), 2);
    assert_eq!(rx.connections(), 0, "the rebinding answer reached nothing");
    // A mixed answer connects only to what the guard admitted: the public address here
    // (TEST-NET-3, unroutable) fails as transport, never as a delivery to loopback.
    let lookup = Scripted::new(&[&["127.0.0.1", "203.0.113.9"]]);
    let mut d = delivery("{}");
    d.deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    let o = dest(
        format!("http://mixed.test:{}/in", rx.addr.port()),
        Allow::None,
        lookup,
    )
    .deliver(&d)
    .await;
    assert_eq!(o.klass, Some(Klass::Transport), "{o:?}");
    assert_eq!(rx.connections(), 0);
}

#[tokio::test]
async fn the_allow_list_admits_its_blocks_and_a_redirect_to_a_private_address_is_not_followed() {
    // The redirect's target: a listener on 127.0.0.2 that counts connections.
    let inner = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let inner_addr = inner.local_addr().unwrap();
    let inner_hits = Arc::new(AtomicUsize::new(0));
    let hits = inner_hits.clone();
    tokio::spawn(async move {
        while inner.accept().await.is_ok() {
            hits.fetch_add(1, Ordering::SeqCst);
        }
    });
    let rx = Receiver::start(vec![
        Reply::status(200),
        Reply::status(302).header("Location", &format!("http://{inner_addr}/in")),
    ])
    .await;
    let lookup = Scripted::new(&[&["127.0.0.1"]]);
    let d = dest(
        format!("http://receiver.test:{}/in", rx.addr.port()),
        loopback_only(),
        lookup,
    );
    let o = d.deliver(&delivery("{}")).await;
    assert_eq!(o.kind, OutcomeKind::Ok, "admitted by 127.0.0.1/32: {o:?}");
    let o = d.deliver(&delivery("{}")).await;
    assert_ne!(o.kind, OutcomeKind::Ok, "a redirect is no delivery: {o:?}");
    assert_eq!(rx.requests().len(), 2);
    // 127.0.0.2 is outside the block: a name resolving there is refused.
    let lookup = Scripted::new(&[&["127.0.0.2"]]);
    let o = dest(
        format!("http://inner.test:{}/in", inner_addr.port()),
        loopback_only(),
        lookup,
    )
    .deliver(&delivery("{}"))
    .await;
    assert_eq!(o.reason, "egress refused: loopback", "{o:?}");
    // allow_private = true admits every range.
    let lookup = Scripted::new(&[&["127.0.0.1"]]);
    let o = dest(
        format!("http://receiver.test:{}/in", rx.addr.port()),
        Allow::All,
        lookup,
    )
    .deliver(&delivery("{}"))
    .await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{o:?}");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(
        inner_hits.load(Ordering::SeqCst),
        0,
        "nothing reached 127.0.0.2"
    );
}
