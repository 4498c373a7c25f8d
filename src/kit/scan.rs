//! What must not be in a bobbin's captures and test values (spec 14.3.5, the captures row):
//! secret-looking values (live credentials of well-known shapes) and real-looking personal
//! data (mail addresses outside the reserved example domains, phone numbers outside the
//! fictional ranges).
//!
//! Owns: [`secret_looking`] and [`personal_data`], one line at a time, each returning what
//! to write instead. The rules, so a contributor knows how to redact:
//! * credentials: a token of 16+ characters after a live prefix ([`LIVE_PREFIXES`]), an
//!   AWS access key id, or a PEM private key;
//! * mail: only `@example.com/.org/.net` (and their subdomains) and `.test`, `.example`,
//!   `.invalid`, `.localhost` domains, or a `noreply`/`no-reply` address; `git@host:path`
//!   (an SSH URL) is not an address;
//! * phones: `+1 NPA 555 xxxx` and `+44 7700 900xxx` (the fictional ranges); any other
//!   `+<10-15 digits>` is refused. Form bodies are read with `%40` as `@` and `%2B` as `+`.
//!
//! Must not: print the value it found (a finding names the kind and the line only).

/// Prefixes of live credentials of well-known providers.
pub const LIVE_PREFIXES: &[&str] = &[
    "sk_live_",
    "rk_live_",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxr-",
    "xapp-",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "github_pat_",
    "glpat-",
    "shpat_",
    "shpss_",
    "AIza",
    "ya29.",
];

/// A credential is at least this long after its prefix.
const TOKEN_CHARS_MIN: usize = 16;
/// E.164: at most 15 digits; shorter than 10 is not a full number.
const PHONE_DIGITS_MIN: usize = 10;
const PHONE_DIGITS_MAX: usize = 15;

const RESERVED_MAIL_DOMAINS: &[&str] = &["example.com", "example.org", "example.net"];
const RESERVED_MAIL_TLDS: &[&str] = &["test", "example", "invalid", "localhost"];

fn token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// A live-looking credential on this line: what kind, and what to write instead.
pub fn secret_looking(line: &str) -> Option<String> {
    if line.contains("-----BEGIN") && line.contains("PRIVATE KEY") {
        return Some("a private key; use a key made for the test and keep it out of captures (a published test vector's key goes in captures/kit.toml)".into());
    }
    for p in LIVE_PREFIXES {
        for (i, _) in line.match_indices(p) {
            let before_ok = line[..i].chars().next_back().is_none_or(|c| !token_char(c));
            let rest = line[i + p.len()..]
                .chars()
                .take_while(|c| token_char(*c))
                .count();
            if before_ok && rest >= TOKEN_CHARS_MIN {
                return Some(format!(
                    "a value shaped like a live {p}... credential; replace it with a made-up test value (e.g. {p}test...) or the provider's published test vector"
                ));
            }
        }
    }
    for (i, _) in line.match_indices("AKIA") {
        let id: String = line[i..].chars().take(20).collect();
        if id.len() == 20
            && id
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        {
            return Some("a value shaped like an AWS access key id; use AKIAIOSFODNN7EXAMPLE, AWS's documented example".into());
        }
    }
    None
}

/// Real-looking personal data on this line: what kind, and what to write instead.
pub fn personal_data(line: &str) -> Option<String> {
    let decoded = line
        .replace("%40", "@")
        .replace("%2B", "+")
        .replace("%2b", "+");
    if let Some(domain) = real_mail_domain(&decoded) {
        return Some(format!(
            "a mail address at {domain}; redact it to a name at example.com"
        ));
    }
    if real_phone(&decoded) {
        return Some("a phone number outside the fictional ranges; redact it to +1 202 555 01xx (or +44 7700 900xxx)".into());
    }
    None
}

