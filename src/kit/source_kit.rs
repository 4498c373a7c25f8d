//! The kit's source-kit row (spec 14.3.5): the bobbin's source, built by the config
//! pipeline from its kit instance, takes each capture at the capture's own time and does
//! what every `# expect:` line says; a copy of an accepted capture with one byte changed
//! where the credential covers it is refused; a timestamped one is refused just outside its
//! window on both sides.
//!
//! A kit is a directory under `captures/` that holds a `kit.toml` (its instance, test
//! secrets and stub answers) and the `.http` captures beside it: `captures/` itself, and
//! for `hookspool.webhook` one per `captures/schemes/<scheme>/`. The source is exactly the
//! one `hookspool run` would build: `[bobbins.<instance>]` with the kit's secrets as file
//! references, through `config::parse_with_catalog` (so the expansion and every check of
//! the expanded source apply), then `sources::build`; the test secrets are handed to it in
//! memory. Plaid's key service is the kit's `[stub.webhook_verification_key]`.
//!
//! Must not: read anything outside the bobbin directory, do network I/O, or print a secret
//! (findings name files, lines and fields, never a test value).

use std::sync::Arc;

use super::capture::{Capture, Expect, KIT_FILE, KitFile, Verdict as Want};
use super::{CAPTURES_DIR, KIT_HOME, KIT_SECRET_DIR};
use crate::bobbins::Finding;
use crate::bobbins::catalog::Catalog;
use crate::intake::answer::Said;
use crate::kit::signer::{KIT_NOW, KIT_SKEW_MARGIN_S, Kit as Signer, MapSecrets};
use crate::sources::recipe::Recipe;
use crate::sources::{self, Request, Source, Verdict};

/// The secret a signer kit is built with to read the source's flags (never sent).
const FLAGS_SECRET: &[u8] = b"hookspool-kit-flags";

/// The source-kit row's problems, and how many captures were checked.
pub(super) fn check(texts: &[(String, String)], catalog: &Catalog) -> (Vec<Finding>, usize) {
    let kits: Vec<&str> = texts
        .iter()
        .filter_map(|(f, _)| f.strip_suffix(&format!("/{KIT_FILE}")))
        .filter(|d| *d == CAPTURES_DIR || d.starts_with(&format!("{CAPTURES_DIR}/")))
        .collect();
    if !kits.contains(&CAPTURES_DIR) {
        return (
            vec![Finding::new(
                format!("{CAPTURES_DIR}/{KIT_FILE}"),
                0,
                "missing; the source kit needs the instance the captures go to and their test secrets: write instance = \"<name>\", [bobbin] (the [bobbins.<name>] table without secrets) and [secrets]",
            )],
            0,
        );
    }
    let mut problems = Vec::new();
    let mut checked = 0;
    for dir in kits {
        let (p, n) = check_kit(dir, texts, catalog);
        problems.extend(p);
        checked += n;
    }
    (problems, checked)
}

/// One kit directory: build its source, run its captures.
fn check_kit(dir: &str, texts: &[(String, String)], catalog: &Catalog) -> (Vec<Finding>, usize) {
    let file = format!("{dir}/{KIT_FILE}");
    let text = texts
        .iter()
        .find(|(f, _)| *f == file)
        .map(|(_, t)| t.as_str())
        .unwrap_or_default();
    // A kit.toml that does not parse is the captures row's finding.
    let Ok(kit) = KitFile::parse(&file, text) else {
        return (Vec::new(), 0);
    };
    let built = match build(&kit, catalog) {
        Ok(b) => b,
        Err(why) => {
            return (
                why.into_iter()
                    .map(|w| {
                        Finding::new(&file, 0, format!("the kit instance does not build: {w}"))
                    })
                    .collect(),
                0,
            );
        }
    };
    let mut problems = Vec::new();
    let mut checked = 0;
    for (f, cap) in direct_captures(texts, dir) {
        problems.extend(check_capture(f, &cap, &kit, &built));
        checked += 1;
    }
    (problems, checked)
}

/// A capture of `captures/` that the kit instance's source accepts: the event the intake
/// would store, the processor row's input.
pub(super) struct AcceptedCapture {
    pub file: String,
    pub request_line: usize,
    pub event: sources::Accepted,
}

