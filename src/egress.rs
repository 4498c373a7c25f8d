//! The egress policy (issue 35): every outbound request hookspool makes (http and hermes
//! destinations, processors' and pollers' HTTP, key fetches) goes through a client built
//! here, which refuses addresses in the loopback, private, link-local, unspecified,
//! multicast and carrier-grade NAT ranges unless the destination's allow-list
//! (`allow_private = true` or CIDRs) admits them, ignores proxy variables from the
//! environment and follows no redirect.
//!
//! How a rebinding answer is closed: names are resolved by [`Guard`], the client's only DNS
//! resolver, which checks every address the lookup returned and hands the connector only the
//! admitted ones; the connector connects to exactly those addresses and never resolves again.
//! So the address checked is the address connected to, whatever a second lookup (`check`'s,
//! or an attacker's DNS with a zero TTL) would say. A URL whose host is an IP literal is never
//! given to a resolver, so the callers check it with [`Policy::admit_url`] before sending.
//!
//! Lookups go through [`Lookup`]: the system's resolver (getaddrinfo, so `/etc/hosts`
//! counts) in production; tests may pass their own.
//!
//! Must not: log (callers turn a [`Refused`] into their outcome), or read config.

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;

/// The range a refused address falls in (the rule an issue names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    Loopback,
    Private,
    LinkLocal,
    Unspecified,
    Multicast,
    Cgnat,
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Loopback => "loopback",
            Rule::Private => "private",
            Rule::LinkLocal => "link-local",
            Rule::Unspecified => "unspecified",
            Rule::Multicast => "multicast",
            Rule::Cgnat => "cgnat",
        }
    }
}

/// The rule that refuses `ip` by default, if any. IPv4-mapped and IPv4-compatible IPv6
/// addresses are judged by their IPv4 address.
pub fn rule_of(ip: IpAddr) -> Option<Rule> {
    match ip {
        IpAddr::V4(v4) => rule_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return rule_v4(v4);
            }
            let s = v6.segments();
            // ::a.b.c.d (deprecated IPv4-compatible), but not :: and ::1.
            if s[..6] == [0; 6] && !(v6.is_unspecified() || v6.is_loopback()) {
                return rule_v4(Ipv4Addr::from((u128::from(v6) & 0xffff_ffff) as u32));
            }
            if v6.is_unspecified() {
                Some(Rule::Unspecified)
            } else if v6.is_loopback() {
                Some(Rule::Loopback)
            } else if v6.is_multicast() {
                Some(Rule::Multicast)
            } else if s[0] & 0xffc0 == 0xfe80 {
                Some(Rule::LinkLocal)
            } else if s[0] & 0xfe00 == 0xfc00 {
                // Unique local addresses, IPv6's private range (and site-local fec0::/10).
                Some(Rule::Private)
            } else if s[0] & 0xffc0 == 0xfec0 {
                Some(Rule::Private)
            } else {
                None
            }
        }
    }
}

fn rule_v4(v4: Ipv4Addr) -> Option<Rule> {
    let o = v4.octets();
    if o[0] == 0 {
        // 0.0.0.0/8: "this network", 0.0.0.0 connects to the host itself.
        Some(Rule::Unspecified)
    } else if v4.is_loopback() {
        Some(Rule::Loopback)
    } else if v4.is_private() {
        Some(Rule::Private)
    } else if v4.is_link_local() {
        Some(Rule::LinkLocal)
    } else if v4.is_multicast() || v4.is_broadcast() {
        Some(Rule::Multicast)
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        Some(Rule::Cgnat)
    } else {
        None
    }
}

/// An address block, `10.0.0.0/8` or `fd00::/8`; a bare address is a block of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match (self.net, ip) {
            (IpAddr::V4(_), IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => return false,
            },
            (_, ip) => ip,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let bad = || {
            format!(
                "{s:?} is not an address block; write e.g. \"127.0.0.1/32\", \"10.0.0.0/8\" or \"fd00::/8\""
            )
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(bad)?,
            None => max,
        };
        Ok(Cidr { net, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// A destination's `allow_private`: `true` admits every refused range, an array of CIDRs
/// admits those blocks, `false` or nothing admits none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Allow {
    #[default]
    None,
    All,
    Blocks(Vec<Cidr>),
}

impl<'de> serde::Deserialize<'de> for Allow {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Allow, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(bool),
            Blocks(Vec<String>),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "allow_private: write true (every private range) or a list of address blocks, e.g. [\"127.0.0.1/32\"]",
            )
        })? {
            Raw::Flag(true) => Ok(Allow::All),
            Raw::Flag(false) => Ok(Allow::None),
            Raw::Blocks(b) => b
                .iter()
                .map(|s| s.parse::<Cidr>())
                .collect::<Result<Vec<_>, _>>()
                .map(Allow::Blocks)
                .map_err(|e| serde::de::Error::custom(format!("allow_private: {e}"))),
        }
    }
}

