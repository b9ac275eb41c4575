//! The smallest rust-vmm VMM that proves a lease works as guest RAM: a KVM guest over a
//! `GuestMemoryMmap` of the lease (mapped shared) runs a few instructions of 32-bit code that
//! check 4 KiB at each of several guest-physical addresses is zero, write a known value at
//! each, and halt. The host then reads the values back through the lease file.
//!
//! The guest runs in flat 32-bit protected mode set up through `KVM_SET_SREGS` (no GDT, no
//! paging), so it reaches every address below 4 GiB. Its code, address table and stack sit
//! in the lease's first 64 KiB; the checked addresses must lie above.

use kvm_ioctls::VcpuExit;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::sys::kvm::{KvmError, KvmGuest};

/// Where the guest's code is loaded (and `rip` starts).
pub const CODE: u64 = 0x1000;
/// Where the table of addresses to check is.
pub const TABLE: u64 = 0x2000;
/// Top of the guest's stack.
pub const STACK: u64 = 0x8000;
/// Lowest address the guest may check (above its code, table and stack).
pub const FIRST_FREE: u64 = 0x1_0000;
/// The port the guest writes to when it finds a non-zero byte.
pub const NONZERO_PORT: u16 = 0x10;
/// Bytes checked at each address.
pub const CHECKED: u64 = 4096;

/// For each address in the table at `esi` (`ecx` entries): `repe scasd` over 1024 dwords
/// against zero; on a mismatch `out 0x10, al` and halt; else store `edx` at the address.
/// Then halt.
const PROGRAM: [u8; 29] = [
    0x8b, 0x3e, // 0:  mov edi, [esi]
    0x51, // 2:  push ecx
    0xb9, 0x00, 0x04, 0x00, 0x00, // 3:  mov ecx, 1024
    0x31, 0xc0, // 8:  xor eax, eax
    0xf3, 0xaf, // 10: repe scasd
    0x59, // 12: pop ecx
    0x75, 0x0b, // 13: jnz bad (26)
    0x8b, 0x3e, // 15: mov edi, [esi]
    0x89, 0x17, // 17: mov [edi], edx
    0x83, 0xc6, 0x04, // 19: add esi, 4
    0x49, // 22: dec ecx
    0x75, 0xe7, // 23: jnz 0
    0xf4, // 25: hlt
    0xe6, 0x10, // 26: bad: out 0x10, al
    0xf4, // 28: hlt
];

