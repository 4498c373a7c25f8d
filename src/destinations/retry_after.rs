//! Retry-After parsing (RFC 9110 10.2.3): delay-seconds or an HTTP-date, capped at
//! `RETRY_AFTER_S_MAX`. Pure: the caller passes the wall clock; nothing here reads time.

/// Retry-After is honoured up to this many seconds (spec 6.5).
pub const RETRY_AFTER_S_MAX: f64 = 3600.0;

/// A header value longer than this is not a Retry-After anyone meant (the longest HTTP-date
/// form is 30 bytes).
const RETRY_AFTER_VALUE_BYTES_MAX: usize = 64;

/// Seconds to wait, in `[0, RETRY_AFTER_S_MAX]`, or `None` when the value is neither form.
/// A date in the past means "now" (0).
pub fn parse(value: &str, now_unix_s: f64) -> Option<f64> {
    let v = value.trim();
    if v.is_empty() || v.len() > RETRY_AFTER_VALUE_BYTES_MAX {
        return None;
    }
    let seconds = if v.bytes().all(|b| b.is_ascii_digit()) {
        // delay-seconds is 1*DIGIT; a huge number saturates and is capped below.
        v.parse::<u64>().map(|s| s as f64).unwrap_or(f64::MAX)
    } else {
        http_date_unix_s(v)? as f64 - now_unix_s
    };
    Some(seconds.clamp(0.0, RETRY_AFTER_S_MAX))
}

/// Unix seconds of an HTTP-date in any of the three forms RFC 9110 5.6.7 says a recipient
/// must accept: IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT`, the obsolete RFC 850 form
/// `Sunday, 06-Nov-94 08:49:37 GMT` and asctime `Sun Nov  6 08:49:37 1994` (the `httpdate`
/// crate, which hyper already uses for `Date`). A date before 1970 reads as 0: for a
/// Retry-After it is as much in the past as any other.
pub fn http_date_unix_s(v: &str) -> Option<i64> {
    let t = httpdate::parse_http_date(v).ok()?;
    Some(
        t.duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_date_forms_agree() {
        let t = 784_111_777; // 1994-11-06 08:49:37 UTC
        assert_eq!(http_date_unix_s("Sun, 06 Nov 1994 08:49:37 GMT"), Some(t));
        assert_eq!(http_date_unix_s("Sunday, 06-Nov-94 08:49:37 GMT"), Some(t));
        assert_eq!(http_date_unix_s("Sun Nov  6 08:49:37 1994"), Some(t));
        assert_eq!(http_date_unix_s("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(http_date_unix_s("garbage"), None);
        assert_eq!(http_date_unix_s("Sun, 06 Nov 1994 25:49:37 GMT"), None);
    }

    #[test]
    fn seconds_dates_and_cap() {
        assert_eq!(parse("120", 0.0), Some(120.0));
        assert_eq!(parse(" 0 ", 0.0), Some(0.0));
        assert_eq!(parse("7200", 0.0), Some(RETRY_AFTER_S_MAX));
        assert_eq!(
            parse("99999999999999999999999", 0.0),
            Some(RETRY_AFTER_S_MAX)
        );
        assert_eq!(parse("-5", 0.0), None);
        assert_eq!(parse("1.5", 0.0), None);
        let now = 784_111_777.0;
        assert_eq!(parse("Sun, 06 Nov 1994 08:50:07 GMT", now), Some(30.0));
        assert_eq!(parse("Sun, 06 Nov 1994 08:49:00 GMT", now), Some(0.0));
        assert_eq!(
            parse("Mon, 07 Nov 1994 08:49:37 GMT", now),
            Some(RETRY_AFTER_S_MAX)
        );
        assert_eq!(parse("soon", now), None);
    }
}
