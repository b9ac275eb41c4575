//! What CPU this is: vendor, family/model/stepping, the features clearing depends on, and
//! the last-level cache size. Read once per process ([`CpuInfo::host`]); any other CPU can
//! be described from fixed CPUID values ([`CpuidTable`]) to ask what the policy would choose
//! there.

mod features;
mod llc;
mod table;

use std::fmt;
use std::path::Path;
use std::sync::OnceLock;

use raw_cpuid::{CpuId, CpuIdReader};
use serde::{Serialize, Serializer};

pub use features::{Feature, FeatureError, Features};
pub use llc::{choose_llc, sysfs_llc, LlcSource, SYSFS_CACHE_DIR};
pub use table::CpuidTable;

/// The CPU's manufacturer, from CPUID leaf 0.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// `GenuineIntel`.
    Intel,
    /// `AuthenticAMD`.
    Amd,
    /// Any other vendor string (`HygonGenuine`, `CentaurHauls`, ...), as CPUID reports it.
    Other(String),
}

impl Vendor {
    /// Maps a CPUID vendor string.
    pub fn from_id(id: &str) -> Vendor {
        match id {
            "GenuineIntel" => Vendor::Intel,
            "AuthenticAMD" => Vendor::Amd,
            other => Vendor::Other(other.to_string()),
        }
    }

    /// `intel`, `amd`, or the vendor string.
    pub fn name(&self) -> &str {
        match self {
            Vendor::Intel => "intel",
            Vendor::Amd => "amd",
            Vendor::Other(id) => id,
        }
    }
}

impl fmt::Display for Vendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Vendor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// One CPU's identity and the facts clearing depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuInfo {
    /// The manufacturer.
    pub vendor: Vendor,
    /// The raw CPUID vendor string (`GenuineIntel`).
    pub vendor_id: String,
    /// The brand string (`Intel(R) Xeon(R) Platinum 8180 CPU @ 2.50GHz`), trimmed; empty if
    /// the CPU has none.
    pub brand: String,
    /// CPUID leaf 1 EAX, the processor signature.
    pub signature: u32,
    /// Family, decoded the way Linux does: base family, plus extended family when the base is 0xF.
    pub family: u32,
    /// Model, decoded the way Linux does: extended model << 4 added when the family is >= 6.
    pub model: u32,
    /// Stepping.
    pub stepping: u32,
    /// The features clearing methods and policy rules depend on.
    pub features: Features,
    /// Last-level cache size in bytes (per cache instance, e.g. one AMD CCX), if known.
    pub llc_bytes: Option<u64>,
    /// Where `llc_bytes` came from.
    pub llc_source: LlcSource,
    /// Whether CPUID says a hypervisor is present (leaf 1 ECX bit 31).
    pub hypervisor: bool,
}

/// Family from a leaf-1 signature, as Linux's `x86_family()`.
pub const fn decode_family(signature: u32) -> u32 {
    let base = (signature >> 8) & 0xf;
    if base == 0xf {
        base + ((signature >> 20) & 0xff)
    } else {
        base
    }
}

/// Model from a leaf-1 signature, as Linux's `x86_model()`.
pub const fn decode_model(signature: u32) -> u32 {
    let model = (signature >> 4) & 0xf;
    if decode_family(signature) >= 6 {
        model + (((signature >> 16) & 0xf) << 4)
    } else {
        model
    }
}

/// Stepping from a leaf-1 signature.
pub const fn decode_stepping(signature: u32) -> u32 {
    signature & 0xf
}

const fn bit(reg: u32, n: u32) -> bool {
    reg & (1 << n) != 0
}

impl CpuInfo {
    /// Describes the CPU that `reader` answers for, from CPUID alone: leaf 0 (vendor), 1
    /// (signature, hypervisor bit), 7 (ERMS, FSRM, AVX2, AVX-512, AVX512-FP16, AMX,
    /// MOVDIR64B), 0x80000008
    /// (CLZERO), the brand string and the cache leaves. Use [`CpuInfo::detect`] for the host,
    /// which also consults sysfs and the OS.
    pub fn from_cpuid<R: CpuIdReader>(reader: R) -> CpuInfo {
        let cpuid = CpuId::with_cpuid_reader(reader.clone());
        let vendor_id = cpuid
            .get_vendor_info()
            .map(|v| v.as_str().trim_matches('\0').to_string())
            .unwrap_or_default();
        let max_leaf = reader.cpuid1(0).eax;
        let leaf1 = if max_leaf >= 1 {
            reader.cpuid1(1)
        } else {
            raw_cpuid::CpuIdResult {
                eax: 0,
                ebx: 0,
                ecx: 0,
                edx: 0,
            }
        };
        let signature = leaf1.eax;

        let mut features = Features::NONE;
        if max_leaf >= 7 {
            let l7 = reader.cpuid2(7, 0);
            features.set(Feature::Avx2, bit(l7.ebx, 5));
            features.set(Feature::Erms, bit(l7.ebx, 9));
            features.set(Feature::Avx512f, bit(l7.ebx, 16));
            features.set(Feature::Avx512bw, bit(l7.ebx, 30));
            features.set(Feature::Avx512vl, bit(l7.ebx, 31));
            features.set(Feature::Movdir64b, bit(l7.ecx, 28));
            features.set(Feature::Fsrm, bit(l7.edx, 4));
            features.set(Feature::Avx512fp16, bit(l7.edx, 23));
            features.set(Feature::Amx, bit(l7.edx, 24));
        }
        features.set(
            Feature::Clzero,
            cpuid
                .get_processor_capacity_feature_info()
                .is_some_and(|i| i.has_cl_zero()),
        );

        let llc = llc::cpuid_llc(&cpuid);
        let (llc_bytes, llc_source) = llc::choose_llc(llc, None, false);
        CpuInfo {
            vendor: Vendor::from_id(&vendor_id),
            vendor_id,
            brand: cpuid
                .get_processor_brand_string()
                .map(|b| {
                    b.as_str()
                        .trim_matches(|c: char| c == '\0' || c.is_whitespace())
                        .to_string()
                })
                .unwrap_or_default(),
            signature,
            family: decode_family(signature),
            model: decode_model(signature),
            stepping: decode_stepping(signature),
            features,
            llc_bytes,
            llc_source,
            hypervisor: bit(leaf1.ecx, 31),
        }
    }

