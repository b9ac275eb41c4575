//! The host's local time zone: the offset from UTC of a moment, as the C library's
//! `localtime_r` knows it (`TZ`, else `/etc/localtime`).

/// Seconds east of UTC of local time at `unix_s` (seconds since the epoch); 0 when the C
/// library cannot say.
// `time_t` and `c_long` are `i64` here but `i32` on some targets.
#[allow(clippy::useless_conversion)]
pub fn utc_offset_s(unix_s: i64) -> i64 {
    let t = libc::time_t::try_from(unix_s).unwrap_or(0);
    // SAFETY: an all-zero `tm` is a valid value of this plain C struct (its `tm_zone` pointer
    // null), which `localtime_r` overwrites.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: `t` and `tm` are valid for the call, and `localtime_r` writes only into `tm`
    // (the re-entrant variant: no shared static buffer). The daemon never changes `TZ`.
    let r = unsafe { libc::localtime_r(&t, &mut tm) };
    if r.is_null() {
        return 0;
    }
    i64::from(tm.tm_gmtoff).clamp(-86_400, 86_400)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_offset_within_a_day() {
        let o = super::utc_offset_s(1_700_000_000);
        assert!((-86_400..=86_400).contains(&o));
        assert_eq!(o % 60, 0, "time zones are whole minutes: {o}");
    }
}
