//! The cgroups of a process, and whether a cgroup has emptied.
//!
//! A process cannot leave its cgroups without privileges the host gives no VMM (write access
//! to the destination, and in cgroup v2 to the common ancestor), and its children start in
//! them: so once an opener of a lease file has exited and one of the cgroups it was in is
//! empty, nothing it started is left either. A cgroup at a hierarchy's root is shared by
//! everything and proves nothing, and so does a cgroup below a subtree delegated to the
//! opener's user (a `cgroup.procs` it may write, as in a systemd user session): it could have
//! moved its children out.
//!
//! A process's threads may sit in other cgroups than its main thread, which is all that
//! `/proc/PID/cgroup` shows, and a child forked by a thread starts in the thread's cgroup:
//! libvirt puts each vCPU thread in a `vcpuN` cgroup beside `emulator`. In cgroup v2 the
//! threads of a process stay inside one threaded subtree, so a v2 cgroup of type
//! `threaded` stands for its threaded domain (the nearest ancestor that is not threaded).
//! cgroup v1 puts no bound on where a thread is placed in a controller's hierarchy, so only
//! systemd's own `name=systemd` hierarchy, where systemd and libvirt place whole processes,
//! stands for a process there; the controllers' hierarchies prove nothing.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// One cgroup directory of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    /// The cgroup's directory under its hierarchy's mount.
    pub dir: PathBuf,
    /// cgroup v2 (`cgroup.events` says whether it is populated) or v1 (its `cgroup.procs`
    /// and its children's are read).
    pub v2: bool,
}

/// Where the cgroup hierarchies of this mount namespace are mounted.
#[derive(Debug, Default, Clone)]
pub struct Hierarchies {
    /// The cgroup v2 mount: (mount point, root of the mount within the hierarchy).
    v2: Option<(PathBuf, String)>,
    /// cgroup v1 mounts: (controllers or `name=...` in its options, mount point, root).
    v1: Vec<(Vec<String>, PathBuf, String)>,
}

impl Hierarchies {
    /// Reads `/proc/self/mountinfo`.
    pub fn detect() -> io::Result<Hierarchies> {
        let text = fs::read_to_string("/proc/self/mountinfo")?;
        let mut h = Hierarchies::default();
        for line in text.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            if l.len() < 5 || r.len() < 3 {
                continue;
            }
            let (root, point) = (l[3].to_string(), PathBuf::from(unescape(l[4])));
            match r[0] {
                "cgroup2" if h.v2.is_none() => h.v2 = Some((point, root)),
                "cgroup" => {
                    let names = r[2]
                        .split(',')
                        .filter(|o| !matches!(*o, "rw" | "ro") && !o.contains("relatime"))
                        .map(str::to_string)
                        .collect();
                    h.v1.push((names, point, root));
                }
                _ => {}
            }
        }
        Ok(h)
    }

    /// Where the cgroup v2 hierarchy is mounted, if it is.
    pub fn v2_mount(&self) -> Option<&Path> {
        self.v2.as_ref().map(|(point, _)| point.as_path())
    }

    /// The cgroups `pid` is in that hold it: leaving out the root of each hierarchy and any
    /// cgroup that the process's user may move processes out of ([`delegated`]).
    /// A v2 cgroup of type `threaded` is replaced by its threaded domain, and v1 cgroups
    /// count only in the `name=systemd` hierarchy (see the module's notes).
    pub fn containing(&self, pid: u32) -> io::Result<Vec<Cgroup>> {
        let uids = uids(pid)?;
        let mut out = Vec::new();
        for cg in self.of_process(pid)? {
            let Some(cg) = self.whole_process(cg)? else {
                continue;
            };
            if !delegated(&cg, &uids)? && !out.contains(&cg) {
                out.push(cg);
            }
        }
        Ok(out)
    }

    /// The cgroup that holds every thread of a process whose main thread is in `cg`, and
    /// what they fork; `None` where none below the hierarchy's root is known to.
    fn whole_process(&self, cg: Cgroup) -> io::Result<Option<Cgroup>> {
        if !cg.v2 {
            let systemd = self
                .v1
                .iter()
                .find(|(names, _, _)| names.iter().any(|n| n == "name=systemd"));
            return Ok(systemd
                .filter(|(_, point, _)| cg.dir.starts_with(point))
                .map(|_| cg));
        }
        let Some(point) = self.v2_mount() else {
            return Ok(None);
        };
        let mut dir = cg.dir;
        loop {
            let kind = fs::read_to_string(dir.join("cgroup.type"))?;
            if kind.trim() != "threaded" {
                return Ok(Some(Cgroup { dir, v2: true }));
            }
            match dir.parent() {
                Some(up) if up != point && up.starts_with(point) => dir = up.to_path_buf(),
                // A threaded subtree whose domain is the hierarchy's root.
                _ => return Ok(None),
            }
        }
    }

    /// The cgroups `pid` is in, leaving out the root of each hierarchy.
    pub fn of_process(&self, pid: u32) -> io::Result<Vec<Cgroup>> {
        let text = fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
        let mut out = Vec::new();
        for line in text.lines() {
            let mut f = line.splitn(3, ':');
            let (Some(_id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let found = if controllers.is_empty() {
                self.v2.as_ref().map(|(point, root)| (point, root, true))
            } else {
                let first = controllers.split(',').next().unwrap_or_default();
                self.v1
                    .iter()
                    .find(|(names, _, _)| names.iter().any(|n| n == first))
                    .map(|(_, point, root)| (point, root, false))
            };
            let Some((point, root, v2)) = found else {
                continue;
            };
            if let Some(dir) = below(point, root, path) {
                out.push(Cgroup { dir, v2 });
            }
        }
        Ok(out)
    }
}

/// The directory of the cgroup `path` of a hierarchy mounted at `point` from `root`; `None`
/// for the hierarchy's root (or the mount's) and for paths the mount does not show.
fn below(point: &Path, root: &str, path: &str) -> Option<PathBuf> {
    let rel = if root == "/" {
        path.strip_prefix('/')?
    } else {
        path.strip_prefix(root)?.strip_prefix('/')?
    };
    if rel.is_empty() || rel.split('/').any(|c| c == ".." || c == ".") {
        return None;
    }
    Some(point.join(rel))
}

/// The real, effective, saved and filesystem uids of `pid`.
pub(super) fn uids(pid: u32) -> io::Result<Vec<u32>> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .ok_or_else(|| io::Error::other(format!("/proc/{pid}/status has no Uid line")))?;
    line.split_whitespace()
        .map(|u| {
            u.parse()
                .map_err(|_| io::Error::other(format!("/proc/{pid}/status: bad uid {u:?}")))
        })
        .collect()
}

