//! Zeroing memory as fast as the CPU allows.
//!
//! A [`ClearPlan`] names a [`Method`] and its knobs; [`Clearer::new`] checks it against the
//! running CPU once, then [`Clearer::clear`] and [`Clearer::clear_parallel`] zero extents.
//! The kernels (the crate's only inline assembly) live in `kernels.rs`; [`calibrate`] times
//! every available method on this machine.

mod calibrate;
mod clearer;
mod detect;
mod kernels;
mod method;
mod parallel;

pub use calibrate::{
    calibrate, calibrate_on, calibrate_with, calibrate_with_pages, CalibrateError, Calibration,
    CalibrationMemory, MethodTiming, CALIBRATION_BUFFER, CALIBRATION_ROUNDS,
};
pub use clearer::{ClearError, Clearer};
pub use detect::available_methods;
pub use method::{ClearPlan, ClearPurpose, Method, MethodError};
pub use parallel::CHUNK_ALIGN;
