//! Calibration: timing every available clearing method on this machine, so that a policy
//! rule's choice can be checked (or overridden) by measurement.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::clearer::{ClearError, Clearer};
use super::{ClearPlan, Method};
use crate::page_size::PageSize;
use crate::stats::Summary;
use crate::sys::mmap::{MmapError, MmapRegion};

/// Default scratch buffer: at least twice the LLC of current server CPUs (32 MiB per CCD on
/// Zen 4), so that every timed clear streams to memory rather than into the cache.
pub const CALIBRATION_BUFFER: usize = 128 << 20;

/// Rounds of timing: every method is timed once per round, in a rotated order, so that a
/// slow moment of a shared host hits every method alike and a rule can be judged on each
/// round separately.
pub const CALIBRATION_ROUNDS: usize = 3;
/// Most timed repetitions per method and round, however long the budget.
const MAX_REPS_PER_ROUND: usize = 60;

/// Calibration could not run.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// No method was given to time.
    #[error("calibration needs at least one clearing method")]
    NoMethods,
    /// The scratch buffer size is unusable.
    #[error("calibration buffer_bytes = {buffer_bytes} is invalid: it must be at least 2 MiB")]
    BufferTooSmall {
        /// The size asked for.
        buffer_bytes: usize,
    },
    /// Neither a hugepage-backed nor an ordinary scratch buffer could be mapped.
    #[error("cannot map a {len}-byte calibration buffer: {source}")]
    Map {
        /// Bytes asked for.
        len: usize,
        /// The error of the anonymous (fallback) mapping.
        source: MmapError,
    },
    /// A method could not be used (not available on this CPU).
    #[error("cannot calibrate: {0}")]
    Clear(#[from] ClearError),
}

/// One method's measured throughput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MethodTiming {
    /// The method timed.
    pub method: Method,
    /// Median throughput over every timed repetition, GB/s (10^9 bytes per second).
    pub gbps: f64,
    /// Median throughput in each round, GB/s.
    #[serde(default)]
    pub rounds: Vec<f64>,
}

/// Which memory a calibration's scratch buffer was on: the methods' speeds differ between
/// hugepages and ordinary memory (TLB misses), and the daemon scrubs hugepages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CalibrationMemory {
    /// 2M hugepages that were free in the kernel's pool.
    FreeHugepages,
    /// 2M hugepages the daemon added to the kernel's pool for its warm target, timed on
    /// before the pool filled them.
    DaemonHugepages,
    /// Ordinary anonymous memory: no free hugepages to be had.
    Ordinary,
}

impl CalibrationMemory {
    /// Words for `hugeprep cpu` and the log, for a buffer on 2M pages.
    pub fn describe(self) -> &'static str {
        match self {
            CalibrationMemory::FreeHugepages => "2M hugepages (free in the kernel's pool)",
            CalibrationMemory::DaemonHugepages => {
                "2M hugepages (added by the daemon for its warm target)"
            }
            CalibrationMemory::Ordinary => "ordinary memory",
        }
    }

    /// As [`CalibrationMemory::describe`], for a buffer on pages of `page_size`.
    pub fn describe_on(self, page_size: PageSize) -> String {
        match self {
            CalibrationMemory::FreeHugepages => {
                format!("{page_size} hugepages (free in the kernel's pool)")
            }
            CalibrationMemory::DaemonHugepages => {
                format!("{page_size} hugepages (added by the daemon for its warm target)")
            }
            CalibrationMemory::Ordinary => "ordinary memory".into(),
        }
    }
}

/// What calibration measured on this machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Size of the scratch buffer each repetition cleared in one call.
    pub buffer_bytes: usize,
    /// Whether the buffer was backed by 2 MiB hugepages (otherwise ordinary anonymous
    /// memory, whose TLB misses make every method a little slower).
    pub hugepage_backed: bool,
    /// Why the buffer is not hugepage-backed, when it is not.
    #[serde(default)]
    pub backing_note: Option<String>,
    /// Which memory the buffer was on; `None` in records stored before hugeprep said
    /// (`hugepage_backed` still tells hugepages from ordinary memory).
    #[serde(default)]
    pub memory: Option<CalibrationMemory>,
    /// The hugepage size the buffer was on (`None`: ordinary memory, or 2M in records stored
    /// before hugeprep said; see [`Calibration::page_size`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<PageSize>,
    /// Wall time of the whole calibration, warm-up included, in milliseconds.
    #[serde(default)]
    pub elapsed_ms: f64,
    /// Every method timed, in the order asked.
    pub methods: Vec<MethodTiming>,
    /// The method with the highest median throughput.
    pub fastest: Method,
}

