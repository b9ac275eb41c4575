//! Zeroing memory as fast as the CPU allows (implemented by the clearing-engine work).

mod method;

pub use method::{ClearPlan, Method, MethodError};
