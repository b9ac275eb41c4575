//! `hugeprep bench vm-start`: VM start time with the VMM's own preallocation, with no
//! preallocation (the floor), and with hugeprep's warm pool.

use std::path::PathBuf;

use anyhow::Context;
use hugeprep::cpu::CpuInfo;
use hugeprep::policy::ClearingPolicy;
use hugeprep::units::parse_bytes;
use hugeprep::PageSize;
use hugeprep_bench::qemu;
use hugeprep_bench::vm_start::{self, VmStartBenchConfig, Vmm};

/// VM start, side by side per memory size: immediate preallocation, no preallocation (the
/// floor), a hugeprep warm lease, and immediate preallocation over a lease.
#[derive(Debug, clap::Args)]
pub struct BenchVmStartArgs {
    /// Guest memory sizes, comma-separated (a size needing more hugepages than the machine
    /// can spare is skipped and listed). Default: 1G,4G,8G; with --migrate or --hotplug,
    /// 4 GiB on 2M pages and 8 GiB on 1G pages.
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
    pub sizes: Vec<u64>,
    /// Page sizes, comma-separated: every case runs on each, side by side in the same
    /// repetitions (a page size the machine cannot supply for a size is skipped and listed).
    /// Default: 2M and 1G where the kernel has a 1G pool.
    #[arg(long, value_delimiter = ',')]
    pub page_size: Vec<PageSize>,
    /// Preallocation threads for QEMU and libvirt, workers for hugeprep (default: every CPU
    /// this process may use).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Measured repetitions per case (after one warm-up start of each).
    #[arg(long, default_value_t = 7)]
    pub reps: usize,
    /// QEMU binary (default: qemu-system-x86_64 from PATH).
    #[arg(long)]
    pub qemu: Option<PathBuf>,
    /// VMMs to measure, comma-separated: qemu (exec to QMP ready), libvirt (`virsh
    /// create` to started, in a private libvirtd with hugeprep's hook, QEMU as the package
    /// runs it), libvirt-root (the same with QEMU as root, beside it) and cloud-hypervisor
    /// (exec to a tiny guest's first serial report).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "qemu,libvirt,libvirt-root,cloud-hypervisor"
    )]
    pub vmms: Vec<Vmm>,
    /// cloud-hypervisor binary, v53 (default: cloud-hypervisor from PATH; without one its
    /// cases are listed as not measured).
    #[arg(long, env = "HUGEPREP_CLOUD_HYPERVISOR")]
    pub cloud_hypervisor: Option<PathBuf>,
    /// Memory to leave to the rest of the machine; larger sizes are skipped.
    #[arg(long, default_value = "4G", value_parser = parse_bytes)]
    pub headroom: u64,
    /// Boot storms: start this many VMs at once (comma-separated counts, e.g. 2,4,8), each
    /// of the first `--sizes` value, QEMU alone, instead of the one-at-a-time run.
    #[arg(long, value_delimiter = ',')]
    pub concurrent: Vec<usize>,
    /// With --concurrent: run hugeprep's storms a second time with the free pages left to
    /// the pool, so its refill behind the leases meets the starts (side by side with the
    /// held-back runs).
    #[arg(long, requires = "concurrent")]
    pub storm_refill: bool,
    /// Incoming live migration instead of starts: a running source QEMU migrates over a unix
    /// socket into a destination started `-incoming defer` on a warm lease, with
    /// `prealloc=on`, and with no preallocation (the floor), side by side.
    #[arg(long, conflicts_with = "concurrent")]
    pub migrate: bool,
    /// Memory hot-plug instead of starts: plug a warm lease into a paused QEMU as a pc-dimm
    /// (what `hugeprep hotplug-args` prints), beside a pc-dimm with `prealloc=on`, one
    /// without preallocation (the floor) and a lease as a virtio-mem-pci.
    #[arg(long, conflicts_with_all = ["concurrent", "migrate"])]
    pub hotplug: bool,
    /// Write a chart (seconds to ready against memory size) to FILE as SVG.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// `--json`, `--json-out FILE`.
    #[command(flatten)]
    pub output: super::JsonOutput,
}

/// Runs `hugeprep bench vm-start`.
pub fn run(args: BenchVmStartArgs) -> anyhow::Result<()> {
    let cancel = hugeprep::sys::signals::cancel_on_signals()?;
    let qemu =
        args.qemu.clone().or_else(qemu::find_binary).context(
            "--qemu: qemu-system-x86_64 not found in PATH (apt install qemu-system-x86)",
        )?;
    let threads = args
        .threads
        .unwrap_or_else(|| hugeprep::sys::affinity::allowed_cpus().len().max(1));
    // Borrowed pool pages and timings must not be disturbed by tests or other benchmarks.
    let _lock = hugeprep::hugetlb::lock::HugepageLock::acquire()?;
    let sizes = if args.sizes.is_empty() {
        vec![1 << 30, 4 << 30, 8 << 30]
    } else {
        args.sizes.clone()
    };
    let cfg = VmStartBenchConfig {
        sizes,
        page_sizes: if args.page_size.is_empty() {
            hugeprep::hugetlb::pool::page_sizes()
        } else {
            args.page_size.clone()
        },
        threads,
        reps: args.reps,
        qemu,
        cloud_hypervisor: args.cloud_hypervisor.clone().or_else(|| {
            std::env::var_os("PATH").and_then(|path| {
                std::env::split_paths(&path)
                    .map(|dir| dir.join("cloud-hypervisor"))
                    .find(|p| p.is_file())
            })
        }),
        vmms: args.vmms.clone(),
        hook_binary: std::env::current_exe().context("finding this binary for libvirt's hook")?,
        plan: ClearingPolicy::embedded().resolve(CpuInfo::host()).plan,
        headroom: args.headroom,
        cancel: Some(cancel),
    };
    // The lines say which start ran; the spinner, how long the run has taken.
    let progress = super::progress::Progress::spinner(args.output.json);
    progress.set_message("bench vm-start");
    let log = |line: &str| progress.suspend(|| eprintln!("{line}"));
    if !args.concurrent.is_empty() {
        let size = args.sizes.first().copied().unwrap_or(1 << 30);
        let report = vm_start::storm::run(&cfg, &args.concurrent, size, args.storm_refill, &log)?;
        drop(progress);
        return args.output.emit(&report, || report.table());
    }
    if args.hotplug {
        let pairs = vm_start::migrate::default_pairs(&args.sizes, &cfg.page_sizes);
        let report = vm_start::hotplug::run(&cfg, &pairs, &log)?;
        drop(progress);
        return args.output.emit(&report, || report.table());
    }
    if args.migrate {
        let pairs = vm_start::migrate::default_pairs(&args.sizes, &cfg.page_sizes);
        let report = vm_start::migrate::run(&cfg, &pairs, &log)?;
        drop(progress);
        return args.output.emit(&report, || report.table());
    }
    let report = vm_start::run(&cfg, &log)?;
    drop(progress);
    args.output.emit(&report, || report.table())?;
    if let Some(path) = &args.svg {
        std::fs::write(path, report.svg())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
