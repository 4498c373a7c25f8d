//! How a request body becomes the payload: JSON, a flat form, or a form field holding JSON.
//!
//! Owns: [`BodyFormat`] (the template's `body` key, and GitHub's choice by Content-Type) and
//! the form decoding rules, through the `form_urlencoded` crate:
//!
//! * `form`: `application/x-www-form-urlencoded` pairs become one JSON object of strings
//!   (Slack slash commands and interactivity). A name sent once maps to its value; a name
//!   sent more than once maps to an array of its values in body order, so nothing the
//!   sender signed is dropped and a selector on it fails visibly (NotScalar) instead of
//!   picking one.
//! * `form-json:<field>`: the named field, sent exactly once, holds the JSON payload
//!   (GitHub hooks with content type `form` send `payload=<url-encoded JSON>`).
//!
//! A form that does not decode to UTF-8 is refused (`BadForm`), never decoded lossily: the
//! request is then quarantined with its raw body, so nothing is lost.
//!
//! Must not: touch the signature (verification always covers the raw body bytes, before any
//! decoding), or put a field value into an error (only the configured field name).

use serde_json::{Map, Value};

use super::{Request, SourceConfigError, SourceError, default_payload};

/// The `Content-Type` of a form body.
pub const FORM_MEDIA_TYPE: &str = "application/x-www-form-urlencoded";
/// What `body = ...` accepts, for messages.
const BODY_EXAMPLE: &str = "\"json\", \"form\" or \"form-json:payload\"";

/// How the payload is read from the body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BodyFormat {
    /// The body is JSON; an empty body is `{}`.
    #[default]
    Json,
    /// The body is a form; it becomes a JSON object of strings.
    Form,
    /// The body is a form whose named field holds the JSON payload.
    FormJson(String),
}

impl BodyFormat {
    /// Parses the template's `body` value (`key` names it in the error).
    pub fn parse(key: &str, raw: &str) -> Result<Self, SourceConfigError> {
        match raw.split_once(':') {
            None if raw == "json" => Ok(BodyFormat::Json),
            None if raw == "form" => Ok(BodyFormat::Form),
            Some(("form-json", field)) if !field.trim().is_empty() => {
                Ok(BodyFormat::FormJson(field.trim().to_string()))
            }
            _ => Err(SourceConfigError::Invalid {
                key: key.to_string(),
                message: format!("unknown body format {raw:?}; write body = {BODY_EXAMPLE}"),
            }),
        }
    }

    /// Whether `payload(req)` is the body itself, parsed (`Source::payload_is_body`).
    pub fn payload_is_body(&self, req: &Request) -> bool {
        matches!(self, BodyFormat::Json) && super::body_is_payload(req)
    }

    /// The payload of `req` read this way.
    pub fn payload(&self, req: &Request) -> Result<Value, SourceError> {
        match self {
            BodyFormat::Json => default_payload(req),
            BodyFormat::Form => form_object(&req.body),
            BodyFormat::FormJson(field) => form_json_field(&req.body, field),
        }
    }
}

/// True when the request says its body is a form (media type compared without parameters,
/// ASCII case-insensitively).
pub fn is_form(req: &Request) -> bool {
    req.header("Content-Type")
        .and_then(|ct| ct.split(';').next())
        .is_some_and(|mt| mt.trim().eq_ignore_ascii_case(FORM_MEDIA_TYPE))
}

/// The form's pairs, refusing any that did not decode to UTF-8 (`form_urlencoded` replaces
/// such bytes with U+FFFD; a replacement character in the output is treated as that).
fn pairs(body: &[u8]) -> Result<Vec<(String, String)>, SourceError> {
    let mut out = Vec::new();
    for (k, v) in form_urlencoded::parse(body) {
        if k.contains(char::REPLACEMENT_CHARACTER) || v.contains(char::REPLACEMENT_CHARACTER) {
            return Err(SourceError::BadForm);
        }
        out.push((k.into_owned(), v.into_owned()));
    }
    Ok(out)
}

