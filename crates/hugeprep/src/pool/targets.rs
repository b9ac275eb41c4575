//! Warm targets set over the API (`PUT /v1/pool/targets`): validated against this daemon's
//! mounts and nodes, persisted in the state directory (`<state>/targets/`, one journal
//! record, replaced atomically) and applied through the same path as a reload
//! ([`Pool::set_policy`]).
//!
//! The configuration file stays the boot-time default: targets set over the API win over the
//! file's (at start and at every reload) until `DELETE /v1/pool/targets` clears them, which
//! returns the pool to the file's targets. See `docs/api.md`, "Targets".

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::{now_unix, Pool};
use crate::journal::{Journal, JournalError};
use crate::page_size::PageSize;
use crate::policy::pool::{PoolPolicy, PoolPolicyError, Target, TargetSpec};
use crate::topology::Topology;

/// The directory of the persisted targets under the state directory.
pub const TARGETS_DIR: &str = "targets";
const RECORD: &str = "api";

/// The most targets one request may set.
pub const MAX_TARGETS: usize = 64;

/// Setting or clearing API targets failed; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum TargetsError {
    /// A target is invalid: the error names the field (e.g. `targets[0].warm`).
    #[error(transparent)]
    Invalid(#[from] PoolPolicyError),
    /// The targets could not be persisted (so they were not applied).
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// Where the targets in force come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetsSource {
    /// The configuration file and command line (the boot-time default).
    Config,
    /// `PUT /v1/pool/targets`, persisted in the state directory.
    Api,
}

/// `GET /v1/pool/targets` (and the answer to `PUT` and `DELETE`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetsReport {
    /// Where the targets in force come from.
    pub source: TargetsSource,
    /// The targets in force.
    pub targets: Vec<Target>,
    /// The configuration's targets (in force when `source` is `config`, or after `DELETE`).
    pub config_targets: Vec<Target>,
    /// When the API targets were set (seconds since the epoch), when they are in force.
    #[serde(default)]
    pub updated_unix: Option<u64>,
}

/// What the state directory keeps: the targets as the client wrote them (validated again at
/// every start, since mounts and nodes may change between starts).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    targets: Vec<TargetSpec>,
    updated_unix: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// The targets of the configuration (the last policy given to `set_policy` or `open`).
    config: Vec<Target>,
    /// API targets in force, validated, with when they were set.
    api: Option<(Vec<Target>, u64)>,
}

/// The pool's API targets: the persisted record and what is in force.
#[derive(Debug)]
pub(super) struct ApiTargets {
    journal: Journal,
    inner: Mutex<Inner>,
}

/// Validates targets for a daemon serving `page_sizes` on the nodes of `topology`: each
/// target as the policy file's are (whole pages, flavor limits), plus a mount for its page
/// size, a node that exists, at most one target per (node, page size) and at most
/// [`MAX_TARGETS`] targets. Errors name the field as `targets[i].field`.
pub fn validate_targets(
    specs: &[TargetSpec],
    page_sizes: &BTreeSet<PageSize>,
    topology: &Topology,
) -> Result<Vec<Target>, PoolPolicyError> {
    let field = |field: String, message: String| PoolPolicyError::Field { field, message };
    if specs.len() > MAX_TARGETS {
        return Err(field(
            "targets".into(),
            format!("{} targets: at most {MAX_TARGETS}", specs.len()),
        ));
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let prefix = format!("targets[{i}]");
        check_place(spec, &prefix, page_sizes, topology, &mut seen)?;
        let target = spec.validate(&prefix)?;
        check_memory(spec, &target, &prefix, topology)?;
        out.push(target);
    }
    Ok(out)
}

