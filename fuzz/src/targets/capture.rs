//! `sources::parse_capture`, the reader of `.http` capture files (`hookspool source test`,
//! bobbin captures), on arbitrary text.
//!
//! Beyond "does not panic": a parsed capture's body is a prefix of the text after the first
//! blank line, exactly as long as a valid Content-Length allows; the path carries no query
//! string; every `&`-separated piece of the query became one parameter; and header names and
//! values come out trimmed.

use hookspool::sources::parse_capture;

pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(r) = parse_capture(&text, 0.0) else {
        return;
    };
    let after = match text.split_once("\r\n\r\n") {
        Some((_, b)) => b,
        None => text.split_once("\n\n").map(|(_, b)| b).unwrap_or(""),
    };
    assert!(
        after.as_bytes().starts_with(&r.body),
        "the body is not the text after the blank line"
    );
    match r
        .header("Content-Length")
        .and_then(|l| l.trim().parse::<usize>().ok())
    {
        Some(n) => assert_eq!(r.body.len(), n.min(after.len()), "Content-Length not kept"),
        None => assert_eq!(r.body.len(), after.len(), "body cut without Content-Length"),
    }
    assert!(!r.method.is_empty() && !r.method.contains(char::is_whitespace));
    assert!(!r.path.contains('?'), "query left in the path");
    let target = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    let pieces = target
        .split_once('?')
        .map(|(_, q)| q.split('&').filter(|p| !p.is_empty()).count())
        .unwrap_or(0);
    assert_eq!(r.query.len(), pieces, "query parameters lost or invented");
    for (k, v) in &r.headers {
        assert_eq!(k.trim(), k, "header name not trimmed");
        assert_eq!(v.trim(), v, "header value not trimmed");
    }
}
