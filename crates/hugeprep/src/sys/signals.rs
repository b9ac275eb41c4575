//! Turning Ctrl-C and `SIGTERM` into a cancel flag, so that a one-shot command (`prepare`, a
//! benchmark) stops its workers between steps and rolls back (removes the half-filled file,
//! gives back borrowed pool pages) instead of dying with them in place.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use nix::sys::signal::{SigSet, Signal};

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Blocks `SIGINT`, `SIGTERM` and `SIGHUP` in the calling thread (call it before starting
/// other threads, which inherit the mask) and starts a thread that waits for them: the first
/// sets the returned flag, a second one exits at once with status 128 + signal. Calling it
/// again returns the same flag.
pub fn cancel_on_signals() -> std::io::Result<Arc<AtomicBool>> {
    if let Some(flag) = FLAG.get() {
        return Ok(flag.clone());
    }
    let mut set = SigSet::empty();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(sig);
    }
    set.thread_block().map_err(std::io::Error::from)?;
    let flag = FLAG
        .get_or_init(|| Arc::new(AtomicBool::new(false)))
        .clone();
    let seen = flag.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let Ok(sig) = set.wait() else { continue };
            if seen.swap(true, Ordering::SeqCst) {
                eprintln!("hugeprep: {sig} again: exiting without cleaning up");
                std::process::exit(128 + sig as i32);
            }
            eprintln!("hugeprep: {sig}: stopping and cleaning up (send again to exit at once)");
        })?;
    Ok(flag)
}
