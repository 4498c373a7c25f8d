//! The template source's signing recipe (`sources::recipe`): the `recipe = { ... }` table
//! parser on arbitrary TOML, then any recipe that parses checked against an arbitrary request.
//!
//! Input: up to four NUL-separated fields: the recipe table's TOML (the keys inside
//! `recipe`), a header block (`Name: value` lines, signature and timestamp headers
//! included), the body, and optionally the stored key (a public key for `ed25519` and
//! `ecdsa-p256`, so a seed carrying a provider's published vector reaches the signature
//! check); whatever follows a fourth NUL is ignored.
//!
//! Beyond "does not panic": parsing is deterministic; a parsed recipe verifies nothing
//! without a usable key (no candidates, or an empty one); the same request gives the same
//! verdict twice; and a request that verifies under the given key no longer verifies once
//! one byte of its body changes, for every recipe that covers the body (not a
//! `body_unsigned` one, which signs a timestamp and a token in body fields, as Mailgun does,
//! nor an audience-bound bearer token); for a signature in a body field, changing one
//! character of that field's value is refused too; and a request that verifies under a
//! recipe with a time window (`timestamp` and `tolerance_s`, wherever the timestamp is: a
//! header, a list entry, a field of the body such as Linear's `webhookTimestamp`, or a JWS
//! claim) is refused at a clock `2 * window + 1` s later or earlier (every window is
//! two-sided, and no timestamp verifies at both ends).

use hookspool::sources::recipe::Recipe;

pub fn check(data: &[u8]) {
    let mut fields = data.splitn(5, |b| *b == 0);
    let text = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let head = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let body = fields.next().unwrap_or_default();
    let given = fields.next().unwrap_or_default();
    let Ok(table) = text.parse::<toml::Table>() else {
        return;
    };
    let parsed = Recipe::parse(&table);
    assert_eq!(
        format!("{parsed:?}"),
        format!("{:?}", Recipe::parse(&table)),
        "parse is not deterministic"
    );
    let Ok(mut recipe) = parsed else { return };
    if recipe.signs_url() {
        recipe.callback_url = Some("https://hooks.example.org/hooks/fuzz".to_string());
    }
    let headers: Vec<(String, String)> = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let now = 1_700_000_000.0;
    for none in [&[][..], &[Vec::new()][..]] {
        assert!(
            !recipe.verifies("POST", header, body, now, none),
            "verified without a key"
        );
    }
    let key = vec![b"fuzz-SENTINEL-5e1f0c93".to_vec()];
    assert_eq!(
        recipe.verifies("POST", header, body, now, &key),
        recipe.verifies("POST", header, body, now, &key),
        "verify is not deterministic"
    );
    if given.is_empty() {
        return;
    }
    let key = vec![given.to_vec()];
    let now = header("X-Fuzz-Now")
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(now);
    let ok = recipe.verifies("POST", header, body, now, &key);
    assert_eq!(
        ok,
        recipe.verifies("POST", header, body, now, &key),
        "verify is not deterministic"
    );
    if ok && let Some(path) = &recipe.sig_field {
        let sig = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|d| {
                path.split('.')
                    .try_fold(&d, |v, s| v.get(s))
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            });
        if let Some(sig) = sig.filter(|s| !s.is_empty() && s.is_ascii()) {
            let quoted = format!("\"{sig}\"");
            if let Some(at) = body
                .windows(quoted.len())
                .position(|w| w == quoted.as_bytes())
            {
                let mut changed = body.to_vec();
                let i = at + 1;
                changed[i] = if changed[i] == b'0' { b'1' } else { b'0' };
                assert!(
                    !recipe.verifies("POST", header, &changed, now, &key),
                    "a changed body-field signature still verified"
                );
            }
        }
    }
    if ok && let Some(w) = recipe.window_s() {
        let past = 2.0 * w as f64 + 1.0;
        for at in [now + past, now - past] {
            assert!(
                !recipe.verifies("POST", header, body, at, &key),
                "verified {} s away from a time it verified at (window {w} s)",
                at - now
            );
        }
    }
    if ok && !body.is_empty() && recipe.covers_body() {
        let mut changed = body.to_vec();
        let last = changed.len() - 1;
        changed[last] ^= 0x01;
        assert!(
            !recipe.verifies("POST", header, &changed, now, &key),
            "a changed body still verified"
        );
    }
}

/// Whether a recipe input (the layout above, with its stored key) verifies at `now`: for the
/// tests of the hand-written seeds.
pub fn verifies_at(data: &[u8], now: f64) -> bool {
    let mut fields = data.splitn(5, |b| *b == 0);
    let text = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let head = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let body = fields.next().unwrap_or_default();
    let given = fields.next().unwrap_or_default();
    let Some(recipe) = text
        .parse::<toml::Table>()
        .ok()
        .and_then(|t| Recipe::parse(&t).ok())
    else {
        return false;
    };
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    };
    recipe.verifies("POST", header, body, now, &[given.to_vec()])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `hand-linear-body-timestamp`: Linear's vector (tests/vectors/linear) under the
    /// linear.webhooks recipe, whose timestamp is the signed body's `webhookTimestamp` in
    /// milliseconds: verified at its time and 60 s either side, refused 61 s either side.
    #[test]
    fn the_linear_seed_verifies_only_inside_its_window() {
        let data =
            std::fs::read(crate::seeds::corpus_dir("recipe").join("hand-linear-body-timestamp"))
                .expect("the seed");
        let t = 1_676_056_940.508;
        for now in [t, t + 60.0, t - 60.0] {
            assert!(verifies_at(&data, now), "{now}");
        }
        for now in [t + 61.0, t - 61.0] {
            assert!(!verifies_at(&data, now), "{now}");
        }
    }
}
