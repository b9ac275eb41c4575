//! Which other processes still hold a pool file open or mapped. A released file that some
//! process can still reach is never recycled (it would see the next lease's data): it is
//! deleted instead, and its pages go back to the kernel once that process lets go.

use std::fs;
use std::os::unix::fs::MetadataExt;

/// `major:minor` as `/proc/PID/maps` prints a device number.
fn maps_dev(dev: u64) -> String {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    format!("{major:02x}:{minor:02x}")
}

/// Pids (other than this process) that have the inode `(dev, ino)` open or mapped.
pub fn other_holders(dev: u64, ino: u64) -> Vec<u32> {
    let me = std::process::id();
    let dev_text = maps_dev(dev);
    let ino_text = ino.to_string();
    let mut out = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return out;
    };
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
        let mapped = fs::read_to_string(base.join("maps")).is_ok_and(|maps| {
            maps.lines().any(|l| {
                let mut f = l.split_whitespace().skip(3);
                f.next() == Some(dev_text.as_str()) && f.next() == Some(ino_text.as_str())
            })
        });
        let open = || {
            fs::read_dir(base.join("fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    fs::metadata(fd.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino)
                })
            })
        };
        if mapped || open() {
            out.push(pid);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_holding_a_file_is_found() {
        let path = std::env::temp_dir().join(format!("hugeprep-holders-{}", std::process::id()));
        fs::write(&path, b"x").unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert!(other_holders(meta.dev(), meta.ino()).is_empty());
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("exec 3<{}; sleep 30", path.display()))
            .spawn()
            .unwrap();
        let mut found = false;
        for _ in 0..100 {
            if other_holders(meta.dev(), meta.ino()).contains(&child.id()) {
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
