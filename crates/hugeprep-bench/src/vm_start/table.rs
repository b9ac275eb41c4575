//! What the hot-plug and migration reports share: the pairing of cases per repetition,
//! the table's head and its cells, and the skipped sizes.

use crate::Summary;
use hugeprep::page_size::PageSize;
use hugeprep::units::format_bytes;

/// The samples measured for `case`; `samples[i]` belong to `cases[i]` (empty when `case`
/// did not run).
pub(super) fn samples_of<'a, C: PartialEq, S>(
    cases: &[C],
    samples: &'a [Vec<S>],
    case: C,
) -> &'a [S] {
    cases
        .iter()
        .position(|c| *c == case)
        .map(|i| samples[i].as_slice())
        .unwrap_or(&[])
}

/// `f(a[i], b[i])` per repetition, summarised (`None` when nothing was measured).
pub(super) fn paired(a: &[f64], b: &[f64], f: impl Fn(f64, f64) -> f64) -> Option<Summary> {
    let v: Vec<f64> = a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect();
    Summary::of(&v)
}

/// The table's first lines: what was timed, with how many threads and repetitions, and
/// the machine's load average before and after.
pub(super) fn head(
    what: &str,
    threads: usize,
    reps: usize,
    load_average: (Option<f64>, Option<f64>),
) -> String {
    let load = |l: Option<f64>| l.map_or("-".into(), |l| format!("{l:.1}"));
    format!(
        "{what}, {threads} threads, {reps} reps; seconds, median (min-max)\nload average {} before, {} after\n",
        load(load_average.0),
        load(load_average.1)
    )
}

/// A cell: median (min-max), in seconds or as a ratio.
pub(super) fn cell(x: &Summary) -> String {
    format!("{:.4} ({:.4}-{:.4})", x.median, x.min, x.max)
}

/// The line that starts one size's rows.
pub(super) fn size_head(size: u64, page_size: PageSize) -> String {
    format!("\n{} of {} pages\n", format_bytes(size), page_size)
}

/// Whether a target was met, as the table says it.
pub(super) fn met(yes: bool) -> &'static str {
    if yes {
        "met"
    } else {
        "NOT met"
    }
}

/// A line `{what}: {item}` per item (the skipped sizes, what was not measured).
pub(super) fn lines(out: &mut String, what: &str, items: &[String]) {
    for item in items {
        out.push_str(&format!("{what}: {item}\n"));
    }
}

/// Logs and keeps why a size is left out of the run.
pub(super) fn skip(skipped: &mut Vec<String>, log: &dyn Fn(&str), why: String) {
    log(&format!("skipped {why}"));
    skipped.push(why);
}
