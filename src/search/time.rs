//! Times as search shows and takes them: RFC 3339 out; dates, date-times,
//! Unix seconds and "3 days ago" in (`--since`, `--until`).

use anyhow::{Result, bail};

/// Unix seconds as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(t: f64) -> String {
    let t = jiff::Timestamp::from_second(t.max(0.0) as i64).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A time as people type it, to Unix seconds: `YYYY-MM-DD` (midnight UTC),
/// `YYYY-MM-DDTHH:MM[:SS]` or with a space (UTC), an RFC 3339 time with an
/// offset (`2026-03-01T10:15:00+02:00`, `…Z`), Unix seconds, or a time ago:
/// `7d`, `12h`, `2 weeks`, `3 days ago`, `yesterday`, `today`, `now` (days
/// from midnight UTC). Impossible dates (`2026-02-31`, hour 25) are refused.
pub fn parse_time(s: &str) -> Result<f64> {
    use jiff::{Span, Timestamp, civil, tz::TimeZone};
    let text = s.trim();
    let now = Timestamp::now().to_zoned(TimeZone::UTC);
    let midnight = |days_back: i64| -> Result<f64> {
        let day = now.date().checked_sub(Span::new().days(days_back))?;
        Ok(day.to_zoned(TimeZone::UTC)?.timestamp().as_second() as f64)
    };
    let lower = text.to_ascii_lowercase();
    match lower.as_str() {
        "now" => return Ok(now.timestamp().as_second() as f64),
        "today" => return midnight(0),
        "yesterday" => return midnight(1),
        _ => {}
    }
    if let Ok(t) = text.parse::<f64>()
        && t.is_finite()
    {
        return Ok(t);
    }
    if let Ok(t) = text.parse::<Timestamp>() {
        return Ok(t.as_second() as f64);
    }
    if let Ok(t) = text.parse::<civil::DateTime>() {
        return Ok(t.to_zoned(TimeZone::UTC)?.timestamp().as_second() as f64);
    }
    if let Ok(d) = text.parse::<civil::Date>() {
        return Ok(d.to_zoned(TimeZone::UTC)?.timestamp().as_second() as f64);
    }
    let ago = lower.strip_suffix("ago").unwrap_or(&lower).trim();
    if let Ok(span) = ago.parse::<Span>()
        && !span.is_negative()
    {
        return Ok(now.checked_sub(span)?.timestamp().as_second() as f64);
    }
    // A date of the right shape that is not in the calendar: say so.
    if let Err(e) = text
        .get(..10)
        .filter(|d| d.len() == 10 && d.as_bytes()[4] == b'-')
        .map_or(Ok(civil::Date::MIN), str::parse::<civil::Date>)
    {
        bail!("{s:?} is not a date: {e}");
    }
    bail!(
        "{s:?} is not a time: use YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] (UTC), an RFC 3339 time with \
         an offset (2026-03-01T10:15:00+02:00), Unix seconds, or a time ago (7d, 12h, 2 weeks, \
         yesterday, today)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        let t = parse_time("2026-03-01T10:15:00").unwrap();
        assert_eq!(rfc3339(t), "2026-03-01T10:15:00Z");
        assert_eq!(parse_time("2026-03-01 10:15").unwrap(), t);
        assert_eq!(parse_time("2026-03-01T12:15:00+02:00").unwrap(), t);
        assert_eq!(parse_time("2026-03-01T10:15:00Z").unwrap(), t);
        assert_eq!(parse_time("1970-01-02").unwrap(), 86_400.0);
        assert_eq!(parse_time("1772360100").unwrap(), 1_772_360_100.0);
        for impossible in [
            "2026-02-31",
            "2026-13-01",
            "2026-03-01T99:00",
            "2026-03-01T10:61",
        ] {
            let err = parse_time(impossible).unwrap_err().to_string();
            assert!(err.contains(impossible), "{impossible}: {err}");
        }
        for nonsense in ["soon", "", "7 parsecs", "-3d"] {
            assert!(parse_time(nonsense).is_err(), "{nonsense:?}");
        }
    }

    #[test]
    fn times_ago_count_back_from_now() {
        let now = crate::index::unix_now();
        let close = |s: &str, seconds_ago: f64| {
            let t = parse_time(s).unwrap();
            assert!(
                (now - seconds_ago - t).abs() < 5.0,
                "{s}: {t} vs {}",
                now - seconds_ago
            );
        };
        close("now", 0.0);
        close("7d", 7.0 * 86_400.0);
        close("12h", 12.0 * 3600.0);
        close("3 days ago", 3.0 * 86_400.0);
        close("2 weeks", 14.0 * 86_400.0);
        let today = parse_time("today").unwrap();
        assert!(now - today < 86_400.0 && today % 86_400.0 == 0.0);
        assert_eq!(parse_time("yesterday").unwrap(), today - 86_400.0);
    }
}
