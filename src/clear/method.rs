//! The clearing methods and the plan that says how to use one.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A way to zero memory. Which one is fastest depends on the CPU model and the extent size
/// (see `docs/clearing.md` and `policies/clearing.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// `rep stosb`: cached below the LLC size, streaming above it on ERMS/FSRM CPUs.
    RepStosb,
    /// `movnti`: 8-byte non-temporal stores (SSE2, every x86-64).
    Movnti,
    /// `vmovntdq` with 32-byte AVX2 registers.
    Avx2Nt,
    /// `vmovntdq` with 64-byte AVX-512 registers.
    Avx512Nt,
    /// AMD `clzero`: zeroes one cache line without reading it.
    Clzero,
    /// `core::ptr::write_bytes`, the compiler's memset: the portable reference.
    WriteBytes,
}

/// A method name that is not one of [`Method::ALL`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown clearing method {input:?}: expected one of rep-stosb, movnti, avx2-nt, avx512-nt, clzero, write-bytes")]
pub struct MethodError {
    /// What the user wrote.
    pub input: String,
}

impl Method {
    /// Every method, in the order reports list them.
    pub const ALL: [Method; 6] = [
        Method::RepStosb,
        Method::Movnti,
        Method::Avx2Nt,
        Method::Avx512Nt,
        Method::Clzero,
        Method::WriteBytes,
    ];

    /// The name used in policies, the CLI and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Method::RepStosb => "rep-stosb",
            Method::Movnti => "movnti",
            Method::Avx2Nt => "avx2-nt",
            Method::Avx512Nt => "avx512-nt",
            Method::Clzero => "clzero",
            Method::WriteBytes => "write-bytes",
        }
    }

    /// Whether the method bypasses the cache and so needs an `sfence` before the data is
    /// globally visible.
    pub const fn is_non_temporal(self) -> bool {
        matches!(
            self,
            Method::Movnti | Method::Avx2Nt | Method::Avx512Nt | Method::Clzero
        )
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Method {
    type Err = MethodError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Method::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| MethodError {
                input: s.to_string(),
            })
    }
}

/// How to clear: the method plus the knobs a policy rule sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearPlan {
    /// The method for extents of at least `nt_min_extent` bytes.
    pub method: Method,
    /// Non-temporal kernels issue one `sfence` per this many bytes (never per 4 KiB page:
    /// that costs two thirds of the bandwidth). Also the slice size for progress and
    /// throttling.
    pub fence_interval: usize,
    /// Extents smaller than this are cleared with `rep stosb` (cached), because streaming
    /// stores only pay off above the LLC size.
    pub nt_min_extent: usize,
}

impl ClearPlan {
    /// A plan that always uses `method`, whatever the extent size, fencing every 2 MiB.
    pub const fn always(method: Method) -> ClearPlan {
        ClearPlan {
            method,
            fence_interval: 2 << 20,
            nt_min_extent: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in Method::ALL {
            assert_eq!(m.name().parse::<Method>(), Ok(m));
            let json = serde_json::to_string(&m).unwrap();
            assert_eq!(json, format!("\"{}\"", m.name()));
        }
        assert!("avx".parse::<Method>().is_err());
    }
}
