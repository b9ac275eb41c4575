//! A record of every change this process makes to the kernel's hugepage pools, kept only when
//! `HUGEPREP_POOL_LEDGER` names a file.
//!
//! The pools are machine-wide and other processes change them at any time, so "the pools are
//! as they were before" proves nothing on a shared host: a VM started beside a test run makes
//! a leak-free run look leaky, and one stopped beside it hides a leak. The ledger holds deltas
//! instead: each write appends one line, `<page size in kB> <signed change> <pid> <what>`, and
//! a run that gave back all it took sums to zero for every page size (`scripts/test` checks
//! that; `scripts/gigantic-pages` writes the same lines). Appends of one short line are
//! atomic (`O_APPEND`), so daemons, CLIs and scripts can share one file.
//!
//! A ledger that cannot be written never fails the pool change: it is said once on stderr
//! and the leak check then finds the sums off.

use std::fs::OpenOptions;
use std::io::Write;
use std::sync::Once;

use crate::page_size::PageSize;

/// The environment variable naming the ledger file.
pub const ENV: &str = "HUGEPREP_POOL_LEDGER";

/// Records that the pool of `page_size` changed by `delta` pages (`what`: the pool's scope).
pub(crate) fn record(page_size: PageSize, delta: i64, what: &str) {
    if delta == 0 {
        return;
    }
    let Some(path) = std::env::var_os(ENV).filter(|p| !p.is_empty()) else {
        return;
    };
    let line = line(page_size, delta, std::process::id(), what);
    let written = OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        static SAID: Once = Once::new();
        SAID.call_once(|| {
            eprintln!(
                "hugeprep: {ENV}={}: cannot record a pool change ({line:?}): {e}",
                std::path::Path::new(&path).display()
            )
        });
    }
}

/// One ledger line: `<kB> <delta> <pid> <what>\n`, `what` without whitespace.
fn line(page_size: PageSize, delta: i64, pid: u32, what: &str) -> String {
    let what: String = what
        .chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .collect();
    format!("{} {delta:+} {pid} {what}\n", page_size.kib())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_four_fields() {
        assert_eq!(
            line(PageSize::Size2M, 12, 7, "node 0"),
            "2048 +12 7 node_0\n"
        );
        assert_eq!(
            line(PageSize::Size1G, -2, 7, "system"),
            "1048576 -2 7 system\n"
        );
    }
}