/// Loopback only, the IPv4 and the IPv6 one: Hermes' gateway's default allow-list.
pub fn loopback_only() -> Allow {
    Allow::Blocks(vec![
        Cidr {
            net: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
            prefix: 32,
        },
        Cidr {
            net: IpAddr::V6(Ipv6Addr::LOCALHOST),
            prefix: 128,
        },
    ])
}

/// An address the policy refused, with the rule. Its text names the address, the rule and
/// the key that would admit it, never a URL (a query string may hold a token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The name looked up, when there was one.
    pub host: Option<String>,
    pub ip: IpAddr,
    pub rule: Rule,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "egress refused ({}): ", self.rule.as_str())?;
        match &self.host {
            Some(h) => write!(f, "{h} resolves to {}", self.ip)?,
            None => write!(f, "{}", self.ip)?,
        }
        write!(
            f,
            ", a {} address, which the egress policy refuses; if the receiver really is there, admit it with allow_private = [\"{}/{}\"] (or true)",
            self.rule.as_str(),
            self.ip,
            if self.ip.is_ipv4() { 32 } else { 128 }
        )
    }
}

impl std::error::Error for Refused {}

/// What may be connected to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub allow: Allow,
}

impl Policy {
    pub fn new(allow: Allow) -> Policy {
        Policy { allow }
    }

    /// `Err` with the rule when `ip` is in a refused range the allow-list does not admit.
    pub fn admit(&self, ip: IpAddr) -> Result<(), Rule> {
        let Some(rule) = rule_of(ip) else {
            return Ok(());
        };
        match &self.allow {
            Allow::All => Ok(()),
            Allow::Blocks(b) if b.iter().any(|c| c.contains(ip)) => Ok(()),
            _ => Err(rule),
        }
    }

    /// The check for a URL whose host is an IP literal (never given to a resolver); a name
    /// passes here and is checked by [`Guard`] at connect time.
    pub fn admit_url(&self, url: &url::Url) -> Result<(), Refused> {
        let ip = match url.host() {
            Some(url::Host::Ipv4(a)) => IpAddr::V4(a),
            Some(url::Host::Ipv6(a)) => IpAddr::V6(a),
            _ => return Ok(()),
        };
        self.admit(ip).map_err(|rule| Refused {
            host: None,
            ip,
            rule,
        })
    }

    /// Every address of `addrs` this policy refuses, with its rule.
    pub fn refused_of(&self, host: &str, addrs: &[IpAddr]) -> Vec<Refused> {
        addrs
            .iter()
            .filter_map(|ip| {
                self.admit(*ip).err().map(|rule| Refused {
                    host: Some(host.to_string()),
                    ip: *ip,
                    rule,
                })
            })
            .collect()
    }
}

/// What `check` warns about: the addresses the URL's host is (an IP literal) or resolves
/// to now (the system's resolver, blocking) that the policy refuses. A name that does not
/// resolve gives none (the delivery's own error will say so).
pub fn refused_now(policy: &Policy, url: &url::Url) -> Vec<Refused> {
    if let Err(r) = policy.admit_url(url) {
        return vec![r];
    }
    let Some(url::Host::Domain(host)) = url.host() else {
        return Vec::new();
    };
    use std::net::ToSocketAddrs as _;
    let addrs: Vec<IpAddr> = match (host, 0).to_socket_addrs() {
        Ok(a) => a.map(|a| a.ip()).collect(),
        Err(_) => return Vec::new(),
    };
    let mut out = policy.refused_of(host, &addrs);
    out.dedup();
    out
}

/// A boxed lookup future.
pub type LookupFuture = Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>;

/// Name resolution; [`SystemLookup`] in production.
pub trait Lookup: Send + Sync {
    fn lookup(&self, host: &str) -> LookupFuture;
}

/// The system's resolver (getaddrinfo: `/etc/hosts`, then DNS).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(&self, host: &str) -> LookupFuture {
        let host = host.to_string();
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// The client's DNS resolver: looks the name up and passes on only the admitted addresses;
/// none admitted is a [`Refused`] error naming the first refused address's rule.
#[derive(Clone)]
pub struct Guard {
    policy: Policy,
    lookup: Arc<dyn Lookup>,
}

impl Guard {
    pub fn new(policy: Policy, lookup: Arc<dyn Lookup>) -> Guard {
        Guard { policy, lookup }
    }
}

impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        let policy = self.policy.clone();
        let lookup = self.lookup.lookup(&host);
        Box::pin(async move {
            let all = lookup.await?;
            let refused = policy.refused_of(&host, &all);
            let admitted: Vec<SocketAddr> = all
                .iter()
                .filter(|ip| policy.admit(**ip).is_ok())
                .map(|ip| SocketAddr::new(*ip, 0))
                .collect();
            match (admitted.is_empty(), refused.into_iter().next()) {
                (true, Some(r)) => Err(Box::new(r) as Box<dyn std::error::Error + Send + Sync>),
                _ => Ok(Box::new(admitted.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

/// A client builder with the policy: the guarding resolver, no proxy from the environment,
/// no redirect followed. Callers add their timeouts, TLS and user agent.
pub fn client_builder(policy: &Policy, lookup: Arc<dyn Lookup>) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(Guard::new(policy.clone(), lookup))
}

/// The [`Refused`] somewhere in a failed request's error chain, if that is why it failed.
pub fn refused_in(err: &(dyn std::error::Error + 'static)) -> Option<Refused> {
    let mut e: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(x) = e {
        if let Some(r) = x.downcast_ref::<Refused>() {
            return Some(r.clone());
        }
        e = x.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn each_range_has_its_rule_and_public_addresses_none() {
        for (a, r) in [
            ("127.0.0.1", Some(Rule::Loopback)),
            ("127.9.9.9", Some(Rule::Loopback)),
            ("::1", Some(Rule::Loopback)),
            ("10.1.2.3", Some(Rule::Private)),
            ("172.16.0.1", Some(Rule::Private)),
            ("172.31.255.255", Some(Rule::Private)),
            ("192.168.1.1", Some(Rule::Private)),
            ("fd12::1", Some(Rule::Private)),
            ("169.254.169.254", Some(Rule::LinkLocal)),
            ("fe80::1", Some(Rule::LinkLocal)),
            ("0.0.0.0", Some(Rule::Unspecified)),
            ("0.1.2.3", Some(Rule::Unspecified)),
            ("::", Some(Rule::Unspecified)),
            ("224.0.0.1", Some(Rule::Multicast)),
            ("255.255.255.255", Some(Rule::Multicast)),
            ("ff02::1", Some(Rule::Multicast)),
            ("100.64.0.1", Some(Rule::Cgnat)),
            ("100.127.255.254", Some(Rule::Cgnat)),
            ("::ffff:127.0.0.1", Some(Rule::Loopback)),
            ("::ffff:10.0.0.1", Some(Rule::Private)),
            ("::10.0.0.1", Some(Rule::Private)),
            ("100.128.0.1", None),
            ("172.32.0.1", None),
            ("8.8.8.8", None),
            ("203.0.113.7", None),
            ("2001:db8::1", None),
            ("::ffff:8.8.8.8", None),
        ] {
            assert_eq!(rule_of(ip(a)), r, "{a}");
        }
    }

    #[test]
    fn the_allow_list_admits_its_blocks_only() {
        let p = Policy::new(Allow::Blocks(vec![
            "127.0.0.1/32".parse().expect("cidr"),
            "10.0.0.0/8".parse().expect("cidr"),
            "fd00::/8".parse().expect("cidr"),
        ]));
        assert_eq!(p.admit(ip("127.0.0.1")), Ok(()));
        assert_eq!(p.admit(ip("::ffff:127.0.0.1")), Ok(()));
        assert_eq!(p.admit(ip("127.0.0.2")), Err(Rule::Loopback));
        assert_eq!(p.admit(ip("10.200.0.1")), Ok(()));
        assert_eq!(p.admit(ip("fd00::5")), Ok(()));
        assert_eq!(p.admit(ip("192.168.0.1")), Err(Rule::Private));
        assert_eq!(p.admit(ip("8.8.8.8")), Ok(()));
        let all = Policy::new(Allow::All);
        assert_eq!(all.admit(ip("169.254.169.254")), Ok(()));
        assert_eq!(
            Policy::default().admit(ip("169.254.169.254")),
            Err(Rule::LinkLocal)
        );
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("host/8".parse::<Cidr>().is_err());
        assert_eq!(
            "0.0.0.0/0"
                .parse::<Cidr>()
                .map(|c| c.contains(ip("1.2.3.4"))),
            Ok(true)
        );
    }

    #[test]
    fn allow_private_reads_a_flag_or_blocks() {
        #[derive(serde::Deserialize)]
        struct T {
            allow_private: Allow,
        }
        let t: T = toml::from_str("allow_private = true").expect("flag");
        assert_eq!(t.allow_private, Allow::All);
        let t: T = toml::from_str("allow_private = [\"127.0.0.1/32\"]").expect("blocks");
        assert_eq!(
            t.allow_private,
            Allow::Blocks(vec!["127.0.0.1/32".parse().expect("cidr")])
        );
        let e = toml::from_str::<T>("allow_private = [\"nope\"]")
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("not an address block"), "{e}");
    }

    #[test]
    fn a_refusal_names_the_rule_and_the_key_never_a_url() {
        let r = Policy::default()
            .admit_url(&url::Url::parse("http://10.0.0.7:8080/x?token=SENTINEL").expect("url"))
            .expect_err("private");
        let text = r.to_string();
        assert!(text.contains("a private address"), "{text}");
        assert!(text.contains("allow_private = [\"10.0.0.7/32\"]"), "{text}");
        assert!(!text.contains("SENTINEL") && !text.contains("/x"), "{text}");
        assert!(
            Policy::default()
                .admit_url(&url::Url::parse("http://example.org/").expect("url"))
                .is_ok()
        );
    }
}
