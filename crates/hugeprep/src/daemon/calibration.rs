//! The clearing calibration kept in the daemon's state directory, so that a restart on the same CPU,
//! kernel and policy reuses the decision instead of re-measuring it, and a re-measurement
//! starts from the earlier decision (hysteresis across runs).
//!
//! The record is `<state_dir>/calibration/records/clearing.json`, written atomically by the
//! [`Journal`] (temporary file, `fsync`, `rename`, `fsync` of the directory).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::calibration_pages::{self, PagesFrom};
use crate::clear::{calibrate_on, CalibrateError, Calibration, CalibrationMemory, Method};
use crate::cpu::CpuInfo;
use crate::journal::{Journal, JournalError};
use crate::policy::{CalibrationMode, ClearingPolicy, Resolution, CALIBRATION_BUDGET};

/// The state directory's subdirectory that holds the stored calibration.
pub const CALIBRATION_DIR: &str = "calibration";
const RECORD: &str = "clearing";
const OSRELEASE: &str = "/proc/sys/kernel/osrelease";

/// What a calibration result is valid for: the same CPU, kernel, policy and hugeprep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalibrationKey {
    /// The CPU's identity, features and LLC size.
    pub cpu: String,
    /// The running kernel's release (`uname -r`).
    pub kernel: String,
    /// A hash of the clearing policy's rules and the calibration mode.
    pub policy: String,
    /// The hugeprep version that measured.
    pub hugeprep: String,
}

impl CalibrationKey {
    /// The key for `cpu` under `policy` in `mode` on the running kernel.
    pub fn current(cpu: &CpuInfo, policy: &ClearingPolicy, mode: CalibrationMode) -> Self {
        let kernel = std::fs::read_to_string(OSRELEASE)
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        CalibrationKey {
            cpu: format!(
                "{cpu}, signature {:#010x}, features {}, llc {:?}",
                cpu.signature, cpu.features, cpu.llc_bytes
            ),
            kernel,
            policy: format!(
                "{:016x}",
                fnv1a(format!("{:?} {mode}", policy.rules()).as_bytes())
            ),
            hugeprep: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// Whether only the kernel or the hugeprep version differs: the earlier decision is still
    /// about this CPU and policy, so it seeds the hysteresis of a new measurement.
    fn same_cpu_and_policy(&self, other: &CalibrationKey) -> bool {
        self.cpu == other.cpu && self.policy == other.policy
    }
}

/// 64-bit FNV-1a: stable across builds and Rust versions, unlike `DefaultHasher`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The stored record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredCalibration {
    /// What it is valid for.
    pub key: CalibrationKey,
    /// When it was measured, seconds since the epoch.
    pub measured_at: u64,
    /// The measurements.
    pub measured: Calibration,
    /// The method calibration put in place of the rule's, and its GB/s; `None` when the
    /// rule's method was kept.
    pub override_method: Option<(Method, f64)>,
}

/// Where the calibration behind a decision came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum CalibrationOrigin {
    /// Measured now (no stored result, a different CPU, kernel or policy, or asked to redo).
    Measured {
        /// Why it was measured rather than reused.
        why: String,
    },
    /// Reused from the state directory.
    Stored {
        /// The record's path.
        path: PathBuf,
        /// When it was measured, seconds since the epoch.
        measured_at: u64,
    },
}

/// A clearing decision with the calibration it rests on.
#[derive(Debug, Clone)]
pub struct StoredDecision {
    /// The decision.
    pub resolution: Resolution,
    /// The measurements, when calibration ran now or was reused.
    pub measured: Option<Calibration>,
    /// Where they came from; `None` when calibration is off.
    pub origin: Option<CalibrationOrigin>,
}

/// Storing or reading the calibration record failed (the decision itself still stands).
#[derive(Debug, thiserror::Error)]
#[error("calibration record in {dir}: {source}")]
pub struct StoreError {
    /// The directory.
    pub dir: PathBuf,
    /// The journal's error.
    pub source: JournalError,
}

fn record_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(CALIBRATION_DIR)
}

/// The stored record in `state_dir`, if there is one that decodes.
pub fn load_stored(state_dir: &Path) -> Result<Option<StoredCalibration>, StoreError> {
    let dir = record_dir(state_dir);
    if !dir.exists() {
        return Ok(None);
    }
    let err = |source| StoreError {
        dir: dir.clone(),
        source,
    };
    let journal = Journal::open(&dir).map_err(err)?;
    Ok(journal
        .load::<StoredCalibration>()
        .map_err(err)?
        .into_iter()
        .find(|(k, _)| k == RECORD)
        .map(|(_, v)| v))
}

fn store(state_dir: &Path, record: &StoredCalibration) -> Result<(), StoreError> {
    let dir = record_dir(state_dir);
    let err = |source| StoreError {
        dir: dir.clone(),
        source,
    };
    Journal::open(&dir)
        .map_err(err)?
        .write(RECORD, record)
        .map_err(err)
}

