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
    }
}