/// A flat form as a JSON object (a repeated name becomes an array of its values).
pub fn form_object(body: &[u8]) -> Result<Value, SourceError> {
    let mut m = Map::new();
    for (k, v) in pairs(body)? {
        match m.get_mut(&k) {
            None => {
                m.insert(k, Value::String(v));
            }
            Some(Value::Array(values)) => values.push(Value::String(v)),
            Some(first) => {
                let first = first.take();
                m.insert(k, Value::Array(vec![first, Value::String(v)]));
            }
        }
    }
    Ok(Value::Object(m))
}

/// The JSON held by the form field `field`, which must be sent exactly once.
pub fn form_json_field(body: &[u8], field: &str) -> Result<Value, SourceError> {
    let mut found = pairs(body)?.into_iter().filter(|(k, _)| k == field);
    let Some((_, value)) = found.next() else {
        return Err(SourceError::MissingField {
            field: format!("form.{field}"),
        });
    };
    if found.next().is_some() {
        return Err(SourceError::BadForm);
    }
    serde_json::from_str(&value).map_err(|_| SourceError::BadPayload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn form(ct: &str, body: &str) -> Request {
        Request::new("POST", "/", 0.0)
            .with_header("Content-Type", ct)
            .with_body(body)
    }

    #[test]
    fn a_flat_form_becomes_an_object_and_repeated_names_an_array() {
        let v = form_object(b"a=1&b=x+y%21&a=2&c=&a=3").expect("form");
        assert_eq!(v, json!({"a": ["1", "2", "3"], "b": "x y!", "c": ""}));
        assert_eq!(form_object(b"").expect("empty"), json!({}));
    }

    #[test]
    fn form_json_takes_the_one_field() {
        let v = form_json_field(b"payload=%7B%22a%22%3A1%7D&x=2", "payload").expect("json");
        assert_eq!(v, json!({"a": 1}));
        let missing = form_json_field(b"x=2", "payload").expect_err("missing");
        assert_eq!(missing.to_string(), "missing field form.payload");
        let twice = form_json_field(b"payload=%7B%7D&payload=%7B%7D", "payload");
        assert_eq!(twice.expect_err("twice").class(), "BadForm");
        let not_json = form_json_field(b"payload=nope", "payload");
        assert_eq!(not_json.expect_err("not json").class(), "BadPayload");
    }

    #[test]
    fn a_form_that_is_not_utf8_is_refused_not_decoded_lossily() {
        for body in [&b"a=%FF"[..], b"%C3=1", b"a=\xff"] {
            let err = form_object(body).expect_err("refused");
            assert_eq!(err.class(), "BadForm", "{body:?}");
            assert!(!err.to_string().contains("a="), "no body in the message");
        }
    }

    #[test]
    fn the_media_type_is_read_without_parameters_or_case() {
        assert!(is_form(&form("application/x-www-form-urlencoded", "")));
        assert!(is_form(&form(
            "Application/X-WWW-Form-Urlencoded; charset=utf-8",
            ""
        )));
        assert!(!is_form(&form("application/json", "")));
        assert!(!is_form(&Request::new("POST", "/", 0.0)));
    }

    #[test]
    fn body_values_parse_or_name_what_to_write() {
        assert_eq!(BodyFormat::parse("body", "json"), Ok(BodyFormat::Json));
        assert_eq!(BodyFormat::parse("body", "form"), Ok(BodyFormat::Form));
        assert_eq!(
            BodyFormat::parse("body", "form-json:payload"),
            Ok(BodyFormat::FormJson("payload".into()))
        );
        for bad in ["xml", "form-json:", "form-json", "json:x", ""] {
            let msg = BodyFormat::parse("body", bad).expect_err(bad).to_string();
            assert!(
                msg.starts_with("body: ") && msg.contains("form-json:payload"),
                "{msg}"
            );
        }
    }
}
