//! The domain XML libvirt hands the hook on stdin, then the hook's plan for it (nodesets,
//! sizes, aliases), and CPU/node lists as sysfs writes them.
#![no_main]

use hugeprep::vmm::libvirt::Domain;
use hugeprep::PageSize;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = hugeprep::topology::parse_list(text);
    let _ = hugeprep::vmm::libvirt::parse_nodeset(text);
    if let Ok(d) = Domain::parse(text) {
        let _ = hugeprep::vmm::libvirt::plan::plan(&d, PageSize::Size2M);
    }
});
