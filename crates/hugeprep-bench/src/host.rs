//! A busy host for `bench recycle --host-processes N`: N extra processes, one in 50 of them
//! QEMU-like (64 threads and 200 descriptors each, as a VMM with vCPU, I/O and RCU threads
//! and its disks, sockets and eventfds), the rest small idle processes. Every process reads
//! one shared pipe and exits at its end: dropping the [`BusyHost`] closes it and reaps
//! every child, and a benchmark that dies leaves none behind either.

use std::io;
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The program whose hidden `bench busy-process` runs the benchmark's extra processes:
/// this one, or `HUGEPREP_BENCH_EXE` (a test names the hugeprep binary: it is no harness).
pub fn bench_exe() -> io::Result<std::path::PathBuf> {
    match std::env::var_os("HUGEPREP_BENCH_EXE") {
        Some(exe) => Ok(std::path::PathBuf::from(exe)),
        None => std::env::current_exe(),
    }
}

/// Threads of a QEMU-like process.
pub const VMM_THREADS: usize = 64;
/// Descriptors of a QEMU-like process.
pub const VMM_FDS: usize = 200;
/// One process in this many is QEMU-like.
pub const VMM_EVERY: usize = 50;

/// The extra processes.
#[derive(Debug)]
pub struct BusyHost {
    children: Vec<Child>,
    /// The pipe's write end: its close ends every child.
    keep: Option<OwnedFd>,
    /// Threads the children run.
    pub threads: usize,
}

impl BusyHost {
    /// Starts `n` processes and waits until they all run (`exe` is this program, whose
    /// hidden `bench busy-process` is the QEMU-like process).
    pub fn start(n: usize, exe: &std::path::Path) -> io::Result<BusyHost> {
        let (read, write) = nix::unistd::pipe().map_err(io::Error::from)?;
        let mut host = BusyHost {
            children: Vec::with_capacity(n),
            keep: Some(write),
            threads: 0,
        };
        let vmms = n.div_ceil(VMM_EVERY).min(n);
        for i in 0..n {
            let stdin = Stdio::from(read.try_clone()?);
            let child = if i < vmms {
                host.threads += VMM_THREADS;
                Command::new(exe)
                    .args(["bench", "busy-process", "--threads"])
                    .arg(VMM_THREADS.to_string())
                    .arg("--fds")
                    .arg(VMM_FDS.to_string())
                    .stdin(stdin)
                    .stdout(Stdio::null())
                    .spawn()?
            } else {
                host.threads += 1;
                Command::new("cat")
                    .stdin(stdin)
                    .stdout(Stdio::null())
                    .spawn()?
            };
            host.children.push(child);
        }
        drop(read);
        // The QEMU-like ones have started their threads once /proc lists them all.
        let deadline = Instant::now() + Duration::from_secs(60);
        for c in host.children.iter().take(vmms) {
            let task = format!("/proc/{}/task", c.id());
            while std::fs::read_dir(&task).map_or(0, |d| d.count()) < VMM_THREADS {
                if Instant::now() > deadline {
                    return Err(io::Error::other(format!(
                        "process {} did not start its {VMM_THREADS} threads",
                        c.id()
                    )));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Ok(host)
    }

    /// Processes started.
    pub fn processes(&self) -> usize {
        self.children.len()
    }
}

impl Drop for BusyHost {
    fn drop(&mut self) {
        drop(self.keep.take());
        for c in &mut self.children {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// A lessee flooding opens (`hugeprep bench busy-process --open PATH`): each of `threads`
/// threads opens and closes `path` in a loop until standard input ends.
pub fn flood_opens(threads: usize, path: &std::path::Path) -> io::Result<()> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handles = Vec::new();
    for _ in 0..threads {
        let stop = std::sync::Arc::clone(&stop);
        let path = path.to_path_buf();
        handles.push(std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::fs::File::open(&path);
            }
        }));
    }
    println!("flooding");
    let mut sink = Vec::new();
    let _ = io::Read::read_to_end(&mut io::stdin(), &mut sink);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

/// Another tenant (`hugeprep bench busy-process --time-opens PATH --count N`): opens its own
/// file `count` times, one after another, and prints each open's microseconds.
pub fn time_opens(path: &std::path::Path, count: usize) -> io::Result<()> {
    let mut out = String::new();
    for _ in 0..count {
        let t = Instant::now();
        drop(std::fs::File::open(path)?);
        out += &format!("{}\n", t.elapsed().as_secs_f64() * 1e6);
        std::thread::sleep(Duration::from_millis(2));
    }
    print!("{out}");
    Ok(())
}

/// The QEMU-like process (`hugeprep bench busy-process`): `fds` descriptors of /dev/null and
/// `threads` threads (the main one included), idle until its standard input ends.
pub fn busy_process(threads: usize, fds: usize) -> io::Result<()> {
    let mut files = Vec::with_capacity(fds);
    for _ in 0..fds.saturating_sub(3) {
        files.push(std::fs::File::open("/dev/null")?);
    }
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
    let mut handles = Vec::new();
    for _ in 1..threads {
        let rx = std::sync::Arc::clone(&rx);
        handles.push(std::thread::spawn(move || {
            let _ = rx.lock().map(|r| r.recv());
        }));
    }
    let mut sink = Vec::new();
    let _ = io::Read::read_to_end(&mut io::stdin(), &mut sink);
    drop(tx);
    for h in handles {
        let _ = h.join();
    }
    drop(files);
    Ok(())
}
