//! The hugepage sizes hugeprep manages, as a typed enum rather than a byte count.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A hugetlb page size supported on x86-64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PageSize {
    /// 2 MiB pages (PMD-mapped).
    #[serde(rename = "2M")]
    Size2M,
    /// 1 GiB pages (PUD-mapped); the kernel often cannot supply them after boot (fragmentation).
    #[serde(rename = "1G")]
    Size1G,
}

/// A page size string that names neither 2 MiB nor 1 GiB.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("page size {input:?} is not supported: use 2M (2048 KiB) or 1G (1048576 KiB)")]
pub struct PageSizeError {
    /// What the user wrote.
    pub input: String,
}

impl PageSize {
    /// Every size, smallest first.
    pub const ALL: [PageSize; 2] = [PageSize::Size2M, PageSize::Size1G];

    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        match self {
            PageSize::Size2M => 2 << 20,
            PageSize::Size1G => 1 << 30,
        }
    }

    /// The size in KiB, as sysfs names it (`hugepages-2048kB`).
    pub const fn kib(self) -> u64 {
        self.bytes() >> 10
    }

    /// The sysfs directory name under `.../hugepages/`.
    pub fn sysfs_dir(self) -> String {
        format!("hugepages-{}kB", self.kib())
    }

    /// `log2(bytes)`, the value encoded in the `MAP_HUGE_*` / `MFD_HUGE_*` flag bits.
    pub const fn shift(self) -> u32 {
        match self {
            PageSize::Size2M => 21,
            PageSize::Size1G => 30,
        }
    }

    /// The size whose byte count is `bytes`, if any.
    pub fn from_bytes(bytes: u64) -> Option<PageSize> {
        PageSize::ALL.into_iter().find(|p| p.bytes() == bytes)
    }

    /// The short name used in the CLI, the API and policy files (`2M`, `1G`).
    pub const fn name(self) -> &'static str {
        match self {
            PageSize::Size2M => "2M",
            PageSize::Size1G => "1G",
        }
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PageSize {
    type Err = PageSizeError;

    /// Accepts `2M`, `2MiB`, `2MB`, `2048k`, `2048kB`, `1G`, `1GiB`, `1GB`, `1048576kB`
    /// (case-insensitive) and plain byte counts.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PageSizeError {
            input: s.to_string(),
        };
        let bytes = crate::units::parse_bytes(s).map_err(|_| err())?;
        PageSize::from_bytes(bytes).ok_or_else(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_spellings() {
        for s in ["2M", "2m", "2MiB", "2MB", "2048k", "2048kB", "2097152"] {
            assert_eq!(s.parse::<PageSize>(), Ok(PageSize::Size2M), "{s}");
        }
        for s in ["1G", "1GiB", "1gb", "1048576kB"] {
            assert_eq!(s.parse::<PageSize>(), Ok(PageSize::Size1G), "{s}");
        }
    }

    #[test]
    fn rejects_unsupported_sizes_naming_the_input() {
        let err = "4K".parse::<PageSize>().unwrap_err();
        assert!(err.to_string().contains("\"4K\""), "{err}");
        assert!("huge".parse::<PageSize>().is_err());
    }

    #[test]
    fn sysfs_names() {
        assert_eq!(PageSize::Size2M.sysfs_dir(), "hugepages-2048kB");
        assert_eq!(PageSize::Size1G.sysfs_dir(), "hugepages-1048576kB");
        assert_eq!(1u64 << PageSize::Size1G.shift(), PageSize::Size1G.bytes());
    }
}
