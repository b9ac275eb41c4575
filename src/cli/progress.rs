//! Progress of the long commands (`reserve`, `drain`, `libvirt-adopt` of several domains,
//! `bench vm-start`), for a person watching a terminal. It is drawn on stderr only: stdout
//! carries the results scripts parse, and stays byte for byte what it is without a terminal.
//! With `--json`, or a stderr that is no terminal (a pipe, a file, the journal), or
//! `TERM=dumb`, nothing is drawn at all.
//!
//! The commands decide what they count and when; a [`Progress`] only shows it. Log lines
//! (`tracing`, from the command or a daemon it runs in-process, as the benchmarks do) go
//! through [`StderrAroundProgress`], which takes the bar off the terminal for each line.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the elapsed time and the spinner move while the command waits (on the kernel,
/// the daemon or a VMM) without news.
const TICK: Duration = Duration::from_millis(120);

/// The bar on the terminal now (one at most), with the id of the [`Progress`] that drew it.
static ON_TERMINAL: Mutex<Option<(u64, ProgressBar)>> = Mutex::new(None);
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Whether progress is drawn for this process: the command has no reason to stay `quiet`
/// (`--json`, or work too small to watch), stderr is a terminal, and not a dumb one.
pub fn drawn(quiet: bool) -> bool {
    decide(
        quiet,
        std::io::stderr().is_terminal(),
        std::env::var_os("TERM").as_deref(),
    )
}

/// [`drawn`]'s rule, apart from the process it asks about.
fn decide(quiet: bool, stderr_is_terminal: bool, term: Option<&OsStr>) -> bool {
    !quiet && stderr_is_terminal && term != Some(OsStr::new("dumb"))
}

/// What a bar counts, which decides how its figures read.
#[derive(Debug, Clone, Copy)]
pub enum Unit {
    /// Bytes, shown in binary units (`1.50 GiB/4.00 GiB`).
    Bytes,
    /// Things of the named kind (`3/8 domains`).
    Count(&'static str),
}

/// A bar (or a spinner) on stderr, or nothing when [`drawn`] says so; cleared when dropped.
pub struct Progress {
    bar: ProgressBar,
    id: u64,
}

impl Progress {
    /// A bar of `total` in `unit`, drawn when [`drawn`]`(quiet)` holds.
    pub fn bar(quiet: bool, unit: Unit, total: u64) -> Progress {
        let figures = match unit {
            Unit::Bytes => "{bytes}/{total_bytes}".to_string(),
            Unit::Count(what) => format!("{{pos}}/{{len}} {what}"),
        };
        Progress::new(
            quiet,
            Some(total),
            &format!("{{spinner}} [{{elapsed_precise}}] {{bar:30}} {figures} {{msg}}"),
        )
    }

    /// A spinner with the elapsed time and a message, for work whose total is not known.
    pub fn spinner(quiet: bool) -> Progress {
        Progress::new(quiet, None, "{spinner} [{elapsed_precise}] {msg}")
    }

    fn new(quiet: bool, total: Option<u64>, template: &str) -> Progress {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        if !drawn(quiet) {
            return Progress {
                bar: ProgressBar::hidden(),
                id,
            };
        }
        let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        // Drawn at once, not at the ticker's first turn: work done sooner still showed.
        bar.tick();
        bar.enable_steady_tick(TICK);
        *on_terminal() = Some((id, bar.clone()));
        Progress { bar, id }
    }

    /// Starts the bar again at zero of `total`, saying what it now counts.
    pub fn restart(&self, total: u64, message: impl Into<Cow<'static, str>>) {
        self.bar.set_length(total);
        self.bar.set_position(0);
        self.bar.set_message(message);
    }

    /// Sets how much is done.
    pub fn set_position(&self, done: u64) {
        self.bar.set_position(done);
    }

    /// Adds `delta` to what is done.
    pub fn inc(&self, delta: u64) {
        self.bar.inc(delta);
    }

    /// Says what is being done.
    pub fn set_message(&self, message: impl Into<Cow<'static, str>>) {
        self.bar.set_message(message);
    }

    /// Runs `print` with the bar taken off the terminal, so lines it prints (on stdout or
    /// stderr) are not torn by the bar; the bar is drawn again below them.
    pub fn suspend<R>(&self, print: impl FnOnce() -> R) -> R {
        self.bar.suspend(print)
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        let mut shown = on_terminal();
        if shown.as_ref().is_some_and(|(id, _)| *id == self.id) {
            *shown = None;
        }
        drop(shown);
        self.bar.finish_and_clear();
    }
}

fn on_terminal() -> std::sync::MutexGuard<'static, Option<(u64, ProgressBar)>> {
    ON_TERMINAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `tracing`'s writer: stderr, each line written with the bar (if one is drawn) taken off
/// the terminal and drawn again below it, rather than torn through it.
#[derive(Debug, Clone, Copy, Default)]
pub struct StderrAroundProgress;

impl Write for StderrAroundProgress {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Cloned out: the lock is not held while another thread's line waits for the bar.
        let bar = on_terminal().as_ref().map(|(_, bar)| bar.clone());
        match bar {
            Some(bar) => bar.suspend(|| std::io::stderr().write_all(buf))?,
            None => std::io::stderr().write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for StderrAroundProgress {
    type Writer = StderrAroundProgress;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drawn_only_for_a_terminal_without_json_and_not_dumb() {
        let xterm = Some(OsStr::new("xterm-256color"));
        assert!(decide(false, true, xterm));
        assert!(decide(false, true, None));
        assert!(!decide(true, true, xterm), "--json");
        assert!(!decide(false, false, xterm), "stderr is no terminal");
        assert!(!decide(false, true, Some(OsStr::new("dumb"))), "TERM=dumb");
    }

    #[test]
    fn a_hidden_progress_takes_every_call() {
        // cargo test's stderr may be a terminal: --json hides it either way.
        let p = Progress::bar(true, Unit::Count("domains"), 3);
        p.set_message("adopting vm1");
        p.inc(1);
        p.restart(5, "again");
        p.set_position(5);
        assert_eq!(p.suspend(|| 7), 7);
        let s = Progress::spinner(true);
        s.set_message("waiting");
    }
}