/// Whether a process with `uids` may write `cgroup.procs` of `cg` or of an ancestor below
/// the hierarchy's mount (a delegated subtree, or a world-writable one): it could then move
/// processes between cgroups, and an empty cgroup would not prove them gone.
fn delegated(cg: &Cgroup, uids: &[u32]) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let mut dir = Some(cg.dir.as_path());
    while let Some(d) = dir {
        let procs = d.join("cgroup.procs");
        let meta = match fs::metadata(&procs) {
            Ok(m) => m,
            // Above the hierarchy's mount point: no cgroup.procs, the walk is over.
            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
            Err(e) => return Err(e),
        };
        let owned = meta.uid() != 0 && uids.contains(&meta.uid()) && meta.mode() & 0o200 != 0;
        if owned || meta.mode() & 0o002 != 0 {
            return Ok(true);
        }
        dir = d.parent();
    }
    Ok(false)
}

/// mountinfo escapes spaces and a few other bytes as `\ooo`.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v as char);
                i += 4;
                continue;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

impl Cgroup {
    /// Whether no process is left in the cgroup or below it (a removed cgroup is empty).
    pub fn is_empty(&self) -> io::Result<bool> {
        if self.v2 {
            return match fs::read_to_string(self.dir.join("cgroup.events")) {
                Ok(text) => Ok(text.lines().any(|l| l.trim() == "populated 0")),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
                Err(e) => Err(e),
            };
        }
        v1_empty(&self.dir, 0)
    }
}

/// cgroup v1 has no `populated` flag: every directory below must list no process.
fn v1_empty(dir: &Path, depth: u32) -> io::Result<bool> {
    if depth > 64 {
        return Err(io::Error::other("cgroup tree deeper than 64 levels"));
    }
    match fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(procs) if !procs.trim().is_empty() => return Ok(false),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e),
    }
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() && !v1_empty(&entry.path(), depth + 1)? {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hierarchy_root_proves_nothing_and_paths_stay_below_the_mount() {
        let p = Path::new("/sys/fs/cgroup");
        assert_eq!(below(p, "/", "/"), None);
        assert_eq!(below(p, "/", "/a/b"), Some(p.join("a/b")));
        assert_eq!(below(p, "/a", "/a"), None);
        assert_eq!(below(p, "/a", "/a/b"), Some(p.join("b")));
        assert_eq!(below(p, "/a", "/ab"), None);
        assert_eq!(below(p, "/", "/a/../b"), None);
        assert_eq!(unescape("/a\\040b"), "/a b");
    }

    /// A threaded cgroup stands for its threaded domain: a thread moved to a sibling
    /// threaded cgroup forks children there.
    #[test]
    fn a_threaded_cgroup_stands_for_its_domain() {
        let h = Hierarchies::detect().unwrap();
        let Some(point) = h.v2_mount() else { return };
        let domain = point.join(format!("hugeprep-unit-threaded-{}", std::process::id()));
        let _ = fs::create_dir(&domain);
        let Ok(()) = fs::create_dir(domain.join("emulator")) else {
            let _ = fs::remove_dir(&domain);
            return; // not root
        };
        let made = fs::write(domain.join("emulator/cgroup.type"), "threaded");
        let found = h.whole_process(Cgroup {
            dir: domain.join("emulator"),
            v2: true,
        });
        let _ = fs::remove_dir(domain.join("emulator"));
        let _ = fs::remove_dir(&domain);
        made.unwrap();
        assert_eq!(
            found.unwrap(),
            Some(Cgroup {
                dir: domain,
                v2: true
            })
        );
    }

    #[test]
    fn this_process_has_readable_cgroups() {
        let h = Hierarchies::detect().unwrap();
        for cg in h.of_process(std::process::id()).unwrap() {
            assert!(!cg.is_empty().unwrap(), "{cg:?} holds this process");
        }
    }
}