fn real_mail_domain(line: &str) -> Option<String> {
    let chars: Vec<char> = line.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if *c != '@' {
            continue;
        }
        let local: String = chars[..i]
            .iter()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '%' | '+' | '-'))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let domain: String = chars[i + 1..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
            .collect();
        let domain = domain.trim_end_matches('.').to_ascii_lowercase();
        let after = chars.get(i + 1 + domain.len());
        if local.is_empty() || !domain.contains('.') || after == Some(&':') {
            continue;
        }
        let lower = format!("{}@{domain}", local.to_ascii_lowercase());
        if lower.contains("noreply") || lower.contains("no-reply") {
            continue;
        }
        let tld = domain.rsplit('.').next().unwrap_or_default();
        let reserved = RESERVED_MAIL_TLDS.contains(&tld)
            || RESERVED_MAIL_DOMAINS
                .iter()
                .any(|d| domain == *d || domain.ends_with(&format!(".{d}")));
        if !reserved {
            return Some(domain);
        }
    }
    None
}

fn real_phone(line: &str) -> bool {
    let chars: Vec<char> = line.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if *c != '+' {
            continue;
        }
        let boundary = i == 0
            || matches!(
                chars[i - 1],
                ' ' | '"' | '\'' | '=' | ':' | '(' | ',' | '[' | '\t'
            );
        if !boundary {
            continue;
        }
        let digits: String = chars[i + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        let next = chars.get(i + 1 + digits.len());
        if next.is_some_and(|c| c.is_ascii_alphanumeric()) {
            continue;
        }
        if !(PHONE_DIGITS_MIN..=PHONE_DIGITS_MAX).contains(&digits.len()) {
            continue;
        }
        let fictional_us = digits.len() == 11 && digits.starts_with('1') && &digits[4..7] == "555";
        let fictional_uk = digits.starts_with("447700900");
        if !fictional_us && !fictional_uk {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_live_credentials() {
        assert!(secret_looking("Authorization: Bearer xoxb-1234567890-abcdefghijklmnop").is_some());
        assert!(secret_looking("key = \"sk_live_51HxxxxxxxxxxxxxxxxxxxYZ\"").is_some());
        assert!(secret_looking("AKIAABCDEFGHIJKLMNOP").is_some());
        assert!(secret_looking("-----BEGIN RSA PRIVATE KEY-----").is_some());
        // Test values and ordinary words pass.
        assert!(secret_looking("secret = \"It's a Secret to Everybody\"").is_none());
        assert!(secret_looking("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_none());
        assert!(secret_looking("sk_test_4eC39HqLyjWDarjtT1zdp7dc").is_none());
        assert!(secret_looking("the AKIA prefix").is_none());
        assert!(secret_looking("X-Hub-Signature-256: sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17").is_none());
    }

    #[test]
    fn scan_personal_mail() {
        assert!(personal_data("\"email\": \"jane.doe@gmail.com\"").is_some());
        assert!(personal_data("From=jane%40corp.co.uk").is_some());
        assert!(personal_data("\"email\": \"octocat@example.com\"").is_none());
        assert!(personal_data("\"email\": \"a@mail.example.org\"").is_none());
        assert!(personal_data("\"email\": \"x@shop.test\"").is_none());
        assert!(personal_data("\"email\": \"1+octocat@users.noreply.github.com\"").is_none());
        assert!(personal_data("\"ssh_url\": \"git@github.com:octo/hello.git\"").is_none());
    }

    #[test]
    fn scan_personal_phones() {
        assert!(personal_data("From=%2B14158675309&Body=hi").is_some());
        assert!(personal_data("\"phone\": \"+33612345678\"").is_some());
        assert!(personal_data("From=%2B12025550123&Body=hi").is_none());
        assert!(personal_data("\"phone\": \"+447700900123\"").is_none());
        // Base64 signatures and offsets are not phone numbers.
        assert!(
            personal_data("X-Twilio-Signature: 0/KCTR6DLpKmkAf8muzZqo1nDgQ+1234567890Ab=")
                .is_none()
        );
        assert!(personal_data("\"at\": \"2024-01-01T00:00:00+0000\"").is_none());
    }
}
