//! NUMA memory policy: binding a mapping or the calling thread's allocations to one node
//! (`mbind`, `set_mempolicy`) and asking which node holds a page (`get_mempolicy`).
//!
//! libc exports the constants but not the calls, so these are `libc::syscall` wrappers.

use crate::sys::mmap::MmapRegion;

/// Bits in the node masks passed to the kernel: enough for any machine Linux supports
/// (`CONFIG_NODES_SHIFT` is at most 10).
const MASK_BITS: usize = 1024;
const MASK_WORDS: usize = MASK_BITS / (8 * std::mem::size_of::<libc::c_ulong>());
/// `get_mempolicy` flags from `linux/mempolicy.h` (not in libc).
const MPOL_F_NODE: libc::c_ulong = 1;
const MPOL_F_ADDR: libc::c_ulong = 1 << 1;
/// `mbind`'s flag: move the pages only this process maps (`linux/mempolicy.h`).
const MPOL_MF_MOVE: libc::c_uint = 1 << 1;

/// A memory-policy call failed.
#[derive(Debug, thiserror::Error)]
#[error("{call} for node {node}: {source}")]
pub struct NumaError {
    /// The system call.
    pub call: &'static str,
    /// The node asked for.
    pub node: u32,
    /// The kernel's answer (`EINVAL` for a node that does not exist or has no memory).
    pub source: std::io::Error,
}

fn node_mask(node: u32) -> Result<[libc::c_ulong; MASK_WORDS], std::io::Error> {
    let bits = 8 * std::mem::size_of::<libc::c_ulong>();
    let node = node as usize;
    if node >= MASK_BITS {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut mask = [0; MASK_WORDS];
    mask[node / bits] = 1 << (node % bits);
    Ok(mask)
}

fn check(call: &'static str, node: u32, ret: libc::c_long) -> Result<(), NumaError> {
    if ret == 0 {
        Ok(())
    } else {
        Err(NumaError {
            call,
            node,
            source: std::io::Error::last_os_error(),
        })
    }
}

/// Binds `len` bytes of `region` from `offset` to `node` (`mbind(MPOL_BIND |
/// MPOL_F_STATIC_NODES)`): every page faulted in that range afterwards comes from `node` or
/// the fault fails (`MADV_POPULATE_WRITE` then returns `ENOMEM`). Pages already present are
/// not moved.
pub fn bind_region(
    region: &MmapRegion,
    offset: usize,
    len: usize,
    node: u32,
) -> Result<(), NumaError> {
    let err = |source| NumaError {
        call: "mbind",
        node,
        source,
    };
    let mask = node_mask(node).map_err(err)?;
    if offset
        .checked_add(len)
        .map_or(true, |end| end > region.len())
    {
        return Err(err(std::io::Error::from_raw_os_error(libc::EINVAL)));
    }
    // SAFETY: the range lies inside a mapping owned by `region` (checked above); mbind only
    // changes the mapping's allocation policy (no MPOL_MF_MOVE), never its contents. `mask`
    // holds MASK_BITS bits; maxnode is bits + 1 as the kernel's get_nodes() expects.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            region.as_ptr().add(offset),
            len,
            libc::MPOL_BIND | libc::MPOL_F_STATIC_NODES,
            mask.as_ptr(),
            MASK_BITS + 1,
            0u32,
        )
    };
    check("mbind", node, ret)
}

/// Moves the pages of the whole of `region` that only this process maps to `node`
/// (`mbind(MPOL_BIND, MPOL_MF_MOVE)`), as any process may do with its own mappings: pages
/// that cannot move (no free page there) stay where they are, without an error. What a
/// lessee can do to its lease (the release's node check, `pool::on_node`).
pub fn move_region(region: &MmapRegion, node: u32) -> Result<(), NumaError> {
    let err = |source| NumaError {
        call: "mbind",
        node,
        source,
    };
    let mask = node_mask(node).map_err(err)?;
    // SAFETY: the range is the whole mapping owned by `region`; mbind changes its policy and
    // migrates its pages (their contents are copied by the kernel, the addresses stay).
    // `mask` holds MASK_BITS bits; maxnode is bits + 1 as the kernel's get_nodes() expects.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            region.as_ptr(),
            region.len(),
            libc::MPOL_BIND,
            mask.as_ptr(),
            MASK_BITS + 1,
            MPOL_MF_MOVE,
        )
    };
    check("mbind", node, ret)
}

/// Makes the calling thread allocate only from `node` (`set_mempolicy(MPOL_BIND |
/// MPOL_F_STATIC_NODES)`), for allocations that have no mapping to bind (e.g. `fallocate`).
pub fn bind_current_thread(node: u32) -> Result<(), NumaError> {
    let mask = node_mask(node).map_err(|source| NumaError {
        call: "set_mempolicy",
        node,
        source,
    })?;
    // SAFETY: set_mempolicy reads `MASK_BITS` bits from `mask`, which is that long; it only
    // changes the calling thread's allocation policy.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            libc::MPOL_BIND | libc::MPOL_F_STATIC_NODES,
            mask.as_ptr(),
            MASK_BITS + 1,
        )
    };
    check("set_mempolicy", node, ret)
}

