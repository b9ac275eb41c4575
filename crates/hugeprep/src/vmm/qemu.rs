//! QEMU: `-object memory-backend-file` on a prepared file.
//!
//! QEMU reuses an existing file's pages when `mem-path` names the FILE (not a directory) and
//! `share=on`; it never truncates, unlinks or re-zeroes an existing file, and accepts a file
//! larger than `size`. `prealloc` stays off: the pages are already present.

use super::GuestMemoryFile;

/// The `-object` value for a memory backend on `mem`.
///
/// ```
/// use hugeprep::vmm::{qemu, GuestMemoryFile};
/// use std::path::Path;
/// let mem = GuestMemoryFile { id: "mem0", path: Path::new("/dev/hugepages/vm1"), size: 1 << 30, node: Some(0) };
/// assert_eq!(
///     qemu::memory_backend_object(&mem),
///     "memory-backend-file,id=mem0,size=1073741824,mem-path=/dev/hugepages/vm1,share=on,prealloc=off,host-nodes=0,policy=bind"
/// );
/// ```
pub fn memory_backend_object(mem: &GuestMemoryFile<'_>) -> String {
    let mut s = format!(
        "memory-backend-file,id={},size={},mem-path={},share=on,prealloc=off",
        mem.id,
        mem.size,
        escape_commas(&mem.path.to_string_lossy())
    );
    if let Some(node) = mem.node {
        s.push_str(&format!(",host-nodes={node},policy=bind"));
    }
    s
}

/// The command-line arguments that give a machine `mem` as its RAM
/// (`-object ... -machine memory-backend=ID`).
pub fn memory_args(mem: &GuestMemoryFile<'_>) -> Vec<String> {
    vec![
        "-object".into(),
        memory_backend_object(mem),
        "-machine".into(),
        format!("memory-backend={}", mem.id),
    ]
}

/// `-m` for `bytes` of guest RAM: QEMU requires it to equal the sum of the backends' sizes.
pub fn ram_size_args(bytes: u64) -> Vec<String> {
    vec!["-m".into(), format!("{}M", bytes >> 20)]
}

/// The arguments that give a machine `mem` as its only RAM: `-m`, the backend and
/// `-machine memory-backend=ID`.
pub fn machine_args(mem: &GuestMemoryFile<'_>) -> Vec<String> {
    let mut args = ram_size_args(mem.size);
    args.extend(memory_args(mem));
    args
}

/// The arguments that give a machine one guest NUMA node per entry of `mems`, in order
/// (`-numa node,nodeid=I,memdev=ID`), each backed by its file, and `-m` as their sum.
///
/// ```
/// use hugeprep::vmm::{qemu, GuestMemoryFile};
/// use std::path::Path;
/// let a = GuestMemoryFile { id: "mem0", path: Path::new("/hp/a"), size: 1 << 30, node: Some(0) };
/// let b = GuestMemoryFile { id: "mem1", path: Path::new("/hp/b"), size: 1 << 30, node: Some(1) };
/// let args = qemu::numa_args(&[a, b]);
/// assert_eq!(args[..2], ["-m", "2048M"]);
/// assert_eq!(args[5], "node,nodeid=0,memdev=mem0");
/// assert_eq!(args[9], "node,nodeid=1,memdev=mem1");
/// ```
pub fn numa_args(mems: &[GuestMemoryFile<'_>]) -> Vec<String> {
    let mut args = ram_size_args(mems.iter().map(|m| m.size).sum());
    for (i, mem) in mems.iter().enumerate() {
        args.extend([
            "-object".into(),
            memory_backend_object(mem),
            "-numa".into(),
            format!("node,nodeid={i},memdev={}", mem.id),
        ]);
    }
    args
}

/// `args` as one line a POSIX shell splits back into the same words: a word with anything
/// but `[A-Za-z0-9,._+:@%/=-]` is single-quoted (a lease name may hold spaces or quotes).
pub fn shell_line(args: &[String]) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || ",._+:@%/=-".contains(c);
    args.iter()
        .map(|a| {
            if !a.is_empty() && a.chars().all(safe) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// QEMU option values separate fields by commas; a literal comma is written twice.
fn escape_commas(s: &str) -> String {
    s.replace(',', ",,")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn commas_in_paths_are_doubled_and_machine_uses_the_backend() {
        let mem = GuestMemoryFile {
            id: "ram",
            path: Path::new("/hp/a,b"),
            size: 2 << 20,
            node: None,
        };
        let args = memory_args(&mem);
        assert_eq!(
            args[1],
            "memory-backend-file,id=ram,size=2097152,mem-path=/hp/a,,b,share=on,prealloc=off"
        );
        assert_eq!(args[3], "memory-backend=ram");
        assert_eq!(machine_args(&mem)[..2], ["-m", "2M"]);
    }

    #[test]
    fn shell_line_quotes_only_what_a_shell_would_split() {
        let args = ["-object".to_string(), "mem-path=/hp/it's a vm".to_string()];
        assert_eq!(shell_line(&args), "-object 'mem-path=/hp/it'\\''s a vm'");
    }
}
