//! Which other processes still hold a pool file open or mapped. A released file that some
//! process can still reach is never recycled (it would see the next lease's data): it is
//! deleted instead, and its pages go back to the kernel once that process lets go.
//!
//! One scan of `/proc` reads every process's mappings and open files, so the worker takes a
//! [`Snapshot`] of all pool files at once and reuses it for every file that was already out
//! of reach when the scan began: a released file has no path its last owner can open and is
//! owned by the daemon, so a process that did not hold it then cannot hold it later.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::os::fd::AsRawFd;
use std::time::Instant;

use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;

/// `major:minor` as `/proc/PID/maps` prints a device number.
fn maps_dev(dev: u64) -> String {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    format!("{major:02x}:{minor:02x}")
}

/// Who (other than this process) held which files of some devices, at one moment.
#[derive(Debug)]
pub struct Snapshot {
    began: Instant,
    devs: BTreeSet<u64>,
    held: HashMap<(u64, u64), Vec<u32>>,
}

impl Snapshot {
    /// Scans `/proc` once for files on `devs` that other processes have open or mapped.
    pub fn take(devs: &BTreeSet<u64>) -> Snapshot {
        let began = Instant::now();
        let mut held: HashMap<(u64, u64), Vec<u32>> = HashMap::new();
        let me = std::process::id();
        let dev_texts: HashMap<String, u64> = devs.iter().map(|&d| (maps_dev(d), d)).collect();
        let Ok(procs) = fs::read_dir("/proc") else {
            return Snapshot {
                began,
                devs: devs.clone(),
                held,
            };
        };
        let mut maps = String::new();
        for entry in procs.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if pid == me {
                continue;
            }
            let base = entry.path();
            let mut found = BTreeSet::new();
            maps.clear();
            if let Ok(mut f) = fs::File::open(base.join("maps")) {
                use std::io::Read;
                let _ = f.read_to_string(&mut maps);
            }
            for line in maps.lines() {
                let mut f = line.split_whitespace().skip(3);
                let (Some(dev), Some(ino)) = (f.next(), f.next()) else {
                    continue;
                };
                if let (Some(&dev), Ok(ino)) = (dev_texts.get(dev), ino.parse::<u64>()) {
                    found.insert((dev, ino));
                }
            }
            // Each descriptor is stat'ed relative to the open `fd` directory: no path walk
            // through /proc per descriptor.
            if let Ok(dir) = fs::File::open(base.join("fd")) {
                if let Ok(fds) = fs::read_dir(base.join("fd")) {
                    for fd in fds.flatten() {
                        let name = fd.file_name();
                        let st = fstatat(Some(dir.as_raw_fd()), name.as_os_str(), AtFlags::empty());
                        if let Ok(st) = st {
                            let dev = st.st_dev;
                            if devs.contains(&dev) {
                                found.insert((dev, st.st_ino));
                            }
                        }
                    }
                }
            }
            for key in found {
                held.entry(key).or_default().push(pid);
            }
        }
        Snapshot {
            began,
            devs: devs.clone(),
            held,
        }
    }

    /// Whether the scan looked at files of `dev`.
    pub fn covers(&self, dev: u64) -> bool {
        self.devs.contains(&dev)
    }

    /// When the scan began: it speaks for every file out of reach before then.
    pub fn began(&self) -> Instant {
        self.began
    }

    /// The pids that held the inode `(dev, ino)` when the scan ran.
    pub fn holders(&self, dev: u64, ino: u64) -> &[u32] {
        self.held.get(&(dev, ino)).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_child_holding_a_file_is_found() {
        let path = std::env::temp_dir().join(format!("hugeprep-holders-{}", std::process::id()));
        fs::write(&path, b"x").unwrap();
        let meta = fs::metadata(&path).unwrap();
        let holders = || {
            Snapshot::take(&BTreeSet::from([meta.dev()]))
                .holders(meta.dev(), meta.ino())
                .to_vec()
        };
        assert!(holders().is_empty());
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("exec 3<{}; sleep 30", path.display()))
            .spawn()
            .unwrap();
        let mut found = false;
        for _ in 0..100 {
            if holders().contains(&child.id()) {
                found = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        fs::remove_file(&path).unwrap();
        assert!(found);
    }
}
