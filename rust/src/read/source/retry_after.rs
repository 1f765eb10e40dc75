//! The `Retry-After` header (RFC 9110 section 10.2.3): delay-seconds or an HTTP-date.
//!
//! Servers behind CDNs and some object-store gateways send the date form; reading only the
//! seconds form would turn their "come back at 12:00:30" into our own short backoff, and a
//! thousand ranks would keep hammering a server that asked them to wait. RFC 9110 asks
//! recipients to accept all three date formats (IMF-fixdate and the obsolete RFC 850 and asctime).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The wait a `Retry-After` value asks for, measured from `now`; a date in the past is no wait.
/// `None` for a value that is neither form (the header is then ignored, as if absent).
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = http_date_seconds(value)?;
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(at.saturating_sub(now)))
}

/// Seconds since the Unix epoch of an HTTP-date in any of its three formats.
fn http_date_seconds(value: &str) -> Option<u64> {
    let normalised = value.replace([',', '-'], " ");
    let tokens: Vec<&str> = normalised.split_whitespace().collect();
    // The weekday (tokens[0]) is redundant; it is not checked against the date.
    let (day, month, year, clock) = match tokens.as_slice() {
        // IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT`; RFC 850 `Sunday, 06-Nov-94 08:49:37 GMT`.
        [_, day, month, year, clock, "GMT"] => (*day, *month, *year, *clock),
        // asctime `Sun Nov  6 08:49:37 1994`.
        [_, month, day, clock, year] => (*day, *month, *year, *clock),
        _ => return None,
    };
    let day: u64 = day.parse().ok()?;
    let month = month_number(month)?;
    let year: u64 = match year.parse::<u64>().ok()? {
        // RFC 850's two-digit year; RFC 9110 reads one more than 50 years ahead as the past.
        y @ 0..=69 => 2000 + y,
        y @ 70..=99 => 1900 + y,
        y => y,
    };
    let mut parts = clock.split(':').map(|p| p.parse::<u64>().ok());
    let (h, m, s) = (parts.next()??, parts.next()??, parts.next()??);
    if parts.next().is_some() || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day)?;
    Some(days * 86_400 + h * 3_600 + m * 60 + s)
}

fn month_number(name: &str) -> Option<u64> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    MONTHS.iter().position(|m| *m == name).map(|i| i as u64 + 1)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (from 1970 on), by the usual
/// era-of-400-years arithmetic.
fn days_from_civil(year: u64, month: u64, day: u64) -> Option<u64> {
    if year < 1970 {
        return None;
    }
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let year_of_era = y - era * 400;
    let shifted_month = if month > 2 { month - 3 } else { month + 9 };
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    (era * 146_097 + day_of_era).checked_sub(719_468)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    // 1994-11-06 08:49:37 UTC, RFC 9110's own example.
    const EXAMPLE: u64 = 784_111_777;

    #[test]
    fn the_three_date_formats_of_rfc_9110_name_the_same_instant() {
        for value in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(http_date_seconds(value), Some(EXAMPLE), "{value}");
        }
    }

    #[test]
    fn a_date_is_a_wait_from_now_and_a_past_date_is_no_wait() {
        let now = at(EXAMPLE - 90);
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", at(EXAMPLE + 5)),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn seconds_still_parse_and_garbage_is_ignored() {
        assert_eq!(
            parse_retry_after(" 120 ", at(0)),
            Some(Duration::from_secs(120))
        );
        for bad in [
            "",
            "soon",
            "-5",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sun, 06 Nov 1994 08:49:37 PST",
        ] {
            assert_eq!(parse_retry_after(bad, at(0)), None, "{bad:?}");
        }
    }

    #[test]
    fn leap_years_and_the_turn_of_the_century_count_their_days() {
        // 2000-03-01 is day 11,017 (2000 is a leap year); 2100-03-01 is day 47,541 (2100 is not).
        assert_eq!(days_from_civil(2000, 3, 1), Some(11_017));
        assert_eq!(days_from_civil(2100, 3, 1), Some(47_541));
        assert_eq!(days_from_civil(1970, 1, 1), Some(0));
    }
}