    /// Describes the host: CPUID, with the LLC size cross-checked against
    /// [`SYSFS_CACHE_DIR`] and the AVX features kept only when the OS saves their registers
    /// (a CPU can report AVX-512 that the kernel or hypervisor has not enabled).
    pub fn detect() -> CpuInfo {
        let mut info = CpuInfo::from_cpuid(raw_cpuid::CpuIdReaderNative);
        #[cfg(target_arch = "x86_64")]
        {
            let f = &mut info.features;
            f.set(
                Feature::Avx2,
                f.has(Feature::Avx2) && std::arch::is_x86_feature_detected!("avx2"),
            );
            for (feature, enabled) in [
                (
                    Feature::Avx512f,
                    std::arch::is_x86_feature_detected!("avx512f"),
                ),
                (
                    Feature::Avx512bw,
                    std::arch::is_x86_feature_detected!("avx512bw"),
                ),
                (
                    Feature::Avx512vl,
                    std::arch::is_x86_feature_detected!("avx512vl"),
                ),
            ] {
                f.set(feature, f.has(feature) && enabled);
            }
            // FP16 runs in the same ZMM state: usable exactly when AVX-512F is. AMX is kept as
            // CPUID says: it only identifies the core here, nothing executes tile code.
            let fp16 = f.has(Feature::Avx512fp16) && f.has(Feature::Avx512f);
            f.set(Feature::Avx512fp16, fp16);
        }
        let cpuid_llc = info.llc_bytes;
        let sysfs = sysfs_llc(Path::new(SYSFS_CACHE_DIR));
        (info.llc_bytes, info.llc_source) = choose_llc(cpuid_llc, sysfs, info.hypervisor);
        if info.llc_source == LlcSource::Sysfs && cpuid_llc.is_some() {
            tracing::debug!(
                ?cpuid_llc,
                ?sysfs,
                "CPUID and sysfs disagree on the LLC size; using sysfs"
            );
        }
        info
    }

    /// The host's [`CpuInfo`], detected on first use.
    pub fn host() -> &'static CpuInfo {
        static HOST: OnceLock<CpuInfo> = OnceLock::new();
        HOST.get_or_init(CpuInfo::detect)
    }

    /// Whether the CPU has `feature`.
    pub fn has(&self, feature: Feature) -> bool {
        self.features.has(feature)
    }
}

impl fmt::Display for CpuInfo {
    /// `GenuineIntel 6/85 stepping 4 (Intel(R) Xeon(R) ...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{} stepping {}",
            self.vendor_id, self.family, self.model, self.stepping
        )?;
        if !self.brand.is_empty() {
            write!(f, " ({})", self.brand)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_decode_like_linux() {
        // (signature, family, model, stepping)
        for (sig, fam, model, step) in [
            (0x0005_0654, 6, 0x55, 4),    // Skylake-SP
            (0x0005_0657, 6, 0x55, 7),    // Cascade Lake
            (0x0008_06f8, 6, 0x8f, 8),    // Sapphire Rapids
            (0x0083_0f10, 0x17, 0x31, 0), // Rome
            (0x00a1_0f11, 0x19, 0x11, 1), // Genoa
            (0x00b0_0f21, 0x1a, 0x02, 1), // Turin
            (0x0000_0f41, 0xf, 4, 1),     // Pentium 4: extended family 0
            (0x0000_0583, 5, 8, 3),       // K6-2: no extended model below family 6
        ] {
            assert_eq!(
                (decode_family(sig), decode_model(sig), decode_stepping(sig)),
                (fam, model, step),
                "{sig:#x}"
            );
        }
    }

    #[test]
    fn host_is_detected_once() {
        let a = CpuInfo::host();
        let b = CpuInfo::host();
        assert!(std::ptr::eq(a, b));
        assert!(a.family > 0, "{a}");
        assert_eq!(a.signature & 0xf, a.stepping);
    }
}
