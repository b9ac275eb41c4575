//! Handing a hugeprep-prepared file to a real QEMU: QEMU maps the file (`share=on`) and uses
//! its pages instead of taking new ones.

mod hugetlb_support;

use std::time::Duration;

use hugeprep::prefault::{prepare, PrefaultOptions, PrepareSpec, Target};
use hugeprep::PageSize;
use hugeprep_testkit::qemu::{self, QemuConfig, QemuVm};
use hugetlb_support::HugeEnv;

#[test]
fn qemu_maps_a_prepared_file_without_taking_new_pages() {
    let Some(binary) = qemu::find_binary() else {
        hugeprep::testing::missing_tool(
            "qemu-system-x86_64 not installed (apt install qemu-system-x86)",
        );
        return;
    };
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("SKIPPED: /dev/kvm missing, QEMU cannot use accel=kvm");
        return;
    }
    let size = 256u64 << 20;
    let Some(env) = HugeEnv::new(PageSize::Size2M, size / (2 << 20)) else {
        return;
    };
    let free0 = env.free();
    let path = env.dir().join("guest0");
    let spec = PrepareSpec {
        size,
        page_size: PageSize::Size2M,
        target: Target::Path(path.clone()),
        owner: None,
        prefault: PrefaultOptions {
            node: Some(0),
            ..PrefaultOptions::default()
        },
    };
    let prepared = prepare(&spec, None).unwrap();
    assert_eq!(env.free(), free0 - 128);

    let config = QemuConfig {
        binary,
        size,
        mem_path: path.clone(),
        share: true,
        prealloc: true, // would take 128 new pages if the file's were not reused
        prealloc_threads: 1,
        qmp_socket: env.dir().join("qmp.sock"),
    };
    let mut vm = QemuVm::spawn(&config).unwrap();
    let status = vm.wait_ready(Duration::from_secs(120)).unwrap();
    assert_eq!(status, "prelaunch");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", vm.pid())).unwrap();
    assert!(
        maps.lines().any(|l| l.ends_with(path.to_str().unwrap())),
        "QEMU does not map {}",
        path.display()
    );
    assert_eq!(env.free(), free0 - 128, "QEMU took pages of its own");
    vm.quit(Duration::from_secs(10));
    // QEMU leaves an existing file alone: same size, still there.
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    prepared.file.remove().unwrap();
    assert_eq!(env.free(), free0);
}
