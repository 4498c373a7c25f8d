//! The manifest's `[provider]` table (spec 14.3.2): who runs the service and its developer
//! pages.
//!
//! Owns: the table's shape ([`Provider::from_table`], which `hookspool check` applies to
//! every manifest it loads: known keys, string values) and the conformance rules the kit's
//! provider row adds ([`Provider::audit`]: the required pages, every URL https on a public
//! host of its own, no placeholder). Loading reads the shape only, so a deployment's private
//! bobbin is never refused at start for a documentation link.
//!
//! Must not: fetch the pages (the advisory provider-links row would, with `--online`).

use std::net::IpAddr;

/// Hosts that are nobody's public host: the RFC 2606/6761 names.
const RESERVED_DOMAINS: &[&str] = &["example.com", "example.org", "example.net"];
const RESERVED_TLDS: &[&str] = &["test", "example", "invalid", "localhost", "local"];

/// Text that marks a value as not filled in yet.
const PLACEHOLDERS: &[&str] = &["TODO", "<", ">", "..."];

/// The `[provider]` keys, in the order `bobbin show` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProviderKey {
    Vendor,
    Product,
    Homepage,
    WebhookDocs,
    SignatureDocs,
    ApiDocs,
    NoPushNote,
    NoPushDocs,
}

impl ProviderKey {
    pub const ALL: [ProviderKey; 8] = [
        ProviderKey::Vendor,
        ProviderKey::Product,
        ProviderKey::Homepage,
        ProviderKey::WebhookDocs,
        ProviderKey::SignatureDocs,
        ProviderKey::ApiDocs,
        ProviderKey::NoPushNote,
        ProviderKey::NoPushDocs,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKey::Vendor => "vendor",
            ProviderKey::Product => "product",
            ProviderKey::Homepage => "homepage",
            ProviderKey::WebhookDocs => "webhook_docs",
            ProviderKey::SignatureDocs => "signature_docs",
            ProviderKey::ApiDocs => "api_docs",
            ProviderKey::NoPushNote => "no_push_note",
            ProviderKey::NoPushDocs => "no_push_docs",
        }
    }

    /// Keys whose value is a page address (the rest are display text).
    pub fn is_url(self) -> bool {
        !matches!(
            self,
            ProviderKey::Vendor | ProviderKey::Product | ProviderKey::NoPushNote
        )
    }

    fn parse(s: &str) -> Option<ProviderKey> {
        ProviderKey::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// A `[provider]` table of the right shape (values are strings, keys known).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provider {
    values: Vec<(ProviderKey, String)>,
}

/// What kind of bobbin the pages describe: the required pages differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderNeeds {
    /// A poll bobbin (14.4): api_docs and no_push_* instead of webhook and signature pages.
    pub poll: bool,
    /// The manifest declares a secret: signature_docs is required.
    pub has_secret: bool,
}

impl Provider {
    /// The shape rules, as (key, what to write instead) pairs.
    pub fn from_table(t: &toml::Table) -> Result<Provider, Vec<(String, String)>> {
        let mut values = Vec::new();
        let mut problems = Vec::new();
        for (k, v) in t {
            let Some(key) = ProviderKey::parse(k) else {
                problems.push((
                    k.clone(),
                    format!(
                        "not a [provider] key; remove it (the keys: {})",
                        ProviderKey::ALL.map(ProviderKey::as_str).join(", ")
                    ),
                ));
                continue;
            };
            match v.as_str() {
                Some(s) => values.push((key, s.to_string())),
                None => problems.push((
                    k.clone(),
                    format!(
                        "must be a string; write {k} = \"{}\"",
                        if key.is_url() {
                            "https://..."
                        } else {
                            "display name"
                        }
                    ),
                )),
            }
        }
        values.sort();
        if problems.is_empty() {
            Ok(Provider { values })
        } else {
            Err(problems)
        }
    }

