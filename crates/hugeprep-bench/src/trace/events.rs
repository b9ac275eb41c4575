//! The leases a trace replays: a trace file's lines, the built-in mixed trace, and what the
//! trace itself holds at each arrival.

use std::path::Path;

use serde::Serialize;

use super::TraceBenchError;
use hugeprep::units::parse_bytes;

/// The most leases a trace may hold.
pub const MAX_EVENTS: usize = 100_000;

/// One lease of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceEvent {
    /// Arrival, ms after the start.
    pub at_ms: u64,
    /// Bytes.
    pub size: u64,
    /// How long the lease is held, ms.
    pub hold_ms: u64,
    /// The phase it is reported under.
    pub phase: String,
}

/// Parses a trace file's text (see the module documentation).
pub fn parse_trace(path: &Path, text: &str) -> Result<Vec<TraceEvent>, TraceBenchError> {
    let err = |line: usize, message: String| TraceBenchError::Parse {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if !(3..=4).contains(&f.len()) {
            return Err(err(i + 1, "want AT_MS SIZE HOLD_MS [PHASE]".into()));
        }
        let at_ms = f[0]
            .parse()
            .map_err(|e| err(i + 1, format!("AT_MS {:?}: {e}", f[0])))?;
        let size = parse_bytes(f[1]).map_err(|e| err(i + 1, format!("SIZE: {e}")))?;
        if size == 0 {
            return Err(err(i + 1, "SIZE: must be positive".into()));
        }
        let hold_ms = f[2]
            .parse()
            .map_err(|e| err(i + 1, format!("HOLD_MS {:?}: {e}", f[2])))?;
        let phase = f.get(3).unwrap_or(&"steady").to_string();
        out.push(TraceEvent {
            at_ms,
            size,
            hold_ms,
            phase,
        });
        if out.len() > MAX_EVENTS {
            return Err(err(i + 1, format!("more than {MAX_EVENTS} leases")));
        }
    }
    out.sort_by_key(|e| e.at_ms);
    Ok(out)
}

/// The built-in mixed trace: `steady` leases of 32M (40%), 64M (40%) and 128M (20%), one
/// every 25 ms held 60-140 ms; a `burst` of 24 64M leases within 50 ms held 400 ms; then
/// `steady` again. Deterministic (a fixed-seed generator).
pub fn mixed_trace(steady: usize) -> Vec<TraceEvent> {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let m = 1u64 << 20;
    let mut out = Vec::new();
    let mut t = 0;
    let mut steady_part = |out: &mut Vec<TraceEvent>, t: &mut u64| {
        for _ in 0..steady {
            let size = match next() % 10 {
                0..=3 => 32 * m,
                4..=7 => 64 * m,
                _ => 128 * m,
            };
            out.push(TraceEvent {
                at_ms: *t,
                size,
                hold_ms: 60 + next() % 81,
                phase: "steady".into(),
            });
            *t += 25;
        }
    };
    steady_part(&mut out, &mut t);
    for i in 0..24 {
        out.push(TraceEvent {
            at_ms: t + i * 2,
            size: 64 * m,
            hold_ms: 400,
            phase: "burst".into(),
        });
    }
    t += 600;
    steady_part(&mut out, &mut t);
    out
}

/// Per lease, the bytes the trace holds leased at its arrival and the leases of its size
/// held then, itself included (from the trace's own times, whatever the replay does).
pub fn held_at_arrival(events: &[TraceEvent]) -> Vec<(u64, u64)> {
    let mut live: Vec<(u64, u64)> = Vec::new();
    events
        .iter()
        .map(|e| {
            live.retain(|(end, _)| *end > e.at_ms);
            live.push((e.at_ms + e.hold_ms, e.size));
            let same = live.iter().filter(|l| l.1 == e.size).count() as u64;
            (live.iter().map(|l| l.1).sum(), same)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_lines_parse_and_errors_name_the_line() {
        let p = Path::new("t");
        let ev = parse_trace(p, "# c\n10 64M 100 burst\n0 32M 50\n").unwrap();
        assert_eq!(ev[0].at_ms, 0);
        assert_eq!(ev[0].phase, "steady");
        assert_eq!(ev[1].size, 64 << 20);
        let err = parse_trace(p, "0 32M\n").unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
        let err = parse_trace(p, "0 0 5\n").unwrap_err().to_string();
        assert!(err.contains("SIZE"), "{err}");
    }

    #[test]
    fn the_mixed_trace_has_a_burst() {
        let t = mixed_trace(100);
        assert_eq!(t.len(), 224);
        assert_eq!(t.iter().filter(|e| e.phase == "burst").count(), 24);
    }

    #[test]
    fn held_bytes_count_overlapping_leases_only() {
        let p = Path::new("t");
        let ev = parse_trace(p, "0 32M 100\n50 64M 100\n100 32M 10\n").unwrap();
        // The first lease ends at 100 ms, as the third arrives: not held with it.
        let m = 1 << 20;
        assert_eq!(
            held_at_arrival(&ev),
            vec![(32 * m, 1), (96 * m, 1), (96 * m, 1)]
        );
    }
}
