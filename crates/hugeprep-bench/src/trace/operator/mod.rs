//! An operator's own VM trace (docs/pool.md, "An operator's trace"): a CSV file of VM starts
//! and stops, one event a line,
//!
//! ```text
//! time,vm,event,memory,page_size,node
//! 2026-11-23T08:00:00.000Z,web-1,start,4G,2M,0
//! 2026-11-23T09:30:00.000Z,web-1,stop,,,
//! ```
//!
//! `time` is RFC 3339 (`Z` or an offset, which is kept as the local wall clock the forecast
//! reads the hour from) or seconds since the epoch; `vm` a name or UUID (no comma); `event`
//! `start` or `stop`; `memory` the VM's memory (`4G`, `4096M`, bytes), needed on a start;
//! `page_size` `2M` (the default) or `1G`; `node` a NUMA node (kept, not replayed yet). A
//! line starting with `#` and a header line starting with `time` are skipped. Lines may come
//! in any order; a stop pairs with the VM's latest start before it. A VM still running at
//! the end runs to the end; a stop without a start (the VM ran before the capture) is
//! skipped and counted.
//!
//! [`convert`] makes such a file from libvirt's lifecycle events or the daemon's log.

pub mod convert;
pub mod time;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::week::generate::VmLife;
use hugeprep::page_size::PageSize;
use hugeprep::units::parse_bytes;

/// The most lines a trace file may have.
pub const MAX_LINES: usize = 1_000_000;

/// An operator's trace is unusable.
#[derive(Debug, thiserror::Error)]
pub enum OperatorTraceError {
    /// A line is wrong.
    #[error("{path} line {line}: {field}: {message}")]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// The field at fault.
        field: &'static str,
        /// What is wrong, and what is wanted.
        message: String,
    },
    /// The file is too long.
    #[error("{path}: more than {MAX_LINES} lines")]
    TooLong {
        /// The file.
        path: PathBuf,
    },
}

/// One line of an operator's trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Seconds since the epoch, as the local wall clock.
    pub at_s: f64,
    /// The VM's name or UUID.
    pub vm: String,
    /// A start (`true`) or a stop.
    pub start: bool,
    /// The VM's memory, bytes (starts).
    pub bytes: Option<u64>,
    /// Its page size.
    pub page_size: PageSize,
    /// Its node.
    pub node: Option<u32>,
}

impl Event {
    /// The event as a CSV line (no newline).
    pub fn to_csv(&self) -> String {
        format!(
            "{},{},{},{},{},{}",
            time::format_rfc3339(self.at_s),
            self.vm,
            if self.start { "start" } else { "stop" },
            self.bytes.map_or(String::new(), |b| b.to_string()),
            self.page_size.name(),
            self.node.map_or(String::new(), |n| n.to_string())
        )
    }
}

/// Events as a CSV file, header first.
pub fn to_csv(events: &[Event]) -> String {
    let mut out = String::from("time,vm,event,memory,page_size,node\n");
    for e in events {
        let _ = writeln!(out, "{}", e.to_csv());
    }
    out
}

/// Parses a trace file's text.
pub fn parse(path: &Path, text: &str) -> Result<Vec<Event>, OperatorTraceError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        if i >= MAX_LINES {
            return Err(OperatorTraceError::TooLong {
                path: path.to_path_buf(),
            });
        }
        let err = |field: &'static str, message: String| OperatorTraceError::Line {
            path: path.to_path_buf(),
            line: i + 1,
            field,
            message,
        };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("time") {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if !(3..=6).contains(&f.len()) {
            return Err(err(
                "line",
                format!(
                    "{} fields; want time,vm,event[,memory[,page_size[,node]]]",
                    f.len()
                ),
            ));
        }
        let at_s = time::parse_time(f[0]).map_err(|m| err("time", m))?;
        if f[1].is_empty() || f[1].len() > 256 {
            return Err(err("vm", "want a name or UUID of 1 to 256 bytes".into()));
        }
        let start = match f[2] {
            "start" => true,
            "stop" => false,
            other => return Err(err("event", format!("{other:?}: want start or stop"))),
        };
        let bytes = match f.get(3).copied().filter(|s| !s.is_empty()) {
            Some(s) => Some(
                parse_bytes(s)
                    .ok()
                    .filter(|b| *b > 0)
                    .ok_or_else(|| err("memory", format!("{s:?}: want a size such as 4G")))?,
            ),
            None if start => return Err(err("memory", "a start needs the VM's memory".into())),
            None => None,
        };
        let page_size = match f.get(4).copied().filter(|s| !s.is_empty()) {
            Some(s) => s
                .parse::<PageSize>()
                .map_err(|e| err("page_size", format!("{s:?}: {e}")))?,
            None => PageSize::Size2M,
        };
        if let Some(b) = bytes {
            if b % page_size.bytes() != 0 {
                return Err(err(
                    "memory",
                    format!("{b} bytes is not a whole number of {page_size} pages"),
                ));
            }
        }
        let node = match f.get(5).copied().filter(|s| !s.is_empty()) {
            Some(s) => Some(
                s.parse::<u32>()
                    .map_err(|e| err("node", format!("{s:?}: {e}")))?,
            ),
            None => None,
        };
        out.push(Event {
            at_s,
            vm: f[1].to_string(),
            start,
            bytes,
            page_size,
            node,
        });
    }
    Ok(out)
}