/// Every capture directly in `captures/` that the kit's source accepts at its own time, in
/// file order. `Err` when the kit instance does not build (the source-kit row says why).
pub(super) fn accepted_captures(
    texts: &[(String, String)],
    kit: &KitFile,
    catalog: &Catalog,
) -> Result<Vec<AcceptedCapture>, Vec<String>> {
    let built = build(kit, catalog)?;
    let mut out = Vec::new();
    for (f, cap) in direct_captures(texts, CAPTURES_DIR) {
        let now = cap.at.map(|a| a as f64).unwrap_or(KIT_NOW);
        let Ok(req) = sources::parse_capture(&cap.request, now) else {
            continue;
        };
        if let Verdict::Accept(event) =
            sources::evaluate(built.source.as_ref(), &req, &built.secrets)
        {
            out.push(AcceptedCapture {
                file: f.to_string(),
                request_line: cap.request_line,
                event,
            });
        }
    }
    Ok(out)
}

/// The `.http` captures directly in `dir` that parse, in file order (one that does not
/// parse is the captures row's finding).
fn direct_captures<'a>(
    texts: &'a [(String, String)],
    dir: &str,
) -> impl Iterator<Item = (&'a str, Capture)> + 'a {
    let prefix = format!("{dir}/");
    texts.iter().filter_map(move |(f, t)| {
        let name = f.strip_prefix(&prefix)?;
        if name.contains('/') || !name.ends_with(".http") {
            return None;
        }
        Capture::parse(f, t).ok().map(|cap| (f.as_str(), cap))
    })
}

/// The kit's source as the config pipeline builds it, with its test secrets and flags.
struct Built {
    source: Arc<dyn Source>,
    secrets: MapSecrets,
    /// The credential covers the body (else it is a token in a header or the query).
    body_signed: bool,
    /// The scheme carries a timestamp, checked within ±`tolerance_s`.
    has_timestamp: bool,
    tolerance_s: u64,
}

fn build(kit: &KitFile, catalog: &Catalog) -> Result<Built, Vec<String>> {
    let root = kit.config_root(|n| format!("{KIT_SECRET_DIR}/{n}"));
    let text = toml::to_string(&root).map_err(|e| vec![e.to_string()])?;
    let inputs = crate::config::PathInputs {
        home_flag: Some(KIT_HOME.into()),
        ..Default::default()
    };
    let (config, _) = crate::config::parse_with_catalog(&text, None, &inputs, false, catalog)
        .map_err(|ps| ps.iter().map(|p| p.to_string()).collect::<Vec<_>>())?;
    let sc = config
        .sources
        .get(&kit.instance)
        .ok_or_else(|| vec![format!("no source {} after expansion", kit.instance)])?;
    let source = if sc.kind == "plaid" {
        plaid_with_stub(kit, sc)?
    } else {
        sources::build(&sc.name, &sc.kind, &sc.options).map_err(|e| vec![e.to_string()])?
    };
    let signer = if sc.kind == "template" {
        let options = toml::to_string(&sc.options).map_err(|e| vec![e.to_string()])?;
        Signer::template(&sc.name, &options, FLAGS_SECRET)
    } else {
        Signer::builtin(&sc.kind, FLAGS_SECRET)
    }
    .map_err(|e| vec![e.to_string()])?;
    let mut secrets = MapSecrets::new();
    for (name, value) in &kit.secrets {
        secrets = secrets.with(name, value.as_bytes());
    }
    // The kit's signer knows the named schemes only and takes a recipe for a token header,
    // so for a recipe the recipe says what the captures' matrix checks.
    let recipe = recipe_of(&sc.kind, &sc.options);
    let recipe_window_s = recipe.as_ref().and_then(Recipe::window_s);
    Ok(Built {
        source,
        secrets,
        body_signed: signer.flags.body_signed || recipe.as_ref().is_some_and(Recipe::covers_body),
        has_timestamp: signer.flags.has_timestamp || recipe_window_s.is_some(),
        tolerance_s: recipe_window_s.unwrap_or(signer.tolerance_s),
    })
}

/// A template source's signing recipe, if it has one. When it covers the body the captures'
/// tamper changes a body byte, which must be refused (a timestamp-and-token or bearer-token
/// recipe does not cover the body; its tamper changes the credential itself); when it checks
/// a time, a capture is refused just outside its window on both sides.
fn recipe_of(kind: &str, options: &toml::Table) -> Option<Recipe> {
    if kind != "template" {
        return None;
    }
    options
        .get("recipe")
        .and_then(toml::Value::as_table)
        .and_then(|t| Recipe::parse(t).ok())
}

/// Plaid fetches its verification key from Plaid's API; the kit's key service is the
/// `[stub.webhook_verification_key]` of kit.toml.
fn plaid_with_stub(
    kit: &KitFile,
    sc: &crate::config::SourceConfig,
) -> Result<Arc<dyn Source>, Vec<String>> {
    use crate::sources::plaid::{KeyCache, Plaid, PlaidJwk, StaticJwkFetcher};
    let jwk: PlaidJwk = kit
        .stub
        .webhook_verification_key
        .clone()
        .ok_or_else(|| vec!["write [stub.webhook_verification_key], the key Plaid's key service answers for the captures' kid".to_string()])?
        .try_into()
        .map_err(|e: toml::de::Error| vec![format!("[stub.webhook_verification_key] is not a JWK: {}", e.message())])?;
    let env = sc
        .options
        .get("env")
        .and_then(toml::Value::as_str)
        .unwrap_or("production");
    Ok(Arc::new(Plaid::with_parts(
        &sc.name,
        env,
        Arc::new(KeyCache::new()),
        Some(Arc::new(StaticJwkFetcher::new(vec![jwk]))),
    )))
}

/// One capture at its own time, and the matrix around an accepted one.
fn check_capture(file: &str, cap: &Capture, kit: &KitFile, b: &Built) -> Vec<Finding> {
    let mut out = Vec::new();
    let now = cap.at.map(|a| a as f64).unwrap_or(KIT_NOW);
    let req = match sources::parse_capture(&cap.request, now) {
        Ok(r) => r,
        // The captures row reports a request that does not parse.
        Err(_) => return out,
    };
    let path = format!("/hooks/{}", kit.instance);
    if req.path != path {
        out.push(Finding::new(
            file,
            cap.request_line,
            format!(
                "the capture goes to {}; the kit instance's URL is {path}",
                req.path
            ),
        ));
    }
    let v = sources::evaluate(b.source.as_ref(), &req, &b.secrets);
    for (want, line) in &cap.expects {
        if let Err(why) = holds(want, &v, b.source.declared().accepted_reply.as_deref()) {
            out.push(Finding::new(file, *line, why));
        }
    }
    // A handshake the source answers before verification (Trello's HEAD, a query challenge
    // without a verify token) carries no credential to tamper with.
    let signed_answer =
        cap.verdict() == Some(Want::Challenge) && !b.source.declared().challenge_unauthenticated;
    if !(cap.verdict() == Some(Want::Accepted) || signed_answer) {
        return out;
    }
    let t = tampered(&req, b);
    if !matches!(
        sources::evaluate(b.source.as_ref(), &t, &b.secrets),
        Verdict::Unauthorized
    ) {
        out.push(Finding::new(file, cap.request_line, "a copy with one byte changed where the credential covers it was not refused; the source does not verify what this capture's credential covers"));
    }
    if b.has_timestamp {
        let w = b.tolerance_s as f64 + KIT_SKEW_MARGIN_S;
        for (when, at) in [("after", now + w), ("before", now - w)] {
            let Ok(late) = sources::parse_capture(&cap.request, at) else {
                continue;
            };
            if !matches!(
                sources::evaluate(b.source.as_ref(), &late, &b.secrets),
                Verdict::Unauthorized
            ) {
                out.push(Finding::new(file, cap.request_line, format!("accepted {w:.0} s {when} its own time (# at:), outside the scheme's ±{} s window; check the capture's # at: and the source's timestamp check", b.tolerance_s)));
            }
        }
    }
    out
}

/// A copy of the request with one byte changed where the credential covers it: the body
/// for a signature over a body, else the token itself (an auth header's value, or the
/// query).
fn tampered(req: &Request, b: &Built) -> Request {
    let mut r = req.clone();
    let flip = |s: &str| -> String {
        let mut chars: Vec<char> = s.chars().collect();
        if let Some(last) = chars.last_mut() {
            *last = if *last == 'x' { 'y' } else { 'x' };
        }
        chars.into_iter().collect()
    };
    // A signed body has a byte changed; a request without one (a GET handshake carrying a
    // verify token) has its token changed like a token scheme's.
    if b.body_signed && !r.body.is_empty() {
        let mid = r.body.len() / 2;
        r.body[mid] ^= 0x01;
        return r;
    }
    let auth = b.source.declared().auth_headers.clone();
    let mut changed = false;
    for (k, v) in r.headers.iter_mut() {
        if auth.iter().any(|a| a.eq_ignore_ascii_case(k)) {
            *v = flip(v);
            changed = true;
        }
    }
    // A signature inside the JSON body: one character of that field's value.
    if !changed && let Some(path) = b.source.declared().auth_fields.first() {
        let value = serde_json::from_slice::<serde_json::Value>(&r.body)
            .ok()
            .and_then(|d| {
                path.split('.')
                    .try_fold(&d, |v, step| v.get(step))
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            });
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            let quoted = format!("\"{v}\"");
            if let Some(at) = r
                .body
                .windows(quoted.len())
                .position(|w| w == quoted.as_bytes())
            {
                let last = at + quoted.len() - 2;
                r.body[last] = if r.body[last] == b'0' { b'1' } else { b'0' };
                changed = true;
            }
        }
    }
    if !changed {
        for (_, v) in r.query.iter_mut() {
            *v = flip(v);
        }
    }
    r
}

