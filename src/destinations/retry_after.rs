//! Retry-After parsing (RFC 9110 10.2.3): delay-seconds or an HTTP-date, capped at
//! `RETRY_AFTER_S_MAX`. Pure: the caller passes the wall clock; nothing here reads time.

use super::outcome::RETRY_AFTER_S_MAX;

/// A header value longer than this is not a Retry-After anyone meant (the longest HTTP-date
/// form is 30 bytes).
const RETRY_AFTER_VALUE_BYTES_MAX: usize = 64;

const SECONDS_PER_DAY: i64 = 86_400;

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
/// `Sunday, 06-Nov-94 08:49:37 GMT` and asctime `Sun Nov  6 08:49:37 1994`.
pub fn http_date_unix_s(v: &str) -> Option<i64> {
    let parts: Vec<&str> = v.split_ascii_whitespace().collect();
    let (day, month, year, time) = match parts.as_slice() {
        [wd, d, m, y, t, "GMT"] if wd.ends_with(',') => (*d, *m, y.parse::<i64>().ok()?, *t),
        [wd, dmy, t, "GMT"] if wd.ends_with(',') => {
            let mut it = dmy.split('-');
            let (d, m, y) = (it.next()?, it.next()?, it.next()?);
            if it.next().is_some() || y.len() != 2 {
                return None;
            }
            let yy = y.parse::<i64>().ok()?;
            // RFC 9110: a two-digit year more than 50 years in the future is in the past
            // century; for Retry-After, 19xx only for 70..=99 is the usual reading.
            (d, m, if yy >= 70 { 1900 + yy } else { 2000 + yy }, *t)
        }
        [_wd, m, d, t, y] => (*d, *m, y.parse::<i64>().ok()?, *t),
        _ => return None,
    };
    let day: i64 = day.parse().ok()?;
    let month = match month {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let mut hms = time.split(':');
    let (h, mi, s) = (hms.next()?, hms.next()?, hms.next()?);
    if hms.next().is_some() {
        return None;
    }
    let (h, mi, s): (i64, i64, i64) = (h.parse().ok()?, mi.parse().ok()?, s.parse().ok()?);
    if !(1..=31).contains(&day) || h > 23 || mi > 59 || s > 60 || !(1..=9999).contains(&year) {
        return None;
    }
    Some(days_from_civil(year, month, day) * SECONDS_PER_DAY + h * 3600 + mi * 60 + s)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