/// The guest did not do what it should.
#[derive(Debug, thiserror::Error)]
pub enum KvmGuestError {
    /// Setting up or running the VM failed.
    #[error("kvm guest: {0}")]
    Kvm(#[from] KvmError),
    /// Writing the program into guest memory failed.
    #[error("kvm guest: loading the program at {addr:#x}: {source}")]
    Load {
        /// Guest-physical address.
        addr: u64,
        /// vm-memory's error.
        source: vm_memory::GuestMemoryError,
    },
    /// An address to check is outside what the guest can reach or overlaps its code.
    #[error("kvm guest: address {addr:#x} must lie in {FIRST_FREE:#x}..{limit:#x} (4 KiB below the end of guest memory, under 4 GiB)")]
    Address {
        /// The address.
        addr: u64,
        /// The end of the allowed range.
        limit: u64,
    },
    /// The guest found a non-zero byte in memory it was handed.
    #[error("kvm guest: memory at guest-physical {near:#x} is not zero")]
    NotZero {
        /// Where the guest's scan stopped (just past the non-zero dword).
        near: u64,
    },
    /// The guest stopped some other way.
    #[error("kvm guest: unexpected exit {exit}")]
    Exit {
        /// The exit, as text.
        exit: String,
    },
}

fn ioctl(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> KvmGuestError {
    move |source| KvmGuestError::Kvm(KvmError::Ioctl { op, source })
}

/// Runs the check-and-write program over `mem` (guest RAM at guest-physical 0, `size`
/// bytes): every address in `addrs` must be zero for 4 KiB and gets `value`. Returns when
/// the guest halts.
pub fn check_zero_and_write(
    mem: GuestMemoryMmap,
    size: u64,
    addrs: &[u32],
    value: u32,
) -> Result<(), KvmGuestError> {
    let limit = size.min(1 << 32).saturating_sub(CHECKED);
    if let Some(&bad) = addrs
        .iter()
        .find(|&&a| u64::from(a) < FIRST_FREE || u64::from(a) > limit)
    {
        return Err(KvmGuestError::Address {
            addr: bad.into(),
            limit,
        });
    }
    let load = |addr: u64, bytes: &[u8]| {
        mem.write_slice(bytes, GuestAddress(addr))
            .map_err(|source| KvmGuestError::Load { addr, source })
    };
    load(CODE, &PROGRAM)?;
    let table: Vec<u8> = addrs.iter().flat_map(|a| a.to_le_bytes()).collect();
    load(TABLE, &table)?;
    let mut guest = KvmGuest::new(mem)?;
    let mut sregs = guest.vcpu.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?;
    let flat = |selector: u16, type_: u8| kvm_bindings::kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl: 0,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    sregs.cs = flat(0x8, 0xb);
    for seg in [
        &mut sregs.ds,
        &mut sregs.es,
        &mut sregs.ss,
        &mut sregs.fs,
        &mut sregs.gs,
    ] {
        *seg = flat(0x10, 0x3);
    }
    sregs.cr0 |= 1; // protected mode, paging off
    guest
        .vcpu
        .set_sregs(&sregs)
        .map_err(ioctl("KVM_SET_SREGS"))?;
    let regs = kvm_bindings::kvm_regs {
        rip: CODE,
        rflags: 0x2,
        rsp: STACK,
        rsi: TABLE,
        rcx: addrs.len() as u64,
        rdx: value.into(),
        ..Default::default()
    };
    guest.vcpu.set_regs(&regs).map_err(ioctl("KVM_SET_REGS"))?;
    if addrs.is_empty() {
        return Ok(());
    }
    let exit = guest.vcpu.run().map_err(ioctl("KVM_RUN"))?;
    match exit {
        VcpuExit::Hlt => Ok(()),
        VcpuExit::IoOut(NONZERO_PORT, _) => {
            let regs = guest.vcpu.get_regs().map_err(ioctl("KVM_GET_REGS"))?;
            Err(KvmGuestError::NotZero { near: regs.rdi })
        }
        other => Err(KvmGuestError::Exit {
            exit: format!("{other:?}"),
        }),
    }
}

/// Guest-physical addresses spread across `size` bytes: the first free 2 MiB boundary, the
/// middle, and the last 4 KiB, plus every 1 GiB boundary in between.
pub fn spread_addresses(size: u64) -> Vec<u32> {
    let last = size.min(1 << 32) - CHECKED;
    let mut v: Vec<u64> = vec![2 << 20, (size / 2) & !(CHECKED - 1), last];
    v.extend((1..4).map(|g| g << 30).filter(|&a| a < last));
    v.sort_unstable();
    v.dedup();
    v.into_iter()
        .filter(|&a| a >= FIRST_FREE && a <= last)
        .map(|a| a as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_spread_over_the_memory_and_avoid_the_program() {
        assert_eq!(
            spread_addresses(8 << 20),
            [2 << 20, 4 << 20, (8 << 20) - 4096]
        );
        let big = spread_addresses(3 << 30);
        assert!(big.contains(&(1 << 30)) && big.contains(&(2 << 30)));
        assert!(big.iter().all(|&a| u64::from(a) >= FIRST_FREE));
    }

    #[test]
    fn jumps_land_where_the_comments_say() {
        // jnz bad at 13: target = 15 + 0x0b = 26; jnz loop at 23: target = 25 - 25 = 0.
        assert_eq!(15 + PROGRAM[14] as usize, 26);
        assert_eq!(25 + (PROGRAM[24] as i8) as isize, 0);
        assert_eq!(&PROGRAM[26..], &[0xe6, 0x10, 0xf4]);
    }
}