/// Whether one `# expect:` holds for the verdict; `Err` says what happened instead.
/// `reply` is the source's declared answer to a stored delivery (`accepted_reply`).
fn holds(want: &Expect, v: &Verdict, reply: Option<&str>) -> Result<(), String> {
    let got = describe(v);
    let mismatch = |what: &str, expected: &str, actual: Option<&str>| -> Result<(), String> {
        if actual == Some(expected) {
            Ok(())
        } else {
            Err(format!(
                "expect {what} = {expected:?}, but the source gave {}",
                actual
                    .map(|a| format!("{a:?}"))
                    .unwrap_or_else(|| format!("none ({got})"))
            ))
        }
    };
    let accepted = match v {
        Verdict::Accept(a) => Some(a),
        _ => None,
    };
    match want {
        Expect::Verdict(w) => {
            let ok = match w {
                Want::Accepted => matches!(v, Verdict::Accept(_)),
                Want::Unauthorized => matches!(v, Verdict::Unauthorized),
                Want::Ignored => matches!(v, Verdict::Ignored(_)),
                Want::Challenge => matches!(v, Verdict::Answer(_)),
                Want::Quarantined => matches!(v, Verdict::Quarantine { .. }),
                // Decided by the intake before any source code runs.
                Want::TooLarge | Want::Chunked => return Ok(()),
            };
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "expect verdict = {:?}, but the source gave {got}; fix the capture (its signature, headers or body) or the expectation",
                    w.as_str()
                ))
            }
        }
        Expect::Status(s) => {
            let (status, _) = answer(v, reply);
            if status == *s {
                Ok(())
            } else {
                Err(format!(
                    "expect status = {s}, but the intake would answer {status} ({got})"
                ))
            }
        }
        Expect::Key(k) => mismatch("key", k, accepted.map(|a| a.key.as_str())),
        Expect::EventType(e) => mismatch("event_type", e, accepted.map(|a| a.event_type.as_str())),
        Expect::DedupId(d) => mismatch("dedup_id", d, accepted.and_then(|a| a.dedup_id.as_deref())),
        Expect::Attr(name, value) => mismatch(
            &format!("attrs.{name}"),
            value,
            accepted.and_then(|a| a.attrs.get(name).map(String::as_str)),
        ),
        Expect::Body(path, value) => {
            let (_, body) = answer(v, reply);
            let doc: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let got = path.iter().try_fold(&doc, |d, k| d.get(k));
            let want_json = serde_json::to_value(value).unwrap_or_default();
            if got == Some(&want_json) {
                Ok(())
            } else {
                Err(format!(
                    "expect body.{} = {want_json}, but the answer has {}",
                    path.join("."),
                    got.map(|g| g.to_string())
                        .unwrap_or_else(|| "no such member".into())
                ))
            }
        }
    }
}

