//! Fixed CPUID answers: describe a CPU other than the one running, for tests and for asking
//! what the policy would choose elsewhere.

use std::collections::BTreeMap;
use std::sync::Arc;

use raw_cpuid::{CpuIdReader, CpuIdResult};

/// A CPUID reader that answers from a table of `(leaf, subleaf) -> [eax, ebx, ecx, edx]`.
/// Leaves not in the table read as zero, as unsupported leaves do on AMD.
///
/// ```
/// use hugeprep::cpu::{CpuInfo, CpuidTable, Vendor};
/// let table = CpuidTable::new()
///     .leaf(0, 0, [0x16, u32::from_le_bytes(*b"Genu"), u32::from_le_bytes(*b"ntel"), u32::from_le_bytes(*b"ineI")])
///     .leaf(1, 0, [0x50657, 0, 0, 0]);
/// let cpu = CpuInfo::from_cpuid(table);
/// assert_eq!((cpu.vendor, cpu.family, cpu.model, cpu.stepping), (Vendor::Intel, 6, 85, 7));
/// ```
#[derive(Debug, Clone, Default)]
pub struct CpuidTable {
    leaves: Arc<BTreeMap<(u32, u32), [u32; 4]>>,
}

impl CpuidTable {
    /// An empty table: every leaf reads as zero.
    pub fn new() -> CpuidTable {
        CpuidTable::default()
    }

    /// Sets the registers `[eax, ebx, ecx, edx]` that `cpuid(leaf, subleaf)` returns.
    pub fn leaf(mut self, leaf: u32, subleaf: u32, regs: [u32; 4]) -> CpuidTable {
        Arc::make_mut(&mut self.leaves).insert((leaf, subleaf), regs);
        self
    }

    /// Sets the brand string leaves 0x80000002..=0x80000004 (at most 47 bytes are kept).
    pub fn brand(self, brand: &str) -> CpuidTable {
        let mut bytes = [0u8; 48];
        let n = brand.len().min(47);
        bytes[..n].copy_from_slice(&brand.as_bytes()[..n]);
        let word =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        (0..3).fold(self, |table, l| {
            let base = l * 16;
            table.leaf(
                0x8000_0002 + l as u32,
                0,
                [word(base), word(base + 4), word(base + 8), word(base + 12)],
            )
        })
    }
}

impl CpuIdReader for CpuidTable {
    fn cpuid2(&self, eax: u32, ecx: u32) -> CpuIdResult {
        let [eax, ebx, ecx, edx] = self.leaves.get(&(eax, ecx)).copied().unwrap_or_default();
        CpuIdResult { eax, ebx, ecx, edx }
    }
}
