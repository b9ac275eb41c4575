//! Lease requests: the raw form shared by the API and the CLI, and its validation.

use serde::{Deserialize, Serialize};

use crate::hugetlb::Owner;
use crate::page_size::PageSize;
use crate::pool::error::{PoolError, Result};

/// Longest lease name, in bytes.
pub const MAX_NAME: usize = 64;

/// `POST /v1/leases` body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// Unique name; becomes the lease file's name.
    pub name: String,
    /// Bytes, a whole number of pages.
    pub size: u64,
    /// Page size; the default is 2M.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<PageSize>,
    /// NUMA node; when absent, the node of `pid`'s CPUs, else the node with the most warm
    /// memory ([`crate::pool::placement`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u32>,
    /// User (name or uid) to hand the file to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Process whose exit releases the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Long-term pin every page (as VFIO does) before the lease is returned; the pin is
    /// held until the lease is released.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pin: bool,
    /// How the memory comes back when released (`kernel` always takes the kernel's path);
    /// the policy's rule for the owner wins when it is stricter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recycle: Option<crate::policy::pool::Recycle>,
}

/// Checks a lease name: 1 to 64 bytes, no `/`, no NUL, not `.` or `..`, no leading `.`
/// (hidden files are reserved).
///
/// ```
/// use hugeprep::pool::check_name;
/// assert!(check_name("vm-42.ram").is_ok());
/// assert!(check_name("../etc").is_err());
/// ```
pub fn check_name(name: &str) -> Result<()> {
    let bad = |message: String| PoolError::Field {
        field: "name",
        message,
    };
    if name.is_empty() {
        return Err(bad("must not be empty".into()));
    }
    if name.len() > MAX_NAME {
        return Err(bad(format!(
            "{} bytes is longer than the limit of {MAX_NAME}",
            name.len()
        )));
    }
    if name.contains('/') || name.contains('\0') {
        return Err(bad(format!("{name:?} must not contain '/' or NUL")));
    }
    if name.starts_with('.') || name.contains("..") {
        return Err(bad(format!(
            "{name:?} must not start with '.' or contain '..'"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(bad(format!("{name:?} must not contain control characters")));
    }
    Ok(())
}

/// A request that passed validation.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    /// Name.
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// Page size.
    pub page_size: PageSize,
    /// Node.
    pub node: u32,
    /// Owner.
    pub owner: Option<Owner>,
    /// Pid and its start time.
    pub pid: Option<(u32, u64)>,
    /// Long-term pin the file while leased.
    pub pin: bool,
    /// How the memory comes back when released (see [`crate::policy::pool::Recycle`]).
    pub recycle: crate::policy::pool::Recycle,
    /// The principal making the lease (journaled with it).
    pub principal: Option<String>,
    /// The principal and its limits, when a client asks (none: the daemon's own callers).
    pub tenant: Option<crate::pool::tenant::Tenant>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "vm1", "pc.ram", &"x".repeat(64)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a/b",
            "..",
            "a..b",
            ".hidden",
            "a\0b",
            &"x".repeat(65),
            "a\nb",
        ] {
            let err = check_name(bad).unwrap_err();
            assert_eq!(err.field(), Some("name"), "{bad:?}");
        }
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = serde_json::from_str::<LeaseRequest>(r#"{"name":"a","size":2097152,"colour":1}"#)
            .unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }
}
