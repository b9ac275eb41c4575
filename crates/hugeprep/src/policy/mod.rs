//! Policies: which clearing method, extent, fence interval and thread count to use on which
//! CPU ([`ClearingPolicy`], from `policies/clearing.toml`), and whether calibration may
//! override it ([`Resolution::apply_calibration`]).
//!
//! ```
//! use hugeprep::cpu::CpuInfo;
//! use hugeprep::policy::{ClearingPolicy, DecidedBy};
//!
//! let resolution = ClearingPolicy::embedded().resolve(CpuInfo::host());
//! assert_eq!(resolution.decided_by, DecidedBy::Rule);
//! assert!(!resolution.source.is_empty());
//! ```

mod adaptive;
mod clearing;
mod confidence;
mod error;
pub mod pool;
mod pool_error;
mod recycle;
mod resolution;
mod rule;
mod schema;
mod target;
pub mod tenants;
mod validate;

pub use clearing::{
    ClearingPolicy, BUILTIN_FALLBACK_RULE, CALIBRATION_BUDGET, EMBEDDED_CLEARING_POLICY,
    EMBEDDED_CLEARING_POLICY_PATH,
};
pub use confidence::{
    Confidence, Evidence, Judgement, Margins, GUESS_MARGINS, KNOWN_MODEL_MARGINS,
};
pub use error::PolicyError;

pub use pool::{PoolPolicy, PoolPolicyError, Verification};
pub use resolution::{
    CalibrationOutcome, DecidedBy, Resolution, Timings, Verdict, CALIBRATION_TOLERANCE,
};
pub use rule::{CalibrationMode, IdMatch, NtMinExtent, Rule, Threads, FALLBACK_LLC_BYTES};
