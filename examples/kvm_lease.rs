//! A tiny rust-vmm VMM on a hugeprep lease: takes a lease from the daemon (optionally
//! pinned), maps it as `GuestMemoryMmap` (shared), runs a KVM guest that checks the memory
//! is zero and writes a known value at addresses across it, verifies the values through the
//! lease file, and releases the lease (the daemon scrubs it).
//!
//! ```sh
//! cargo run --example kvm_lease -- --socket /run/hugeprep/hugeprep.sock --size 64M --pin
//! ```

use std::error::Error;
use std::path::PathBuf;

use hugeprep::client::Client;
use hugeprep::hugetlb::BackingFile;
use hugeprep::pool::LeaseRequest;
use hugeprep::vmm::kvm_guest::{check_zero_and_write, spread_addresses};
use hugeprep::vmm::vm_memory::guest_memory;
use vm_memory::GuestAddress;

/// The value the guest writes.
const VALUE: u32 = 0x4855_4745; // "HUGE"

fn main() -> Result<(), Box<dyn Error>> {
    let mut socket = PathBuf::from(hugeprep::client::DEFAULT_SOCKET);
    let mut size = 64u64 << 20;
    let mut pin = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--socket" => socket = args.next().ok_or("--socket: missing path")?.into(),
            "--size" => {
                size = hugeprep::units::parse_bytes(&args.next().ok_or("--size: missing")?)?
            }
            "--pin" => pin = true,
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let client = Client::new(&socket);
    let req = LeaseRequest {
        name: format!("kvm-example-{}", std::process::id()),
        size,
        pin,
        ..LeaseRequest::default()
    };
    let lease = client.blocking(client.lease(&req))?;
    let result = run(&lease.path, lease.page_size, size);
    client.blocking(client.release(lease.id))?;
    let addrs = result?;
    println!(
        "guest wrote {VALUE:#x} at {} addresses of {} ({}pinned); verified through the lease file; released",
        addrs.len(),
        lease.path.display(),
        if lease.pinned { "" } else { "not " }
    );
    Ok(())
}

fn run(
    path: &std::path::Path,
    ps: hugeprep::PageSize,
    size: u64,
) -> Result<Vec<u32>, Box<dyn Error>> {
    let file = BackingFile::open(path, ps)?;
    let addrs = spread_addresses(size);
    check_zero_and_write(guest_memory(&file, GuestAddress(0))?, size, &addrs, VALUE)?;
    let view = file.map()?;
    for &a in &addrs {
        let at = a as usize;
        let got = u32::from_le_bytes(view.as_slice()[at..at + 4].try_into()?);
        if got != VALUE {
            return Err(format!("lease offset {a:#x}: {got:#x}, expected {VALUE:#x}").into());
        }
    }
    Ok(addrs)
}
