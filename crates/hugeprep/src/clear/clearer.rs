//! [`Clearer`]: a checked plan plus the kernel it runs, and the one safe entry point for
//! zeroing memory.

use super::kernels::{self, Kernel};
use super::{ClearPlan, Method};
use crate::sys::affinity::AffinityError;

/// Why a plan cannot be used or a clear did not complete.
#[derive(Debug, thiserror::Error)]
pub enum ClearError {
    /// The running CPU lacks the instructions for the plan's method.
    #[error("clearing method {method} is not available on this CPU (available: {available})")]
    Unavailable {
        /// The method asked for.
        method: Method,
        /// The methods this CPU does offer, comma-separated.
        available: String,
    },
    /// A plan field is out of range.
    #[error("clear plan field `{field}` = {value} is invalid: it must be {requirement}")]
    InvalidPlan {
        /// The field's name in [`ClearPlan`] (and in policy files).
        field: &'static str,
        /// The value given.
        value: usize,
        /// What a valid value looks like.
        requirement: &'static str,
    },
    /// [`Clearer::clear_parallel`] was given no CPU to run on.
    #[error("parallel clear of {len} bytes was given no CPUs to run on")]
    NoCpus {
        /// Length of the extent that was not cleared.
        len: usize,
    },
    /// A worker could not be pinned to its CPU and left its chunk uncleared.
    #[error("parallel clear worker for bytes {start}..{end} could not be pinned: {source}")]
    Pin {
        /// Start of the worker's chunk, relative to the extent.
        start: usize,
        /// End of the worker's chunk.
        end: usize,
        /// The affinity error, naming the CPU.
        source: AffinityError,
    },
}

/// A validated [`ClearPlan`] with its kernel chosen once, in the manner of memchr's
/// CPU-specific searchers: [`Clearer::new`] checks the CPU, after which clearing cannot fail.
///
/// ```
/// use hugeprep::clear::Clearer;
/// use hugeprep::{ClearPlan, Method};
///
/// let clearer = Clearer::new(ClearPlan::always(Method::Movnti)).unwrap();
/// let mut buf = vec![0xa5u8; 100_000];
/// clearer.clear(&mut buf[3..]);
/// assert_eq!(buf[..3], [0xa5; 3]);
/// assert!(buf[3..].iter().all(|&b| b == 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clearer {
    plan: ClearPlan,
    kernel: Kernel,
}

/// Fence intervals are whole cache lines so that every streamed slice is whole lines.
const FENCE_GRANULE: usize = 64;

impl Clearer {
    /// Checks `plan` against the running CPU and its own limits.
    ///
    /// Fails with [`ClearError::Unavailable`] when the CPU lacks the method and with
    /// [`ClearError::InvalidPlan`] naming the field when `fence_interval` is not a positive
    /// multiple of 64 bytes.
    pub fn new(plan: ClearPlan) -> Result<Clearer, ClearError> {
        if plan.fence_interval == 0 || plan.fence_interval % FENCE_GRANULE != 0 {
            return Err(ClearError::InvalidPlan {
                field: "fence_interval",
                value: plan.fence_interval,
                requirement: "a positive multiple of 64 bytes (one cache line)",
            });
        }
        let kernel = Kernel::detect(plan.method).ok_or_else(|| ClearError::Unavailable {
            method: plan.method,
            available: super::available_methods()
                .iter()
                .map(|m| m.name())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        Ok(Clearer { plan, kernel })
    }

    /// The plan this clearer runs.
    pub fn plan(&self) -> &ClearPlan {
        &self.plan
    }

    /// The kernel for an extent of `len` bytes: for memory used right after the clear
    /// ([`super::ClearPurpose::UseSoon`]), non-temporal methods give way to cached `rep stosb`
    /// below `nt_min_extent`, so that the zeroes are still in the cache for that use. A scrub
    /// always streams.
    pub(crate) fn kernel_for(&self, len: usize) -> Kernel {
        if self.plan.method_for(len) == self.plan.method {
            self.kernel
        } else {
            Kernel::REP_STOSB
        }
    }

    /// The method that clearing an extent of `len` bytes actually uses.
    pub fn method_for(&self, len: usize) -> Method {
        self.kernel_for(len).method()
    }

    /// Zeroes `buf` on the calling thread. With [`super::ClearPurpose::UseSoon`], extents
    /// shorter than the plan's `nt_min_extent` are cleared with `rep stosb` (cached) whatever
    /// the method.
    pub fn clear(&self, buf: &mut [u8]) {
        kernels::zero(self.kernel_for(buf.len()), buf, self.plan.fence_interval);
    }

    pub(crate) fn fence_interval(&self) -> usize {
        self.plan.fence_interval
    }
}
