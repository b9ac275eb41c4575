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

/// What the cleared memory is for, which decides whether small extents may stay in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClearPurpose {
    /// Released guest memory, zeroed to be handed to another VM later: nobody reads it soon,
    /// so cached stores would only evict useful data. Always the plan's streaming method,
    /// whatever the extent and LLC size.
    #[default]
    Scrub,
    /// Memory that is read or written right after the clear: extents below `nt_min_extent`
    /// use cached `rep stosb` so that the zeroes are still in the cache for that use.
    UseSoon,
}

impl ClearPurpose {
    /// `scrub` or `use-soon`.
    pub const fn name(self) -> &'static str {
        match self {
            ClearPurpose::Scrub => "scrub",
            ClearPurpose::UseSoon => "use-soon",
        }
    }
}

impl fmt::Display for ClearPurpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How to clear: the method plus the knobs a policy rule sets, and what the memory is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearPlan {
    /// The method for extents of at least `nt_min_extent` bytes.
    pub method: Method,
    /// Non-temporal kernels issue one `sfence` per this many bytes (never per 4 KiB page:
    /// that costs two thirds of the bandwidth). Also the slice size for progress and
    /// throttling.
    pub fence_interval: usize,
    /// With [`ClearPurpose::UseSoon`], extents smaller than this are cleared with
    /// `rep stosb` (cached), so that data used right after the clear is still in the cache.
    /// A [`ClearPurpose::Scrub`] ignores it.
    pub nt_min_extent: usize,
    /// Which of the two cases this plan clears for.
    #[serde(default)]
    pub purpose: ClearPurpose,
}

impl ClearPlan {
    /// A plan that always uses `method`, whatever the extent size, fencing every 2 MiB.
    pub const fn always(method: Method) -> ClearPlan {
        ClearPlan {
            method,
            fence_interval: 2 << 20,
            nt_min_extent: 0,
            purpose: ClearPurpose::Scrub,
        }
    }

    /// The same plan for `purpose`.
    pub const fn for_purpose(self, purpose: ClearPurpose) -> ClearPlan {
        ClearPlan { purpose, ..self }
    }

    /// The method an extent of `len` bytes is cleared with: the plan's, except that a
    /// [`ClearPurpose::UseSoon`] extent below `nt_min_extent` uses cached `rep stosb`.
    ///
    /// ```
    /// use hugeprep::clear::{ClearPlan, ClearPurpose, Method};
    /// let plan = ClearPlan { nt_min_extent: 480 << 20, ..ClearPlan::always(Method::Avx512Nt) };
    /// assert_eq!(plan.method_for(64 << 20), Method::Avx512Nt);
    /// let soon = plan.for_purpose(ClearPurpose::UseSoon);
    /// assert_eq!(soon.method_for(64 << 20), Method::RepStosb);
    /// assert_eq!(soon.method_for(512 << 20), Method::Avx512Nt);
    /// ```
    pub const fn method_for(&self, len: usize) -> Method {
        let cached = matches!(self.purpose, ClearPurpose::UseSoon)
            && self.method.is_non_temporal()
            && len < self.nt_min_extent;
        if cached {
            Method::RepStosb
        } else {
            self.method
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
