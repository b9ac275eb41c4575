//! Which clearing methods the running CPU offers, detected at run time so that one binary runs
//! on every x86-64 host.

use super::Method;

/// Cache line sizes CLZERO is trusted with: a power of two no smaller than 16 bytes and no
/// larger than a page, so that a line-aligned body never reaches outside the extent.
const CLZERO_LINES: std::ops::RangeInclusive<usize> = 16..=4096;

/// The number of bytes one CLZERO zeroes, or `None` when the CPU lacks CLZERO or does not say
/// its line size consistently.
///
/// CLZERO support is CPUID leaf 0x8000_0008 EBX bit 0 (AMD). The instruction zeroes the cache
/// line holding the address, so the line size must be known exactly: it is read from leaf 1
/// (CLFLUSH line size) and, where the CPU reports it, must agree with the L1 data cache line
/// size in leaf 0x8000_0005.
#[cfg(target_arch = "x86_64")]
pub(crate) fn clzero_line_size() -> Option<usize> {
    let cpuid = raw_cpuid::CpuId::new();
    if !cpuid.get_processor_capacity_feature_info()?.has_cl_zero() {
        return None;
    }
    let clflush = usize::from(cpuid.get_feature_info()?.cflush_cache_line_size()) * 8;
    if let Some(l1) = cpuid.get_l1_cache_and_tlb_info() {
        let l1_line = usize::from(l1.dcache_line_size());
        if l1_line != 0 && l1_line != clflush {
            return None;
        }
    }
    (clflush.is_power_of_two() && CLZERO_LINES.contains(&clflush)).then_some(clflush)
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn clzero_line_size() -> Option<usize> {
    None
}

impl Method {
    /// Whether the running CPU can use this method. `rep stosb`, MOVNTI (SSE2) and
    /// `write-bytes` exist on every x86-64; AVX2 and AVX-512 need the CPU and the kernel
    /// (XSAVE state) to support them; CLZERO needs AMD's CPUID bit and a known line size.
    ///
    /// ```
    /// use hugeprep::Method;
    /// assert!(Method::WriteBytes.is_available());
    /// ```
    pub fn is_available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Method::RepStosb | Method::Movnti | Method::WriteBytes => true,
                Method::Avx2Nt => std::arch::is_x86_feature_detected!("avx2"),
                Method::Avx512Nt => std::arch::is_x86_feature_detected!("avx512f"),
                Method::Clzero => clzero_line_size().is_some(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Method::WriteBytes
        }
    }
}

/// The methods this CPU offers, in the order of [`Method::ALL`].
///
/// ```
/// let methods = hugeprep::clear::available_methods();
/// assert!(methods.contains(&hugeprep::Method::WriteBytes));
/// ```
pub fn available_methods() -> Vec<Method> {
    Method::ALL
        .into_iter()
        .filter(|m| m.is_available())
        .collect()
}