/// Returns the calling thread to the default policy (allocate on the local node).
pub fn reset_current_thread() -> Result<(), NumaError> {
    // SAFETY: MPOL_DEFAULT takes no node mask (NULL, 0); only the thread's policy changes.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            libc::MPOL_DEFAULT,
            std::ptr::null::<libc::c_ulong>(),
            0usize,
        )
    };
    check("set_mempolicy(MPOL_DEFAULT)", 0, ret)
}

/// The calling thread's allocations bound to one node until dropped, when the thread's
/// earlier policy (as `get_mempolicy` reported it) comes back: for `fallocate` on a thread
/// that lives on (a daemon's request thread), where [`bind_current_thread`] alone would leave
/// the binding behind.
#[derive(Debug)]
pub struct ThreadBinding {
    mode: libc::c_int,
    mask: [libc::c_ulong; MASK_WORDS],
}

impl ThreadBinding {
    /// Saves the calling thread's policy and binds it to `node`.
    pub fn bind(node: u32) -> Result<ThreadBinding, NumaError> {
        let mut saved = ThreadBinding {
            mode: 0,
            mask: [0; MASK_WORDS],
        };
        // SAFETY: `mode` and `mask` are valid out-pointers, the mask `MASK_BITS` long; no
        // address (NULL, flags 0): the call reports the thread's own policy.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_get_mempolicy,
                &mut saved.mode as *mut libc::c_int,
                saved.mask.as_mut_ptr(),
                MASK_BITS,
                std::ptr::null_mut::<libc::c_void>(),
                0 as libc::c_ulong,
            )
        };
        check("get_mempolicy", node, ret)?;
        bind_current_thread(node)?;
        Ok(saved)
    }
}

impl Drop for ThreadBinding {
    fn drop(&mut self) {
        // SAFETY: set_mempolicy reads `MASK_BITS` bits from the saved mask, which is that
        // long; only the calling thread's policy changes.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_set_mempolicy,
                self.mode,
                self.mask.as_ptr(),
                MASK_BITS + 1,
            )
        };
        if ret != 0 {
            // The error returned below is what matters; a reset that fails too leaves the
            // default policy the failed call did not change.
            let _ = reset_current_thread();
        }
    }
}

/// The node holding the page at `offset` in `region` (`get_mempolicy(MPOL_F_NODE |
/// MPOL_F_ADDR)`). The page must be present, or the kernel faults it in.
pub fn node_of(region: &MmapRegion, offset: usize) -> Result<u32, NumaError> {
    let err = |source| NumaError {
        call: "get_mempolicy",
        node: 0,
        source,
    };
    if offset >= region.len() {
        return Err(err(std::io::Error::from_raw_os_error(libc::EINVAL)));
    }
    let mut node: libc::c_int = -1;
    // SAFETY: `node` is a valid out-pointer; no mask is passed (NULL, 0); the address lies
    // inside `region` (checked above) and the call only reads the page's location.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0usize,
            region.as_ptr().add(offset),
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    check("get_mempolicy", 0, ret)?;
    u32::try_from(node).map_err(|_| err(std::io::Error::from_raw_os_error(libc::ENODATA)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_a_mapping_to_node_0_and_find_its_pages_there() {
        let r = MmapRegion::anonymous(4 << 20, None).unwrap();
        bind_region(&r, 0, 4 << 20, 0).unwrap();
        r.populate_write(0, 4 << 20).unwrap();
        assert_eq!(node_of(&r, 0).unwrap(), 0);
        assert_eq!(node_of(&r, (4 << 20) - 1).unwrap(), 0);
    }

    #[test]
    fn a_missing_node_is_named() {
        let r = MmapRegion::anonymous(4096, None).unwrap();
        let err = bind_region(&r, 0, 4096, 1000).unwrap_err();
        assert!(err.to_string().contains("node 1000"), "{err}");
        assert!(bind_region(&r, 0, 8192, 0).is_err());
    }

    #[test]
    fn a_thread_binding_gives_the_earlier_policy_back() {
        std::thread::spawn(|| {
            let policy = || {
                let mut mode: libc::c_int = -1;
                // SAFETY: a valid out-pointer, no mask, no address.
                let ret = unsafe {
                    libc::syscall(
                        libc::SYS_get_mempolicy,
                        &mut mode as *mut libc::c_int,
                        std::ptr::null_mut::<libc::c_ulong>(),
                        0usize,
                        std::ptr::null_mut::<libc::c_void>(),
                        0 as libc::c_ulong,
                    )
                };
                assert_eq!(ret, 0);
                mode
            };
            assert_eq!(policy(), libc::MPOL_DEFAULT);
            {
                let _bound = ThreadBinding::bind(0).unwrap();
                assert_eq!(policy() & 0xff, libc::MPOL_BIND);
            }
            assert_eq!(policy(), libc::MPOL_DEFAULT);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn thread_policy_round_trip() {
        std::thread::spawn(|| {
            bind_current_thread(0).unwrap();
            let mut v = vec![0u8; 1 << 20];
            v[0] = 1;
            reset_current_thread().unwrap();
            assert!(bind_current_thread(5000).is_err());
        })
        .join()
        .unwrap();
    }
}
