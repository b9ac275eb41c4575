//! What the publisher reads from a Keystone v3 token: when it expires, and Placement's URL
//! in its service catalog.

use std::time::{Duration, SystemTime};

use serde_json::Value;

/// When a Keystone v3 token expires: its `expires_at` (`2026-11-27T01:00:00.000000Z`).
pub fn token_expiry(token: &Value) -> Option<SystemTime> {
    parse_utc(token.pointer("/token/expires_at")?.as_str()?)
}

/// Parses an ISO 8601 UTC time as Keystone writes it: `YYYY-MM-DDTHH:MM:SS[.frac](Z|+00:00)`.
pub fn parse_utc(text: &str) -> Option<SystemTime> {
    let text = text
        .strip_suffix('Z')
        .or_else(|| text.strip_suffix("+00:00"))
        .unwrap_or(text);
    let (date, time) = text.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<u64>().ok());
    let (h, min, sec) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || min > 59 || sec > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm), proleptic Gregorian.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let nanos: u32 = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().take(9).collect();
        let n: u32 = digits.parse().ok()?;
        n * 10u32.pow(9 - digits.len() as u32)
    };
    Some(
        SystemTime::UNIX_EPOCH
            + Duration::from_secs(days * 86_400 + h * 3600 + min * 60 + sec)
            + Duration::from_nanos(u64::from(nanos)),
    )
}

/// Placement's URL in a Keystone v3 token's catalog, for `interface` and `region` (any
/// region when `None`).
pub fn catalog_endpoint(token: &Value, interface: &str, region: Option<&str>) -> Option<String> {
    let catalog = token.pointer("/token/catalog")?.as_array()?;
    catalog
        .iter()
        .filter(|s| s["type"] == "placement")
        .flat_map(|s| s["endpoints"].as_array().into_iter().flatten())
        .find(|e| {
            e["interface"] == interface
                && region.map_or(true, |r| e["region_id"] == r || e["region"] == r)
        })
        .and_then(|e| e["url"].as_str())
        .map(|u| u.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn catalog_gives_the_interface_and_region_asked() {
        let token = json!({"token": {"catalog": [
            {"type": "compute", "endpoints": [{"interface": "internal", "region_id": "r1", "url": "http://nova"}]},
            {"type": "placement", "endpoints": [
                {"interface": "public", "region_id": "r1", "url": "https://placement.example/"},
                {"interface": "internal", "region_id": "r1", "url": "http://placement-r1:8778"},
                {"interface": "internal", "region_id": "r2", "url": "http://placement-r2:8778"},
            ]},
        ]}});
        assert_eq!(
            catalog_endpoint(&token, "internal", Some("r2")).as_deref(),
            Some("http://placement-r2:8778")
        );
        assert_eq!(
            catalog_endpoint(&token, "public", None).as_deref(),
            Some("https://placement.example")
        );
        assert_eq!(catalog_endpoint(&token, "admin", None), None);
    }

    #[test]
    fn keystone_expiry_times_parse() {
        let t = parse_utc("2026-11-27T01:00:00.000000Z").unwrap();
        let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs, 1_795_741_200);
        let t = parse_utc("1970-01-01T00:00:01.5+00:00").unwrap();
        assert_eq!(
            t.duration_since(SystemTime::UNIX_EPOCH).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_utc("2000-03-01T00:00:00Z")
                .unwrap()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
            951_868_800
        );
        assert!(parse_utc("2026-13-01T00:00:00Z").is_none());
        assert!(parse_utc("yesterday").is_none());
        let token = json!({"token": {"expires_at": "2026-11-27T01:00:00.000000Z"}});
        assert!(token_expiry(&token).is_some());
    }
}