/// The status and body the intake answers for a verdict (`intake::answer`, which `source
/// test` prints too); a stored delivery is answered `reply` when the source declares one.
fn answer(v: &Verdict, reply: Option<&str>) -> (u16, Vec<u8>) {
    let said = |s: Said| (s.status(), s.body().into_bytes());
    match v {
        Verdict::Accept(_) => match reply {
            Some(r) => (200, r.as_bytes().to_vec()),
            None => said(Said::Queued),
        },
        Verdict::Ignored(_) => said(Said::Ignored),
        Verdict::Quarantine { .. } => said(Said::Quarantined),
        Verdict::Undecided(_) => said(Said::Unavailable),
        Verdict::Unauthorized => (401, Vec::new()),
        Verdict::Answer(r) => (r.status, r.body.clone()),
    }
}

/// A verdict in a few words, without any request or secret text.
fn describe(v: &Verdict) -> String {
    match v {
        Verdict::Accept(a) => format!("accepted (key {:?}, event_type {:?})", a.key, a.event_type),
        Verdict::Unauthorized => "unauthorized (401)".into(),
        Verdict::Undecided(_) => "undecided (503)".into(),
        Verdict::Answer(r) => format!("a handshake answer ({})", r.status),
        Verdict::Ignored(_) => "ignored".into(),
        Verdict::Quarantine { class } => format!("quarantined ({class})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_kit_tampered_token_changes_the_token_not_the_body() {
        let kit = Signer::template(
            "t",
            "scheme = \"static-token\"\nheader = \"X-Token\"\nkey = \"payload.id\"\n",
            b"tok",
        )
        .expect("kit");
        let b = Built {
            source: kit.source.clone(),
            secrets: MapSecrets::new().with("secret", b"tok"),
            body_signed: kit.flags.body_signed,
            has_timestamp: false,
            tolerance_s: 300,
        };
        let req = Request::new("POST", "/hooks/t", KIT_NOW)
            .with_header("X-Token", "tok")
            .with_body(b"{\"id\":\"1\"}".to_vec());
        let t = tampered(&req, &b);
        assert_eq!(t.body, req.body);
        assert_ne!(t.header("X-Token"), req.header("X-Token"));
        assert!(matches!(
            sources::evaluate(b.source.as_ref(), &t, &b.secrets),
            Verdict::Unauthorized
        ));
    }

    #[test]
    fn a_recipe_that_signs_the_body_is_tampered_in_the_body() {
        let opts = |t: &str| -> toml::Table { t.parse().expect("toml") };
        let covers =
            |kind: &str, t: &toml::Table| recipe_of(kind, t).is_some_and(|r| r.covers_body());
        // Vercel's recipe signs the body; Mailgun's signs a timestamp and a token only.
        let body = opts(
            "recipe = { algorithm = \"hmac-sha1\", signed = [\"body\"], header = \"x-vercel-signature\", encoding = \"hex\" }",
        );
        let token = opts(
            "recipe = { algorithm = \"hmac-sha256\", signed = [\"timestamp\", \"field:signature.token\"], field = \"signature.signature\", encoding = \"hex\", timestamp = \"field:signature.timestamp\", tolerance_s = 3600, body_unsigned = true }",
        );
        assert!(covers("template", &body));
        assert!(!covers("template", &token));
        assert!(
            !covers("github", &body),
            "a built-in's flags come from its kit"
        );
        assert!(!covers("template", &opts("scheme = \"static-token\"")));
    }

    /// The recipe's window is the one bobbin check moves a capture's clock past: its
    /// `tolerance_s`, the default when it has a timestamp without one, none without a time.
    #[test]
    fn a_recipe_with_a_timestamp_has_its_window_checked() {
        let window = |t: &str| {
            recipe_of("template", &t.parse::<toml::Table>().expect("toml"))
                .expect("recipe")
                .window_s()
        };
        assert_eq!(
            window(
                "recipe = { algorithm = \"hmac-sha256\", signed = [\"timestamp\", \"field:signature.token\"], field = \"signature.signature\", encoding = \"hex\", timestamp = \"field:signature.timestamp\", tolerance_s = 3600, body_unsigned = true }"
            ),
            Some(3600)
        );
        assert_eq!(
            window(
                "recipe = { algorithm = \"ed25519\", key = \"hex\", signed = [\"timestamp\", \"body\"], header = \"X-Signature-Ed25519\", timestamp = \"header:X-Signature-Timestamp\", encoding = \"hex\" }"
            ),
            Some(crate::sources::verify::TOLERANCE_S_DEFAULT)
        );
        assert_eq!(
            window(
                "recipe = { algorithm = \"hmac-sha1\", signed = [\"body\"], header = \"x-vercel-signature\", encoding = \"hex\" }"
            ),
            None
        );
    }

    #[test]
    fn source_kit_expectations_name_what_the_source_gave() {
        let e = holds(
            &Expect::Verdict(Want::Accepted),
            &Verdict::Unauthorized,
            None,
        )
        .unwrap_err();
        assert!(e.contains("unauthorized (401)"), "{e}");
        assert!(holds(&Expect::Status(401), &Verdict::Unauthorized, None).is_ok());
        let e = holds(&Expect::Status(200), &Verdict::Unauthorized, None).unwrap_err();
        assert!(e.contains("would answer 401"), "{e}");
    }
}