/// A target's page size has a mount, its node exists, and it is the only one of its
/// (node, page size) so far (`seen`).
fn check_place(
    spec: &TargetSpec,
    prefix: &str,
    page_sizes: &BTreeSet<PageSize>,
    topology: &Topology,
    seen: &mut BTreeSet<(Option<u32>, PageSize)>,
) -> Result<(), PoolPolicyError> {
    let field = |field: String, message: String| PoolPolicyError::Field { field, message };
    if !page_sizes.contains(&spec.page_size) {
        return Err(field(
            format!("{prefix}.page_size"),
            format!(
                "no hugetlbfs mount for {} pages: this daemon serves {}",
                spec.page_size,
                page_sizes
                    .iter()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    if let Some(node) = spec.node {
        if let Err(e) = topology.node(node) {
            return Err(field(format!("{prefix}.node"), e.to_string()));
        }
    }
    if !seen.insert((spec.node, spec.page_size)) {
        return Err(field(
            format!("{prefix}.node"),
            format!(
                "a second target for {} pages on {}: at most one per node and page size",
                spec.page_size,
                spec.node
                    .map_or("every node".to_string(), |n| format!("node {n}"))
            ),
        ));
    }
    Ok(())
}

/// A target beyond the node's memory can never be met: refused rather than let the worker
/// chase it (nodes that report no memory size are not checked).
fn check_memory(
    spec: &TargetSpec,
    target: &Target,
    prefix: &str,
    topology: &Topology,
) -> Result<(), PoolPolicyError> {
    let field = |field: String, message: String| PoolPolicyError::Field { field, message };
    let nodes = topology
        .nodes
        .iter()
        .filter(|n| spec.node.map_or(true, |id| id == n.id) && n.mem_bytes > 0);
    let Some(n) = nodes.min_by_key(|n| n.mem_bytes) else {
        return Ok(());
    };
    let (name, bytes) = match &target.adaptive {
        Some(goal) => ("ceiling", goal.ceiling),
        None => ("warm", target.warm),
    };
    if bytes > n.mem_bytes {
        return Err(field(
            format!("{prefix}.{name}"),
            format!(
                "{} is more than node {}'s memory of {}",
                crate::units::format_bytes(bytes),
                n.id,
                crate::units::format_bytes(n.mem_bytes)
            ),
        ));
    }
    Ok(())
}

/// The persisted record, validated, with when it was set. A record that no longer validates
/// (a mount or node gone) is logged and ignored: the configuration's targets apply, the record
/// stays until the next `PUT` or `DELETE`.
fn load(
    journal: &Journal,
    page_sizes: &BTreeSet<PageSize>,
    topology: &Topology,
) -> Result<Option<(Vec<Target>, u64)>, JournalError> {
    for (key, stored) in journal.load::<Stored>()? {
        if key != RECORD {
            continue;
        }
        match validate_targets(&stored.targets, page_sizes, topology) {
            Ok(targets) => return Ok(Some((targets, stored.updated_unix))),
            Err(err) => tracing::error!(
                %err,
                "stored API targets no longer valid: the configuration's targets apply"
            ),
        }
    }
    Ok(None)
}

/// The targets set over the API and persisted in `state_dir`, when there are valid ones: what
/// the daemon will keep warm in place of the configuration's (`hugeprep reserve` raises the
/// kernel's pools for them at boot). Reads only; creates nothing.
pub fn stored_targets(
    state_dir: &Path,
    page_sizes: &BTreeSet<PageSize>,
    topology: &Topology,
) -> Result<Option<Vec<Target>>, JournalError> {
    let dir = state_dir.join(TARGETS_DIR);
    if !dir.exists() {
        return Ok(None);
    }
    let journal = Journal::open(&dir)?;
    Ok(load(&journal, page_sizes, topology)?.map(|(t, _)| t))
}

impl ApiTargets {
    /// Opens the record in `<state_dir>/targets/` (see [`stored_targets`]).
    pub(super) fn open(
        state_dir: &Path,
        page_sizes: &BTreeSet<PageSize>,
        topology: &Topology,
    ) -> Result<ApiTargets, JournalError> {
        let journal = Journal::open(&state_dir.join(TARGETS_DIR))?;
        let api = load(&journal, page_sizes, topology)?;
        if let Some((targets, _)) = &api {
            tracing::info!(
                targets = targets.len(),
                "warm targets set over the API are in force (DELETE /v1/pool/targets returns to the configuration's)"
            );
        }
        Ok(ApiTargets {
            journal,
            inner: Mutex::new(Inner {
                config: Vec::new(),
                api,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configuration's targets (in force unless the API's replace them).
    pub(in crate::pool) fn config_targets(&self) -> Vec<Target> {
        self.lock().config.clone()
    }

    /// Records `policy`'s targets as the configuration's and puts the API targets in their
    /// place when there are any.
    pub(super) fn apply(&self, policy: &mut PoolPolicy) {
        let mut inner = self.lock();
        inner.config = policy.targets.clone();
        if let Some((targets, _)) = &inner.api {
            policy.targets = targets.clone();
        }
    }

    fn report(inner: &Inner) -> TargetsReport {
        match &inner.api {
            Some((targets, at)) => TargetsReport {
                source: TargetsSource::Api,
                targets: targets.clone(),
                config_targets: inner.config.clone(),
                updated_unix: Some(*at),
            },
            None => TargetsReport {
                source: TargetsSource::Config,
                targets: inner.config.clone(),
                config_targets: inner.config.clone(),
                updated_unix: None,
            },
        }
    }
}

impl Pool {
    fn page_sizes(&self) -> BTreeSet<PageSize> {
        self.settings.mounts.keys().copied().collect()
    }

    /// The targets in force and where they come from.
    pub fn targets(&self) -> TargetsReport {
        ApiTargets::report(&self.settings.api_targets.lock())
    }

    /// Validates `specs`, persists them (atomically, durably) and applies them as a reload
    /// does: the worker fills or trims from its next round. On error nothing changed.
    pub fn set_targets(&self, specs: &[TargetSpec]) -> Result<TargetsReport, TargetsError> {
        let targets = validate_targets(specs, &self.page_sizes(), &self.settings.topology)?;
        let at = now_unix();
        {
            let mut inner = self.settings.api_targets.lock();
            let stored = Stored {
                targets: specs.to_vec(),
                updated_unix: at,
            };
            self.settings.api_targets.journal.write(RECORD, &stored)?;
            inner.api = Some((targets, at));
        }
        self.reapply_targets();
        Ok(self.targets())
    }

    /// Removes the API targets: the configuration's apply again, now and after a restart.
    pub fn clear_targets(&self) -> Result<TargetsReport, TargetsError> {
        {
            let mut inner = self.settings.api_targets.lock();
            self.settings.api_targets.journal.remove(RECORD)?;
            inner.api = None;
        }
        self.reapply_targets();
        Ok(self.targets())
    }

    /// Re-applies the policy in force with the configuration's targets and the API's in
    /// their place, in one hold of the policy's lock (a reload racing it is kept).
    fn reapply_targets(&self) {
        self.settings.reapply_targets();
        self.table.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pool::Percent;
    use crate::topology::Node;

    fn spec(warm: &str, ceiling: Option<&str>) -> TargetSpec {
        TargetSpec {
            page_size: PageSize::Size2M,
            node: None,
            warm: warm.into(),
            sizes: Vec::new(),
            flavors: Vec::new(),
            goal: ceiling.map(|_| Percent(99.0)),
            ceiling: ceiling.map(str::to_string),
        }
    }

    #[test]
    fn warm_and_ceiling_are_refused_above_the_smallest_nodes_memory() {
        let node = |id, gib: u64| Node {
            id,
            cpus: vec![0],
            mem_bytes: gib << 30,
        };
        let topology = Topology {
            nodes: vec![node(0, 8), node(1, 4)],
        };
        let sizes = BTreeSet::from([PageSize::Size2M]);
        let check = |s: TargetSpec| validate_targets(&[s], &sizes, &topology);
        assert!(check(spec("4G", None)).is_ok());
        assert!(check(spec("", Some("4G"))).is_ok());
        for (s, name) in [
            (spec("6G", None), "warm"),
            (spec("", Some("6G")), "ceiling"),
        ] {
            match check(s) {
                Err(PoolPolicyError::Field { field, message }) => {
                    assert_eq!(field, format!("targets[0].{name}"));
                    assert!(message.contains("node 1's memory of 4 GiB"), "{message}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }
}