/// [`ClearingPolicy::decide`] with the result kept in `state_dir`: a stored calibration
/// for the same CPU, kernel, policy and mode is reused unless `redo`; otherwise the
/// methods are timed (about 300 ms) and the result stored, starting from the stored
/// override when the CPU and policy are the same (so a re-measurement inside the
/// hysteresis band keeps the earlier choice). A record that cannot be read or written
/// is logged and otherwise ignored.
///
/// The methods are timed on hugepages of the size the daemon scrubs (2M, or 1G for a daemon
/// that serves only 1G pages) when `pages` can supply them (see [`calibration_pages`]), and
/// a stored record timed on other memory is measured again when they can. Otherwise the
/// calibration runs on what there is, and the record ([`Calibration::memory`],
/// [`Calibration::page_size`], [`Calibration::backing_note`]) and a warning say which memory
/// and why.
pub fn decide_stored(
    policy: &ClearingPolicy,
    cpu: &CpuInfo,
    mode: CalibrationMode,
    state_dir: &Path,
    redo: bool,
    pages: PagesFrom<'_>,
) -> Result<StoredDecision, CalibrateError> {
    let mut resolution = policy.resolve(cpu);
    if mode == CalibrationMode::Off {
        return Ok(StoredDecision {
            resolution,
            measured: None,
            origin: None,
        });
    }
    let key = CalibrationKey::current(cpu, policy, mode);
    let page_size = pages.page_size();
    let stored = load_stored(state_dir).unwrap_or_else(|err| {
        tracing::warn!(%err, "ignoring the stored calibration");
        None
    });
    let why = match &stored {
        None => "no stored calibration".to_string(),
        Some(_) if redo => "asked to recalibrate".to_string(),
        Some(s)
            if s.key == key
                && s.measured.page_size() != Some(page_size)
                && calibration_pages::hugepages_obtainable(pages) =>
        {
            format!(
                "the stored calibration was timed on {} and {page_size} hugepages can be had now",
                s.measured
                    .page_size()
                    .map_or("ordinary memory".into(), |ps| format!("{ps} hugepages"))
            )
        }
        Some(s) if s.key == key => {
            resolution.apply_calibration(mode, &s.measured, s.override_method);
            return Ok(StoredDecision {
                resolution,
                measured: Some(s.measured.clone()),
                origin: Some(CalibrationOrigin::Stored {
                    path: record_dir(state_dir).join("records").join("clearing.json"),
                    measured_at: s.measured_at,
                }),
            });
        }
        Some(s) => {
            let changed: Vec<&str> = [
                (s.key.cpu != key.cpu, "CPU"),
                (s.key.kernel != key.kernel, "kernel"),
                (s.key.policy != key.policy, "policy or calibration mode"),
                (s.key.hugeprep != key.hugeprep, "hugeprep version"),
            ]
            .into_iter()
            .filter_map(|(changed, what)| changed.then_some(what))
            .collect();
            format!(
                "the {} changed since the stored calibration",
                changed.join(", ")
            )
        }
    };
    let previous = stored
        .as_ref()
        .filter(|s| s.key.same_cpu_and_policy(&key))
        .and_then(|s| s.override_method);
    let provided = calibration_pages::provide(state_dir, pages);
    let mut measured = calibrate_on(CALIBRATION_BUDGET, page_size)?;
    if measured.page_size == Some(page_size) {
        if provided.raised > 0 {
            measured.memory = Some(CalibrationMemory::DaemonHugepages);
        }
    } else {
        // Never a silent calibration on memory the daemon does not scrub: the record, `hugeprep
        // cpu`, `hugeprep status` and the log say which memory it was and why.
        if let Some(why) = provided.why_not {
            measured.backing_note = Some(match measured.backing_note.take() {
                Some(note) => format!("{why}; {note}"),
                None => why,
            });
        }
        tracing::warn!(
            page_size = %page_size,
            "calibration not timed on the {page_size} pages the daemon scrubs: {}",
            measured.describe_memory()
        );
    }
    resolution.apply_calibration(mode, &measured, previous);
    let override_method = resolution
        .calibration
        .as_ref()
        .filter(|c| c.overridden)
        .map(|c| (c.chosen, measured.gbps_of(c.chosen).unwrap_or(0.0)));
    let record = StoredCalibration {
        key,
        measured_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        measured: measured.clone(),
        override_method,
    };
    if let Err(err) = store(state_dir, &record) {
        tracing::warn!(%err, "could not store the calibration; the next start measures again");
    }
    Ok(StoredDecision {
        resolution,
        measured: Some(measured),
        origin: Some(CalibrationOrigin::Measured { why }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn the_key_changes_with_the_policy_and_mode() {
        let cpu = CpuInfo::host();
        let policy = ClearingPolicy::embedded();
        let auto = CalibrationKey::current(cpu, policy, CalibrationMode::Auto);
        let report = CalibrationKey::current(cpu, policy, CalibrationMode::Report);
        assert_ne!(auto.policy, report.policy);
        assert_eq!(auto.cpu, report.cpu);
        assert!(!auto.kernel.is_empty());
    }
}