/// The VMs' lives of a trace, sorted by start, and how many stops had no start.
pub fn lives(events: &[Event]) -> (Vec<VmLife>, usize) {
    let mut sorted: Vec<&Event> = events.iter().collect();
    // Stable: at one instant, lines keep their order.
    sorted.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let end = sorted.last().map_or(0.0, |e| e.at_s);
    let mut running: BTreeMap<&str, VmLife> = BTreeMap::new();
    let mut out = Vec::new();
    let mut orphans = 0;
    for e in sorted {
        if e.start {
            let life = VmLife {
                at_s: e.at_s,
                bytes: e.bytes.unwrap_or(0),
                lead_s: 0.0,
                page_size: e.page_size,
                life_s: 0.0,
                kind: "operator",
            };
            // A second start without a stop: the first life ends here.
            if let Some(mut prev) = running.insert(&e.vm, life) {
                prev.life_s = e.at_s - prev.at_s;
                out.push(prev);
            }
        } else if let Some(mut life) = running.remove(e.vm.as_str()) {
            life.life_s = e.at_s - life.at_s;
            out.push(life);
        } else {
            orphans += 1;
        }
    }
    for (_, mut life) in running {
        life.life_s = end - life.at_s;
        out.push(life);
    }
    out.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    (out, orphans)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_trace_parses_pairs_and_names_the_field_at_fault() {
        let text = "time,vm,event,memory,page_size,node\n\
                    # a comment\n\
                    2026-11-23T08:00:00Z,web-1,start,4G,2M,0\n\
                    1795420800.5,db,start,32G,1G,\n\
                    2026-11-23T09:30:00.250Z,web-1,stop,,,\n\
                    2026-11-23T10:00:00Z,gone,stop,,,\n";
        let ev = parse(Path::new("t.csv"), text).unwrap();
        assert_eq!(ev.len(), 4);
        assert_eq!(ev[1].page_size, PageSize::Size1G);
        let (lives, orphans) = lives(&ev);
        assert_eq!(orphans, 1);
        assert_eq!(lives.len(), 2);
        assert_eq!(lives[0].bytes, 4 * GIB);
        assert!(
            (lives[0].life_s - 5400.25).abs() < 1e-6,
            "{}",
            lives[0].life_s
        );
        // db runs to the end of the trace.
        assert_eq!(lives[1].bytes, 32 * GIB);
        // Written and read back: the same events.
        let again = parse(Path::new("t.csv"), &to_csv(&ev)).unwrap();
        assert_eq!(again, ev);
        for (line, field) in [
            ("yesterday,a,start,1G", "time"),
            ("0,a,begin,1G", "event"),
            ("0,a,start", "memory"),
            ("0,a,start,3M,2M", "memory"),
            ("0,a,start,1G,4M", "page_size"),
            ("0,a,start,1G,2M,x", "node"),
            ("0,a", "line"),
        ] {
            match parse(Path::new("t.csv"), line) {
                Err(OperatorTraceError::Line {
                    field: f, line: 1, ..
                }) => {
                    assert_eq!(f, field, "{line}")
                }
                other => panic!("{line}: {other:?}"),
            }
        }
    }
}
