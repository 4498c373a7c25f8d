//! The template selector language (`sources::select`): selectors, value
//! templates and ignore rules as config writes them, evaluated on arbitrary JSON payloads and
//! headers.
//!
//! Input: three NUL-separated fields, the selector text, a header line (`Name: value`) and
//! the JSON body; whatever follows a third NUL is ignored.
//!
//! Beyond "does not panic": a parsed selector prints back to text that parses to the same
//! selector; a value that parses evaluates the same way twice; `eval_required` fails exactly
//! when `eval` finds a value missing; a rule and its negation never fire together.

use hookspool::sources::Request;
use hookspool::sources::select::{Expr, Rule, Selector};
use serde_json::Value;

pub fn check(data: &[u8]) {
    let mut fields = data.splitn(4, |b| *b == 0);
    let sel = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let header = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let body = fields.next().unwrap_or_default();
    let payload: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let mut req = Request::new("POST", "/hooks/fuzz", 0.0).with_body(body.to_vec());
    if let Some((k, v)) = header.split_once(':') {
        req = req.with_header(k.trim(), v.trim());
    }

    if let Ok(s) = Selector::parse("key", &sel) {
        let again = Selector::parse("key", &s.text());
        assert_eq!(again.as_ref().ok(), Some(&s), "text() does not parse back");
        let _ = s.eval(&payload, &req);
    }
    if let Ok(e) = Expr::parse("key", &sel) {
        let first = e.eval(&payload, &req);
        let required = e.eval_required(&payload, &req);
        match (&first, &required) {
            (Ok(Some(a)), Ok(b)) => assert_eq!(a, b, "eval and eval_required differ"),
            (Ok(None), Err(_)) | (Err(_), Err(_)) => {}
            _ => panic!("eval {first:?} but eval_required {required:?}"),
        }
        assert_eq!(
            format!("{first:?}"),
            format!("{:?}", e.eval(&payload, &req)),
            "eval is not deterministic"
        );
        let _ = (e.uses_payload(), e.headers());
    }
    if let Ok(rule) = Rule::parse("ignore", &sel) {
        let fired = rule.check(&payload, &req);
        let _ = (rule.uses_payload(), rule.header());
        // The negation of `a=b` is `a!=b`; only build it for a plain `=` rule.
        if !sel.contains("!=")
            && let Some((l, v)) = sel.split_once('=')
            && let Ok(neg) = Rule::parse("ignore", &format!("{l}!={v}"))
            && let (Ok(a), Ok(b)) = (&fired, neg.check(&payload, &req))
        {
            assert!(
                a.is_some() != b.is_some(),
                "a rule and its negation agree: {a:?} {b:?}"
            );
        }
    }
}
