//! Load for tests and benchmarks: one busy-looping process per CPU, as an ordinary tenant's
//! work would keep the host busy.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One busy-looping `sh` per CPU, at nice 0 whatever the caller runs at; killed (by pid)
/// and reaped on drop.
#[derive(Debug)]
pub struct CpuHog {
    children: Vec<Child>,
}

impl CpuHog {
    /// Starts `n` hogs.
    pub fn start(n: usize) -> std::io::Result<CpuHog> {
        let mut hog = CpuHog {
            children: Vec::with_capacity(n),
        };
        for _ in 0..n {
            let child = Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            // Children inherit the spawning thread's nice value: make them ordinary.
            let _ = hugeprep::sys::priority::set_process_nice(child.id(), 0);
            hog.children.push(child);
        }
        // Let them reach their loop before anything is timed.
        std::thread::sleep(Duration::from_millis(100));
        Ok(hog)
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
