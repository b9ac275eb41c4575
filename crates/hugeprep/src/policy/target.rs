//! A warm target of the pool policy: which page size and node, how many bytes, which file
//! sizes or flavors (VM sizes kept as files of exactly that size), as written in TOML and
//! once validated.

use serde::{Deserialize, Serialize};

pub use super::adaptive::{AdaptiveGoal, Percent};
use super::pool_error::PoolPolicyError;
use crate::page_size::PageSize;
use crate::units::{format_bytes, parse_bytes};

/// One warm target as written in TOML.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    /// Page size of the warm files.
    pub page_size: PageSize,
    /// NUMA node; `None` applies to every node.
    #[serde(default)]
    pub node: Option<u32>,
    /// Bytes to keep warm, e.g. `"4G"`; may be left out when `flavors` are given (then the
    /// flavors' sum).
    #[serde(default)]
    pub warm: String,
    /// File sizes to keep (a mix of VM sizes), e.g. `["1G", "2G"]`; empty: files of
    /// `min(warm, 16G)`, so a lease of the whole target (up to 16 GiB) is one warm file.
    #[serde(default)]
    pub sizes: Vec<String>,
    /// VM sizes to keep warm as files of exactly that size, e.g.
    /// `[{ size = "4G", count = 4 }]`; with flavors the pool does not learn its shape.
    #[serde(default)]
    pub flavors: Vec<FlavorSpec>,
    /// An adaptive target's warm-start goal, percent (50 to 100), with `ceiling` and in
    /// place of `warm`: the daemon sizes the target itself (docs/pool.md, "Sizing the pool
    /// itself").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<Percent>,
    /// An adaptive target's ceiling, e.g. `"64G"`: a positive whole number of pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<String>,
}

/// One flavor as written in TOML or JSON: `count` warm files of `size`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlavorSpec {
    /// File size, e.g. `"4G"`: a positive whole number of pages.
    pub size: String,
    /// How many warm files of that size.
    pub count: u32,
}

/// A validated flavor: `count` warm files of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flavor {
    /// Bytes per file, a whole number of pages.
    pub size: u64,
    /// Files.
    pub count: u32,
}

/// A validated warm target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Page size of the warm files.
    pub page_size: PageSize,
    /// Node, or `None` for every node.
    pub node: Option<u32>,
    /// Bytes to keep warm (a whole number of pages).
    pub warm: u64,
    /// File sizes to create when refilling, whole pages each, never empty.
    pub sizes: Vec<u64>,
    /// Flavors to keep warm (their sum is at most `warm`); empty: sizes or learned demand.
    pub flavors: Vec<Flavor>,
    /// The goal of an adaptive target, whose `warm` the daemon sets (0 as validated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveGoal>,
}

/// The most flavors one target may name, and files one flavor may ask for.
pub const MAX_FLAVORS: usize = 64;
/// See [`MAX_FLAVORS`].
pub const MAX_FLAVOR_COUNT: u32 = 4096;

impl TargetSpec {
    /// Validates one target; errors name the field under `prefix` (e.g. `target[0]`).
    pub fn validate(&self, prefix: &str) -> Result<Target, PoolPolicyError> {
        if let Some(adaptive) = super::adaptive::validate(self, prefix)? {
            return Ok(adaptive);
        }
        let t = self;
        let whole_pages = |field: String, s: &str| -> Result<u64, PoolPolicyError> {
            let bytes = field_bytes(field.clone(), s)?;
            if bytes == 0 || bytes % t.page_size.bytes() != 0 {
                return Err(PoolPolicyError::Field {
                    field,
                    message: format!(
                        "{s} is not a positive multiple of the target's page_size {}",
                        t.page_size
                    ),
                });
            }
            Ok(bytes)
        };
        if t.flavors.len() > MAX_FLAVORS {
            return Err(PoolPolicyError::Field {
                field: format!("{prefix}.flavors"),
                message: format!("{} flavors: at most {MAX_FLAVORS}", t.flavors.len()),
            });
        }
        let mut flavors = Vec::new();
        let mut flavor_bytes: u64 = 0;
        for (j, f) in t.flavors.iter().enumerate() {
            let size = whole_pages(format!("{prefix}.flavors[{j}].size"), &f.size)?;
            if f.count == 0 || f.count > MAX_FLAVOR_COUNT {
                return Err(PoolPolicyError::Field {
                    field: format!("{prefix}.flavors[{j}].count"),
                    message: format!("{}: must be 1 to {MAX_FLAVOR_COUNT}", f.count),
                });
            }
            flavor_bytes = size
                .checked_mul(u64::from(f.count))
                .and_then(|b| b.checked_add(flavor_bytes))
                .ok_or_else(|| PoolPolicyError::Field {
                    field: format!("{prefix}.flavors[{j}]"),
                    message: "the flavors' sum overflows".into(),
                })?;
            flavors.push(Flavor {
                size,
                count: f.count,
            });
        }
        let warm = if t.warm.is_empty() {
            if flavors.is_empty() {
                return Err(PoolPolicyError::Field {
                    field: format!("{prefix}.warm"),
                    message: "missing: give warm bytes or flavors".into(),
                });
            }
            flavor_bytes
        } else {
            let warm = round_down(field_bytes(format!("{prefix}.warm"), &t.warm)?, t.page_size);
            if warm < flavor_bytes {
                return Err(PoolPolicyError::Field {
                    field: format!("{prefix}.warm"),
                    message: format!(
                        "{} is less than the flavors' sum {}",
                        format_bytes(warm),
                        format_bytes(flavor_bytes)
                    ),
                });
            }
            warm
        };
        let mut sizes = Vec::new();
        for (j, s) in t.sizes.iter().enumerate() {
            sizes.push(whole_pages(format!("{prefix}.sizes[{j}]"), s)?);
        }
        if sizes.is_empty() && warm > 0 {
            sizes.push(default_file_size(warm, t.page_size));
        }
        Ok(Target {
            page_size: t.page_size,
            node: t.node,
            warm,
            sizes,
            flavors,
            adaptive: None,
        })
    }
}

/// A byte size field, or an error naming it.
pub(super) fn field_bytes(field: String, text: &str) -> Result<u64, PoolPolicyError> {
    parse_bytes(text).map_err(|e| PoolPolicyError::Field {
        field,
        message: e.to_string(),
    })
}

/// `bytes` rounded down to whole pages.
pub(super) fn round_down(bytes: u64, page: PageSize) -> u64 {
    bytes / page.bytes() * page.bytes()
}

/// The file size kept when a target names none: the whole target up to 16 GiB, so that the
/// quick start's `--warm 4G` serves `hugeprep lease vm1 4G` from one warm file (files of
/// 1 GiB made such a lease grow one file by 3 GiB of cold pages).
pub(crate) fn default_file_size(warm: u64, page: PageSize) -> u64 {
    warm.min(round_down(16 << 30, page).max(page.bytes()))
}