impl Calibration {
    /// The hugepage size the buffer was on; `None` for ordinary memory.
    pub fn page_size(&self) -> Option<PageSize> {
        self.page_size
            .or(self.hugepage_backed.then_some(PageSize::Size2M))
    }

    /// Which memory the buffer was on, in words, with the note on why it was not the memory
    /// asked for (when it was not).
    pub fn describe_memory(&self) -> String {
        let memory = match (self.page_size(), self.memory) {
            (Some(ps), Some(memory)) => memory.describe_on(ps),
            (Some(ps), None) => format!("{ps} hugepages"),
            (None, _) => "ordinary memory".into(),
        };
        match &self.backing_note {
            Some(note) => format!("{memory}: {note}"),
            None => memory,
        }
    }

    /// The measured throughput of `method`, if it was timed.
    pub fn gbps_of(&self, method: Method) -> Option<f64> {
        self.methods
            .iter()
            .find(|t| t.method == method)
            .map(|t| t.gbps)
    }

    /// Whether `method` reached at least `1 - tolerance` of the fastest method's throughput
    /// (`tolerance` 0.10: within 10%). False for a method that was not timed.
    ///
    /// ```
    /// use hugeprep::clear::{Calibration, MethodTiming};
    /// use hugeprep::Method;
    /// let c = Calibration {
    ///     buffer_bytes: 128 << 20,
    ///     hugepage_backed: true,
    ///     backing_note: None,
    ///     memory: None,
    ///     page_size: None,
    ///     elapsed_ms: 260.0,
    ///     methods: vec![
    ///         MethodTiming { method: Method::Avx512Nt, gbps: 73.0, rounds: vec![] },
    ///         MethodTiming { method: Method::Clzero, gbps: 69.0, rounds: vec![] },
    ///         MethodTiming { method: Method::Movnti, gbps: 37.0, rounds: vec![] },
    ///     ],
    ///     fastest: Method::Avx512Nt,
    /// };
    /// assert!(c.within(Method::Clzero, 0.10));
    /// assert!(!c.within(Method::Movnti, 0.10));
    /// assert!(!c.within(Method::RepStosb, 0.10));
    /// ```
    pub fn within(&self, method: Method, tolerance: f64) -> bool {
        match (self.gbps_of(method), self.gbps_of(self.fastest)) {
            (Some(gbps), Some(best)) => gbps >= best * (1.0 - tolerance),
            _ => false,
        }
    }
}

/// Times every available method over a [`CALIBRATION_BUFFER`]-byte scratch buffer, spending
/// about `budget` on the timed repetitions after an untimed warm-up (200 ms: about 300 ms in
/// all). Runs on the calling thread without changing its CPU affinity.
pub fn calibrate(budget: Duration) -> Result<Calibration, CalibrateError> {
    calibrate_with(&super::available_methods(), CALIBRATION_BUFFER, budget)
}

/// [`calibrate`] on hugepages of `page_size`: the buffer is one mapping of such pages (a 1G
/// page holds the whole buffer), falling back to 2M pages and then ordinary memory, each
/// fallback with its reason in [`Calibration::backing_note`].
pub fn calibrate_on(budget: Duration, page_size: PageSize) -> Result<Calibration, CalibrateError> {
    calibrate_with_pages(
        &super::available_methods(),
        CALIBRATION_BUFFER,
        budget,
        page_size,
    )
}

/// The scratch buffer: `len` bytes on pages of `page_size` (the mapping rounded up to whole
/// pages), else on 2M pages, else ordinary memory; the page size it got and why not the one
/// asked for.
fn map_buffer(
    len: usize,
    page_size: PageSize,
) -> Result<(MmapRegion, Option<PageSize>, Option<String>), CalibrateError> {
    let mut notes = Vec::new();
    let mut sizes = vec![page_size];
    if page_size != PageSize::Size2M {
        sizes.push(PageSize::Size2M);
    }
    for ps in sizes {
        let page = ps.bytes() as usize;
        match MmapRegion::anonymous(len.div_ceil(page) * page, Some(ps)) {
            Ok(region) => {
                let note = (!notes.is_empty())
                    .then(|| format!("{}: timed on {ps} hugepages", notes.join("; ")));
                return Ok((region, Some(ps), note));
            }
            Err(err) => notes.push(format!(
                "the kernel could not supply {} of free {ps} hugepages ({err})",
                crate::units::format_bytes((len.div_ceil(page) * page) as u64)
            )),
        }
    }
    let region =
        MmapRegion::anonymous(len, None).map_err(|source| CalibrateError::Map { len, source })?;
    Ok((
        region,
        None,
        Some(format!("{}: timed on ordinary memory", notes.join("; "))),
    ))
}

