//! What the journal records about each pool file, and the lease view the API returns.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::page_size::PageSize;

/// Where a lease's memory came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaseSource {
    /// A warm file of exactly the size asked for.
    WarmExact,
    /// A larger warm file, shrunk (`ftruncate` frees the tail).
    WarmShrunk,
    /// A smaller warm file, grown (only the new tail is faulted).
    WarmGrown,
    /// A new file, faulted in full.
    Cold,
}

impl LeaseSource {
    /// The name used in JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            LeaseSource::WarmExact => "warm-exact",
            LeaseSource::WarmShrunk => "warm-shrunk",
            LeaseSource::WarmGrown => "warm-grown",
            LeaseSource::Cold => "cold",
        }
    }
}

/// A lease as the journal keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// Lease id (unique across restarts).
    pub id: u64,
    /// The name the client gave (unique among live leases).
    pub name: String,
    /// The per-lease path handed out (a hard link to the pool file).
    pub path: PathBuf,
    /// Owner uid the file was handed to.
    pub uid: Option<u32>,
    /// Owner gid.
    pub gid: Option<u32>,
    /// Process whose exit releases the lease.
    pub pid: Option<u32>,
    /// That process's start time (clock ticks since boot), so a reused pid is not mistaken
    /// for it after a restart.
    pub pid_start: Option<u64>,
    /// Where the memory came from.
    pub source: LeaseSource,
    /// Milliseconds from request to memory ready.
    pub ready_ms: f64,
    /// When the lease was made (seconds since the epoch).
    pub created_unix: u64,
    /// The idempotency key it was made with, and the request (see `pool::idempotency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<Box<crate::pool::Idempotency>>,
    /// How its memory comes back when released.
    #[serde(default)]
    pub recycle: crate::policy::pool::Recycle,
    /// The principal that made the lease (`uid:N`, `token:NAME`, ...): only it or an admin
    /// may see its path or release it. `None`: made before principals were recorded, or by
    /// the daemon itself; only an admin may touch it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

/// The life cycle of a pool file. Every transition is journaled before it takes effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", content = "lease", rename_all = "kebab-case")]
pub enum FileState {
    /// Being created and faulted (refill or cold lease); deleted if found after a crash.
    Filling,
    /// Scrubbed (or fresh from the kernel) and verified: may be handed out.
    Warm,
    /// Handed out.
    Leased(LeaseRecord),
    /// Released or otherwise unproven: must be scrubbed or deleted.
    Dirty,
    /// Being scrubbed.
    Scrubbing,
}

impl FileState {
    /// Short name for tables and logs.
    pub fn name(&self) -> &'static str {
        match self {
            FileState::Filling => "filling",
            FileState::Warm => "warm",
            FileState::Leased(_) => "leased",
            FileState::Dirty => "dirty",
            FileState::Scrubbing => "scrubbing",
        }
    }
}

/// One pool file as journaled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRecord {
    /// File id; the file is `p<id>` in the pool directory of its page size's mount.
    pub id: u64,
    /// Page size.
    pub page_size: PageSize,
    /// NUMA node of its pages.
    pub node: u32,
    /// Length in bytes.
    pub size: u64,
    /// State.
    #[serde(flatten)]
    pub state: FileState,
}

impl FileRecord {
    /// The journal key and file name: `p<id>`.
    pub fn key(&self) -> String {
        file_key(self.id)
    }
}

/// The journal key and pool file name of file `id`.
pub fn file_key(id: u64) -> String {
    format!("p{id}")
}

/// A lease as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseInfo {
    /// Lease id, for `DELETE /v1/leases/{id}`.
    pub id: u64,
    /// The client's name for it.
    pub name: String,
    /// The file to hand to the VMM (`mem-path`, `file=`).
    pub path: PathBuf,
    /// Bytes.
    pub size: u64,
    /// NUMA node.
    pub node: u32,
    /// Page size.
    pub page_size: PageSize,
    /// Where the memory came from.
    pub source: LeaseSource,
    /// Milliseconds from request to memory ready.
    pub ready_ms: f64,
    /// Owner uid, when handed to one.
    #[serde(default)]
    pub uid: Option<u32>,
    /// Process whose exit releases it.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Whether hugeprep holds a long-term pin on every page (`pin: true`).
    #[serde(default)]
    pub pinned: bool,
    /// The principal that made it (see [`LeaseRecord::principal`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

/// The name a client gave: a tenant's lease is journaled as `.<scope>/<name>` (see
/// `pool::lease::scope_dir`), an admin's as the name itself.
pub fn display_name(journaled: &str) -> &str {
    journaled.rsplit('/').next().unwrap_or(journaled)
}

impl LeaseInfo {
    /// The API view of a leased file.
    pub fn of(rec: &FileRecord, lease: &LeaseRecord) -> LeaseInfo {
        LeaseInfo {
            id: lease.id,
            name: display_name(&lease.name).to_string(),
            path: lease.path.clone(),
            size: rec.size,
            node: rec.node,
            page_size: rec.page_size,
            source: lease.source,
            ready_ms: lease.ready_ms,
            uid: lease.uid,
            pid: lease.pid,
            pinned: false,
            principal: lease.principal.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_json() {
        let rec = FileRecord {
            id: 7,
            page_size: PageSize::Size2M,
            node: 0,
            size: 4 << 20,
            state: FileState::Leased(LeaseRecord {
                id: 9,
                name: "vm1".into(),
                path: "/mnt/leases/vm1".into(),
                uid: Some(64055),
                gid: Some(64055),
                pid: Some(42),
                pid_start: Some(1000),
                source: LeaseSource::WarmShrunk,
                ready_ms: 0.5,
                created_unix: 1,
                idempotency: None,
                recycle: crate::policy::pool::Recycle::Kernel,
                principal: Some("uid:64055".into()),
            }),
        };
        let json = serde_json::to_string(&rec).unwrap();
        assert!(json.contains("\"state\":\"leased\""), "{json}");
        assert!(json.contains("\"source\":\"warm-shrunk\""), "{json}");
        assert_eq!(serde_json::from_str::<FileRecord>(&json).unwrap(), rec);
        let warm = serde_json::to_string(&FileRecord {
            state: FileState::Warm,
            ..rec
        })
        .unwrap();
        assert!(warm.contains("\"state\":\"warm\""), "{warm}");
    }
}