    pub fn get(&self, key: ProviderKey) -> Option<&str> {
        self.values
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every key that is set, in [`ProviderKey::ALL`] order.
    pub fn entries(&self) -> impl Iterator<Item = (ProviderKey, &str)> {
        self.values.iter().map(|(k, v)| (*k, v.as_str()))
    }

    /// `provider:` in the documents' frontmatter: vendor and product joined by a space.
    pub fn display(&self) -> String {
        format!(
            "{} {}",
            self.get(ProviderKey::Vendor).unwrap_or_default(),
            self.get(ProviderKey::Product).unwrap_or_default()
        )
    }

    /// The kit's provider rules. Placeholders anywhere come back as ONE problem (keyed on
    /// the first such key) so a fresh scaffold reports one thing to do.
    pub fn audit(&self, needs: ProviderNeeds) -> Vec<(ProviderKey, String)> {
        let placeholders: Vec<ProviderKey> = self
            .entries()
            .filter(|(_, v)| is_placeholder(v))
            .map(|(k, _)| k)
            .collect();
        if let Some(first) = placeholders.first() {
            return vec![(
                *first,
                format!(
                    "[provider] still has placeholders ({}); write the provider's own names and its https developer pages, and the same in the three documents' frontmatter",
                    placeholders
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )];
        }
        let mut out = Vec::new();
        let mut required = vec![
            ProviderKey::Vendor,
            ProviderKey::Product,
            ProviderKey::Homepage,
        ];
        let refused: &[ProviderKey] = if needs.poll {
            required.extend([
                ProviderKey::ApiDocs,
                ProviderKey::NoPushNote,
                ProviderKey::NoPushDocs,
            ]);
            &[ProviderKey::WebhookDocs, ProviderKey::SignatureDocs]
        } else {
            required.push(ProviderKey::WebhookDocs);
            if needs.has_secret {
                required.push(ProviderKey::SignatureDocs);
            }
            &[ProviderKey::NoPushNote, ProviderKey::NoPushDocs]
        };
        for k in required {
            if self.get(k).is_none_or(|v| v.trim().is_empty()) {
                out.push((k, required_message(k)));
            }
        }
        for k in refused {
            if self.get(*k).is_some() {
                out.push((
                    *k,
                    format!(
                        "{} is for {}; remove it",
                        k.as_str(),
                        if needs.poll {
                            "a webhook bobbin, not a poll bobbin"
                        } else {
                            "a poll bobbin (a service with no push)"
                        }
                    ),
                ));
            }
        }
        for (k, v) in self.entries() {
            if k.is_url()
                && let Err(why) = check_url(v)
            {
                out.push((k, why));
            }
        }
        out
    }
}

fn required_message(k: ProviderKey) -> String {
    let example = match k {
        ProviderKey::Vendor => "vendor = \"GitHub\" (the provider's own spelling)",
        ProviderKey::Product => "product = \"Repository webhooks\"",
        ProviderKey::Homepage => "homepage = \"https://github.com/\"",
        ProviderKey::WebhookDocs => {
            "webhook_docs = \"https://...\" (the provider's page for the webhooks this bobbin receives)"
        }
        ProviderKey::SignatureDocs => {
            "signature_docs = \"https://...\" (the page that describes the signature or token; required with a secret)"
        }
        ProviderKey::ApiDocs => "api_docs = \"https://...\" (the API reference the poller reads)",
        ProviderKey::NoPushNote => "no_push_note = \"<one sentence: why the service has no push>\"",
        ProviderKey::NoPushDocs => {
            "no_push_docs = \"https://...\" (the provider's page showing there is no webhook or push)"
        }
    };
    format!("required; write {example}")
}

/// TODO, `<...>` or `...`: a value somebody still has to fill in.
pub fn is_placeholder(v: &str) -> bool {
    PLACEHOLDERS.iter().any(|p| v.contains(p))
}

/// The URL rules: https, a public DNS name (no IP literal, no reserved or local name).
pub fn check_url(text: &str) -> Result<(), String> {
    if is_placeholder(text) {
        return Err(format!(
            "{text:?} is a placeholder; write the provider's real https page"
        ));
    }
    let url = url::Url::parse(text)
        .map_err(|e| format!("{text:?} is not a URL ({e}); write https://<host>/<path>"))?;
    if url.scheme() != "https" {
        return Err(format!(
            "{text:?} is not https; write the https address of the page"
        ));
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.trim_end_matches('.').to_ascii_lowercase(),
        Some(url::Host::Ipv4(_) | url::Host::Ipv6(_)) => {
            return Err(format!(
                "{text:?} names an IP address; write the provider's public host name"
            ));
        }
        None => return Err(format!("{text:?} has no host; write https://<host>/<path>")),
    };
    // url accepts dotted-decimal shapes it could not read as IPv4 as names; refuse them too.
    if host.parse::<IpAddr>().is_ok() {
        return Err(format!(
            "{text:?} names an IP address; write the provider's public host name"
        ));
    }
    let tld = host.rsplit('.').next().unwrap_or(&host);
    let reserved = RESERVED_TLDS.contains(&tld)
        || RESERVED_DOMAINS
            .iter()
            .any(|d| host == *d || host.ends_with(&format!(".{d}")));
    if reserved || !host.contains('.') {
        return Err(format!(
            "{host} is not a public host of the provider (example, test, invalid and local names are refused); write the provider's own page"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(text: &str) -> Provider {
        Provider::from_table(&toml::from_str(text).expect("toml")).expect("shape")
    }

    const GOOD: &str = r#"
vendor = "GitHub"
product = "Repository webhooks"
homepage = "https://github.com/"
webhook_docs = "https://docs.github.com/en/webhooks"
signature_docs = "https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries"
"#;

    const WEBHOOK: ProviderNeeds = ProviderNeeds {
        poll: false,
        has_secret: true,
    };

    #[test]
    fn provider_good_table_passes() {
        assert_eq!(provider(GOOD).audit(WEBHOOK), vec![]);
        assert_eq!(provider(GOOD).display(), "GitHub Repository webhooks");
    }

    #[test]
    fn provider_values_must_be_strings_and_keys_known() {
        let e = Provider::from_table(&toml::from_str("vendor = 3\nowner = \"x\"").unwrap())
            .unwrap_err();
        assert_eq!(e.len(), 2);
        assert!(e.iter().any(|(k, m)| k == "vendor" && m.contains("string")));
        assert!(e.iter().any(|(k, m)| k == "owner" && m.contains("remove")));
    }

    #[test]
    fn provider_url_rules() {
        for bad in [
            "http://docs.github.com/x",
            "https://example.com/hooks",
            "https://docs.example.org/x",
            "https://api.test/x",
            "https://localhost/x",
            "https://hooks.invalid/",
            "https://127.0.0.1/x",
            "https://[::1]/x",
            "https://intranet/x",
            "https://TODO",
            "https://github.com/<org>",
            "https://github.com/...",
            "not a url",
        ] {
            assert!(check_url(bad).is_err(), "{bad} should be refused");
        }
        assert!(
            check_url("https://developer.atlassian.com/cloud/trello/guides/rest-api/webhooks/")
                .is_ok()
        );
    }

    #[test]
    fn provider_required_pages() {
        let p =
            provider("vendor = \"GitHub\"\nproduct = \"Repo\"\nhomepage = \"https://github.com/\"");
        let keys: Vec<ProviderKey> = p.audit(WEBHOOK).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            vec![ProviderKey::WebhookDocs, ProviderKey::SignatureDocs]
        );
        let no_secret = ProviderNeeds {
            poll: false,
            has_secret: false,
        };
        assert_eq!(p.audit(no_secret).len(), 1);
    }

    #[test]
    fn provider_poll_pages() {
        let poll = ProviderNeeds {
            poll: true,
            has_secret: false,
        };
        let keys: Vec<ProviderKey> = provider(GOOD)
            .audit(poll)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            keys,
            vec![
                ProviderKey::ApiDocs,
                ProviderKey::NoPushNote,
                ProviderKey::NoPushDocs,
                ProviderKey::WebhookDocs,
                ProviderKey::SignatureDocs
            ]
        );
    }

    #[test]
    fn provider_placeholders_are_one_problem() {
        let p = provider(
            "vendor = \"TODO\"\nproduct = \"TODO\"\nhomepage = \"https://TODO\"\nwebhook_docs = \"<docs>\"",
        );
        let a = p.audit(WEBHOOK);
        assert_eq!(a.len(), 1, "{a:?}");
        assert!(a[0].1.contains("vendor, product, homepage, webhook_docs"));
    }
}