/// [`calibrate`] with a chosen set of methods and buffer size (rounded up to 2 MiB).
///
/// The buffer is hugepage-backed when the kernel has enough free 2 MiB pages, otherwise
/// ordinary anonymous memory; [`Calibration::hugepage_backed`] and
/// [`Calibration::backing_note`] say which and why. It is populated and cleared once before
/// timing, because the first touch of memory (on a VM host: of guest-physical memory since
/// boot) is many times slower than any clearing method, and each method clears it once
/// untimed. Then [`CALIBRATION_ROUNDS`] rounds time every method, in a rotated order, for an
/// equal share of `budget` (at least one clear of the whole buffer each); each method reports
/// its median per round and over every sample.
pub fn calibrate_with(
    methods: &[Method],
    buffer_bytes: usize,
    budget: Duration,
) -> Result<Calibration, CalibrateError> {
    calibrate_with_pages(methods, buffer_bytes, budget, PageSize::Size2M)
}

/// [`calibrate_with`] on hugepages of `page_size` (see [`calibrate_on`]).
pub fn calibrate_with_pages(
    methods: &[Method],
    buffer_bytes: usize,
    budget: Duration,
    page_size: PageSize,
) -> Result<Calibration, CalibrateError> {
    let began = Instant::now();
    if methods.is_empty() {
        return Err(CalibrateError::NoMethods);
    }
    let page = PageSize::Size2M.bytes() as usize;
    if buffer_bytes < page {
        return Err(CalibrateError::BufferTooSmall { buffer_bytes });
    }
    let clearers = methods
        .iter()
        .map(|&m| Clearer::new(ClearPlan::always(m)))
        .collect::<Result<Vec<_>, _>>()?;
    let len = buffer_bytes.div_ceil(page) * page;
    let (mut region, on_pages, backing_note) = map_buffer(len, page_size)?;
    if let Some(note) = &backing_note {
        tracing::info!("calibration: {note}");
    }
    // Populating is only a speed-up (kernels before 5.14 lack it): the clear below touches
    // every page anyway.
    let _ = region.populate_write(0, len);
    region.as_mut_slice()[..len].fill(0);
    for clearer in &clearers {
        clearer.clear(&mut region.as_mut_slice()[..len]);
    }

    let share = budget / (methods.len() * CALIBRATION_ROUNDS) as u32;
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); methods.len()];
    let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); methods.len()];
    for round in 0..CALIBRATION_ROUNDS {
        for k in 0..clearers.len() {
            let i = (k + round) % clearers.len();
            let buf = &mut region.as_mut_slice()[..len];
            let started = Instant::now();
            let mut this_round = Vec::new();
            while this_round.is_empty()
                || (this_round.len() < MAX_REPS_PER_ROUND && started.elapsed() < share)
            {
                let t = Instant::now();
                clearers[i].clear(buf);
                this_round.push(crate::units::gbps(len as u64, t.elapsed().as_secs_f64()));
            }
            rounds[i].push(Summary::of(&this_round).map_or(0.0, |s| s.median));
            samples[i].extend(this_round);
        }
    }
    let timings: Vec<MethodTiming> = clearers
        .iter()
        .zip(samples.iter().zip(rounds))
        .map(|(clearer, (samples, rounds))| MethodTiming {
            method: clearer.plan().method,
            // Every round timed at least once, so there is a median.
            gbps: Summary::of(samples).map_or(0.0, |s| s.median),
            rounds,
        })
        .collect();
    let fastest = timings
        .iter()
        .max_by(|a, b| a.gbps.total_cmp(&b.gbps))
        .map_or(methods[0], |t| t.method);
    Ok(Calibration {
        buffer_bytes: len,
        hugepage_backed: on_pages.is_some(),
        memory: Some(if on_pages.is_some() {
            CalibrationMemory::FreeHugepages
        } else {
            CalibrationMemory::Ordinary
        }),
        page_size: on_pages,
        backing_note,
        elapsed_ms: began.elapsed().as_secs_f64() * 1e3,
        methods: timings,
        fastest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_inputs_name_the_field() {
        let err = calibrate_with(&[], 64 << 20, Duration::from_millis(10)).unwrap_err();
        assert!(matches!(err, CalibrateError::NoMethods), "{err}");
        let err = calibrate_with(&[Method::WriteBytes], 4096, Duration::ZERO).unwrap_err();
        assert!(err.to_string().contains("buffer_bytes = 4096"), "{err}");
    }
}
