//! The times of traces and logs: RFC 3339 (`2026-11-23T08:00:00.5Z`, an offset, or a space
//! for the `T` as virsh and `journalctl -o short-iso-precise` write them) and seconds since
//! the epoch. An offset is kept as the local wall clock: the forecast reads the hour of the
//! day and the day of the week from the time as written.

/// Days from 1970-01-01 to the civil date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day since 1970-01-01 (Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

/// Parses a time: seconds since the epoch, or RFC 3339 with `T` or a space, optional
/// fraction, and `Z`, `+hh:mm`, `+hhmm` or nothing after it.
pub fn parse_time(s: &str) -> Result<f64, String> {
    if let Ok(v) = s.parse::<f64>() {
        if v.is_finite() && v >= 0.0 {
            return Ok(v);
        }
    }
    let bad = || format!("{s:?}: want RFC 3339 (2026-11-23T08:00:00Z) or seconds since the epoch");
    let b = s.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !(b[10] == b'T' || b[10] == b' ') {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        s.get(r)
            .filter(|t| t.bytes().all(|c| c.is_ascii_digit()))
            .and_then(|t| t.parse().ok())
            .ok_or_else(bad)
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[13] != b':' || b[16] != b':' || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return Err(bad());
    }
    if h > 23 || mi > 59 || sec > 60 {
        return Err(bad());
    }
    let mut rest = &s[19..];
    let mut frac = 0.0;
    if let Some(r) = rest.strip_prefix('.') {
        let n = r.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return Err(bad());
        }
        frac = format!("0.{}", &r[..n]).parse::<f64>().map_err(|_| bad())?;
        rest = &r[n..];
    }
    // The offset: the wall clock as written is what counts.
    let ok_offset = rest.is_empty()
        || rest == "Z"
        || ((rest.starts_with('+') || rest.starts_with('-'))
            && rest[1..].bytes().filter(u8::is_ascii_digit).count() == 4
            && rest.len() <= 6);
    if !ok_offset {
        return Err(bad());
    }
    let days = days_from_civil(y, mo, d);
    Ok((days * 86_400 + h * 3600 + mi * 60 + sec) as f64 + frac)
}

/// Seconds since the epoch as RFC 3339, milliseconds, `Z`.
pub fn format_rfc3339(at_s: f64) -> String {
    let ms = (at_s * 1000.0).round() as i64;
    let (secs, ms) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_and_format_both_ways() {
        // Monday 2026-11-23 00:00 (the generator's MONDAY).
        assert_eq!(parse_time("2026-11-23T00:00:00Z"), Ok(1_795_392_000.0));
        assert_eq!(
            parse_time("2026-11-27 10:40:01.250+0000"),
            Ok(1_795_392_000.0 + 4.0 * 86_400.0 + 38_401.25)
        );
        assert_eq!(parse_time("2026-11-23T01:00:00+01:00"), Ok(1_795_395_600.0));
        assert_eq!(parse_time("12.5"), Ok(12.5));
        for bad in ["2026-13-01T00:00:00Z", "2026-11-23T00:00:00Q", "x", "-3"] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
        for t in [0.0, 1_795_392_000.0, 1_795_392_000.123, 951_782_400.0] {
            assert_eq!(parse_time(&format_rfc3339(t)), Ok(t), "{t}");
        }
        assert_eq!(format_rfc3339(951_782_400.0), "2000-02-29T00:00:00.000Z");
    }
}
