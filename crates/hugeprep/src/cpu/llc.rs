//! The last-level cache size, from CPUID and from sysfs, and which of the two to believe.

use std::fs;
use std::path::Path;

use raw_cpuid::{CacheType, CpuId, CpuIdReader};
use serde::Serialize;

use crate::units::parse_bytes;

/// Where the kernel publishes cpu0's caches.
pub const SYSFS_CACHE_DIR: &str = "/sys/devices/system/cpu/cpu0/cache";

/// Where [`super::CpuInfo::llc_bytes`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LlcSource {
    /// CPUID and sysfs report the same size.
    CpuidAndSysfs,
    /// CPUID's cache leaves (4 on Intel, 0x8000001D or 0x80000006 on AMD).
    Cpuid,
    /// `/sys/devices/system/cpu/cpu0/cache`: CPUID had nothing plausible, or disagreed
    /// inside a VM, where the hypervisor's CPUID cache leaves are often made up.
    Sysfs,
    /// Neither source had a plausible size.
    Unknown,
}

impl LlcSource {
    /// A short human-readable description.
    pub const fn describe(self) -> &'static str {
        match self {
            LlcSource::CpuidAndSysfs => "CPUID, confirmed by sysfs",
            LlcSource::Cpuid => "CPUID",
            LlcSource::Sysfs => "sysfs",
            LlcSource::Unknown => "unknown",
        }
    }
}

/// Sizes outside this range, or not a multiple of 4 KiB, are taken as garbage (hypervisors
/// have been seen to report 0, a few KiB, or all-ones cache leaves).
fn plausible(bytes: u64) -> bool {
    (256 << 10..=16 << 30).contains(&bytes) && bytes % 4096 == 0
}

/// The largest data or unified cache described by CPUID's deterministic cache leaves (4 on
/// Intel, 0x8000001D on AMD), falling back to AMD's legacy leaf 0x80000006.
pub(super) fn cpuid_llc<R: CpuIdReader>(cpuid: &CpuId<R>) -> Option<u64> {
    let deterministic = cpuid.get_cache_parameters().and_then(|caches| {
        caches
            .filter(|c| matches!(c.cache_type(), CacheType::Data | CacheType::Unified))
            .map(|c| {
                let bytes = c.associativity() as u64
                    * c.physical_line_partitions() as u64
                    * c.coherency_line_size() as u64
                    * c.sets() as u64;
                (c.level(), bytes)
            })
            .max()
            .map(|(_, bytes)| bytes)
    });
    deterministic.filter(|b| *b > 0).or_else(|| {
        // L3Size[31:18] in units of 512 KiB.
        cpuid
            .get_l2_l3_cache_and_tlb_info()
            .map(|info| u64::from(info.l3cache_size()) * (512 << 10))
            .filter(|b| *b > 0)
    })
}

/// The size of the highest-level data or unified cache listed under `dir` (normally
/// [`SYSFS_CACHE_DIR`]), or `None` if the directory is missing or unreadable.
pub fn sysfs_llc(dir: &Path) -> Option<u64> {
    let read = |p: &Path, name: &str| fs::read_to_string(p.join(name)).ok();
    fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|e| {
            let p = e.path();
            let kind = read(&p, "type")?;
            if kind.trim() == "Instruction" {
                return None;
            }
            let level: u32 = read(&p, "level")?.trim().parse().ok()?;
            let size = parse_bytes(read(&p, "size")?.trim()).ok()?;
            Some((level, size))
        })
        .max()
        .map(|(_, size)| size)
}

/// Picks the LLC size from the two sources. Both agree on real hardware; when they differ
/// inside a VM, sysfs wins because the guest kernel may have corrected the hypervisor's
/// CPUID (and it is what every other tool on the guest reports).
pub fn choose_llc(cpuid: Option<u64>, sysfs: Option<u64>, in_vm: bool) -> (Option<u64>, LlcSource) {
    match (
        cpuid.filter(|b| plausible(*b)),
        sysfs.filter(|b| plausible(*b)),
    ) {
        (Some(c), Some(s)) if c == s => (Some(c), LlcSource::CpuidAndSysfs),
        (Some(_), Some(s)) if in_vm => (Some(s), LlcSource::Sysfs),
        (Some(c), _) => (Some(c), LlcSource::Cpuid),
        (None, Some(s)) => (Some(s), LlcSource::Sysfs),
        (None, None) => (None, LlcSource::Unknown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn agreeing_sources_are_both_credited() {
        assert_eq!(
            choose_llc(Some(32 * MIB), Some(32 * MIB), true),
            (Some(32 * MIB), LlcSource::CpuidAndSysfs)
        );
    }

    #[test]
    fn vm_prefers_sysfs_bare_metal_prefers_cpuid() {
        assert_eq!(
            choose_llc(Some(16 * MIB), Some(32 * MIB), true),
            (Some(32 * MIB), LlcSource::Sysfs)
        );
        assert_eq!(
            choose_llc(Some(16 * MIB), Some(32 * MIB), false),
            (Some(16 * MIB), LlcSource::Cpuid)
        );
    }

    #[test]
    fn garbage_cpuid_falls_back_to_sysfs() {
        for junk in [0, 4096, 1000 * 1000, u64::MAX] {
            assert_eq!(
                choose_llc(Some(junk), Some(32 * MIB), false),
                (Some(32 * MIB), LlcSource::Sysfs),
                "{junk}"
            );
        }
        assert_eq!(choose_llc(None, None, false), (None, LlcSource::Unknown));
        assert_eq!(
            choose_llc(Some(8 * MIB), None, true),
            (Some(8 * MIB), LlcSource::Cpuid)
        );
    }

    #[test]
    fn reads_this_machines_sysfs() {
        let Some(bytes) = sysfs_llc(Path::new(SYSFS_CACHE_DIR)) else {
            eprintln!("skipping: {SYSFS_CACHE_DIR} not readable here");
            return;
        };
        assert!(plausible(bytes), "{bytes}");
        assert_eq!(sysfs_llc(Path::new("/nonexistent")), None);
    }
}
