//! Byte sizes as people write them (`8G`, `512MiB`, `2048kB`) and as tables print them.

/// A size string that is not a number with an optional binary unit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SizeError {
    /// Not of the form `<digits>[k|M|G|T][i][B]`.
    #[error("size {input:?} is not a number of bytes with an optional unit (k, M, G, T)")]
    Malformed {
        /// What the user wrote.
        input: String,
    },
    /// The value does not fit in 64 bits.
    #[error("size {input:?} is larger than 2^64 bytes")]
    Overflow {
        /// What the user wrote.
        input: String,
    },
}

/// Parses a byte count. Units are binary (`k` = 1024) whether or not an `i` is written,
/// as for hugepage sizes everywhere in Linux; they are case-insensitive.
///
/// ```
/// use hugeprep::units::parse_bytes;
/// assert_eq!(parse_bytes("8G").unwrap(), 8 << 30);
/// assert_eq!(parse_bytes("2048kB").unwrap(), 2 << 20);
/// assert_eq!(parse_bytes("4096").unwrap(), 4096);
/// assert!(parse_bytes("8 apples").is_err());
/// ```
pub fn parse_bytes(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(digits_end);
    let malformed = || SizeError::Malformed {
        input: input.to_string(),
    };
    if digits.is_empty() {
        return Err(malformed());
    }
    let value: u64 = digits.parse().map_err(|_| SizeError::Overflow {
        input: input.to_string(),
    })?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.strip_suffix('b').unwrap_or(&unit);
    let unit = unit.strip_suffix('i').unwrap_or(unit);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(malformed()),
    };
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| SizeError::Overflow {
            input: input.to_string(),
        })
}

/// Formats a byte count with the largest binary unit that divides it exactly, or one decimal
/// place otherwise: `2 MiB`, `1.5 GiB`, `4097 B`.
///
/// ```
/// use hugeprep::units::format_bytes;
/// assert_eq!(format_bytes(2 << 20), "2 MiB");
/// assert_eq!(format_bytes(3 << 29), "1.5 GiB");
/// ```
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (name, shift) in UNITS {
        let unit = 1u64 << shift;
        if bytes >= unit {
            if bytes % unit == 0 {
                return format!("{} {name}", bytes >> shift);
            }
            return format!("{:.1} {name}", bytes as f64 / unit as f64);
        }
    }
    format!("{bytes} B")
}

/// Gigabytes (10^9 bytes) per second, the unit of every throughput hugeprep reports.
pub fn gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        return 0.0;
    }
    bytes as f64 / seconds / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_units() {
        assert_eq!(parse_bytes("1k"), Ok(1024));
        assert_eq!(parse_bytes("1KiB"), Ok(1024));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes(" 1T "), Ok(1 << 40));
        assert!(matches!(parse_bytes(""), Err(SizeError::Malformed { .. })));
        assert!(matches!(parse_bytes("G"), Err(SizeError::Malformed { .. })));
        assert!(matches!(
            parse_bytes("1X"),
            Err(SizeError::Malformed { .. })
        ));
        assert!(matches!(
            parse_bytes("99999999999T"),
            Err(SizeError::Overflow { .. })
        ));
    }

    #[test]
    fn format_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(4097), "4.0 KiB");
        assert_eq!(format_bytes(1 << 30), "1 GiB");
    }
}
