//! What the publisher last did, for `/metrics` and the health endpoint: its state, when it
//! last succeeded, the inventory it published and its attempts by result.

use std::sync::Mutex;
use std::time::SystemTime;

use serde::Serialize;

/// Where the publisher stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Not yet through its first update.
    Starting,
    /// The last update succeeded: Placement holds the pool's inventory.
    Ok,
    /// Placement could not be reached (connection refused, timeout, TLS, DNS).
    Unreachable,
    /// Placement or Keystone refused the credentials (401, 403).
    Auth,
    /// No resource provider is named after the compute node.
    NoComputeNode,
    /// Placement kept answering 409 (generation conflicts) beyond the retries.
    Conflict,
    /// Any other refusal (a 4xx or 5xx with Placement's message).
    Error,
}

impl State {
    /// Every state, in label order.
    pub const ALL: [State; 7] = [
        State::Starting,
        State::Ok,
        State::Unreachable,
        State::Auth,
        State::NoComputeNode,
        State::Conflict,
        State::Error,
    ];

    /// The state's name, a metric label value.
    pub const fn label(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Ok => "ok",
            State::Unreachable => "unreachable",
            State::Auth => "auth",
            State::NoComputeNode => "no_compute_node",
            State::Conflict => "conflict",
            State::Error => "error",
        }
    }
}

/// One resource class as last published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Published {
    /// The resource class (`CUSTOM_HUGEPREP_WARM_2M`).
    pub class: String,
    /// The page size it counts (`2M`).
    pub page_size: String,
    /// Inventory `total`, MiB.
    pub total: u64,
    /// Inventory `reserved`, MiB.
    pub reserved: u64,
    /// Inventory `max_unit`, MiB.
    pub max_unit: u64,
    /// Placement's usage (allocations) when it was published, MiB.
    pub used: u64,
}

/// A copy of the publisher's status.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// Where it stands.
    pub state: State,
    /// The last error, or what it did last.
    pub detail: String,
    /// Time of the last successful update.
    pub last_success: Option<SystemTime>,
    /// Inventory updates written, and attempts that failed, by result.
    pub attempts: Vec<(State, u64)>,
    /// What Placement holds since the last successful update.
    pub published: Vec<Published>,
}

/// The publisher's status, shared with the readers.
#[derive(Debug)]
pub struct Status(Mutex<Snapshot>);

impl Default for Status {
    fn default() -> Self {
        Status(Mutex::new(Snapshot {
            state: State::Starting,
            detail: String::new(),
            last_success: None,
            attempts: State::ALL.iter().map(|s| (*s, 0)).collect(),
            published: Vec::new(),
        }))
    }
}

impl Status {
    /// A copy now.
    pub fn snapshot(&self) -> Snapshot {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Counts an attempt that ended in `state` without changing the state (a conflict that a
    /// re-read resolved).
    pub fn count(&self, state: State) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = s.attempts.iter_mut().find(|(st, _)| *st == state) {
            n.1 += 1;
        }
    }

    /// Records an attempt that ended in `state`; `published` replaces the inventory shown
    /// when the attempt succeeded.
    pub fn record(&self, state: State, detail: String, published: Option<Vec<Published>>) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.state = state;
        s.detail = detail;
        if let Some(n) = s.attempts.iter_mut().find(|(st, _)| *st == state) {
            n.1 += 1;
        }
        if state == State::Ok {
            s.last_success = Some(SystemTime::now());
        }
        if let Some(p) = published {
            s.published = p;
        }
    }
}
