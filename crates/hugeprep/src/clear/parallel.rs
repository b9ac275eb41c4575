//! Clearing one extent with several threads, each pinned to a CPU and given a disjoint,
//! 4 KiB-aligned chunk.

use std::ops::Range;

use super::clearer::{ClearError, Clearer};
use super::kernels;
use crate::sys::affinity::pin_current_thread;

/// Chunk boundaries fall on base-page boundaries so that no 4 KiB page is shared by two
/// workers (two threads streaming into one page would fight over its lines and TLB entry).
pub const CHUNK_ALIGN: usize = 4096;

/// Splits `len` bytes starting at address `addr` into `parts` consecutive ranges (relative to
/// `addr`) of nearly equal size whose inner boundaries are 4 KiB-aligned addresses. Ranges
/// may be empty when the extent is small.
pub(crate) fn chunk_bounds(addr: usize, len: usize, parts: usize) -> Vec<Range<usize>> {
    let mut bounds = Vec::with_capacity(parts);
    let mut start = 0;
    for i in 1..=parts {
        let end = if i == parts {
            len
        } else {
            let ideal = (len as u128 * i as u128 / parts as u128) as usize;
            let absolute = addr.saturating_add(ideal);
            let rounded = absolute.saturating_add(CHUNK_ALIGN / 2) / CHUNK_ALIGN * CHUNK_ALIGN;
            rounded.saturating_sub(addr).clamp(start, len)
        };
        bounds.push(start..end);
        start = end;
    }
    bounds
}

impl Clearer {
    /// Zeroes `buf` with one scoped thread per entry of `cpus`, each pinned to that CPU and
    /// clearing a disjoint chunk whose boundaries are 4 KiB-aligned. Whether the cached
    /// `rep stosb` path is taken depends on the whole extent's length, not the chunk's.
    ///
    /// Workers whose chunk would be empty (extents under 4 KiB per CPU) are not started. On
    /// error the chunks of workers that could not be pinned are left as they were; the
    /// caller must treat the extent as not cleared.
    ///
    /// ```
    /// use hugeprep::clear::Clearer;
    /// use hugeprep::{ClearPlan, Method};
    /// use hugeprep::sys::affinity::allowed_cpus;
    ///
    /// let clearer = Clearer::new(ClearPlan::always(Method::RepStosb)).unwrap();
    /// let mut buf = vec![1u8; 1 << 20];
    /// clearer.clear_parallel(&mut buf, &allowed_cpus()).unwrap();
    /// assert!(buf.iter().all(|&b| b == 0));
    /// ```
    pub fn clear_parallel(&self, buf: &mut [u8], cpus: &[usize]) -> Result<(), ClearError> {
        if cpus.is_empty() {
            return Err(ClearError::NoCpus { len: buf.len() });
        }
        let kernel = self.kernel_for(buf.len());
        let fence_interval = self.fence_interval();
        let bounds = chunk_bounds(buf.as_ptr() as usize, buf.len(), cpus.len());
        let mut chunks = Vec::with_capacity(bounds.len());
        let mut rest = buf;
        for range in &bounds {
            let (chunk, tail) = rest.split_at_mut(range.len());
            chunks.push(chunk);
            rest = tail;
        }
        std::thread::scope(|scope| {
            let workers: Vec<_> = chunks
                .into_iter()
                .zip(bounds)
                .zip(cpus)
                .filter(|((chunk, _), _)| !chunk.is_empty())
                .map(|((chunk, range), &cpu)| {
                    scope.spawn(move || {
                        pin_current_thread(&[cpu]).map_err(|source| ClearError::Pin {
                            start: range.start,
                            end: range.end,
                            source,
                        })?;
                        kernels::zero(kernel, chunk, fence_interval);
                        Ok(())
                    })
                })
                .collect();
            let mut result = Ok(());
            for worker in workers {
                match worker.join() {
                    Ok(outcome) => {
                        if result.is_ok() {
                            result = outcome;
                        }
                    }
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(addr: usize, len: usize, parts: usize) {
        let bounds = chunk_bounds(addr, len, parts);
        assert_eq!(bounds.len(), parts);
        assert_eq!(bounds[0].start, 0);
        assert_eq!(bounds[parts - 1].end, len);
        for pair in bounds.windows(2) {
            assert_eq!(pair[0].end, pair[1].start);
            let boundary = addr + pair[0].end;
            assert!(
                pair[0].end == 0 || pair[0].end == len || boundary % CHUNK_ALIGN == 0,
                "inner boundary {boundary:#x} of {addr:#x}+{len} in {parts} parts"
            );
        }
    }

    #[test]
    fn chunks_are_disjoint_cover_and_align_to_pages() {
        for addr in [0, 1, 4095, 4096, 0x7f00_0000_0123] {
            for len in [0, 1, 4095, 4096 + 13, 2 << 20, (64 << 20) + 7] {
                for parts in 1..=5 {
                    check(addr, len, parts);
                }
            }
        }
    }

    #[test]
    fn chunks_are_balanced() {
        let bounds = chunk_bounds(0x1000, 64 << 20, 3);
        for b in &bounds {
            let ideal = (64 << 20) / 3;
            assert!(b.len().abs_diff(ideal) <= CHUNK_ALIGN, "{bounds:?}");
        }
    }
}
