//! Releasing a lease when the process that holds it exits: a pidfd becomes readable at exit,
//! and tokio waits on it like on a socket.

use std::sync::Arc;

use crate::pool::{Pool, PoolError};
use crate::sys::pidfd::{pidfd_open, process_start_time, wait_exit};

/// Watches `pid` and releases lease `lease_id` when it exits. `start` is the process's start
/// time recorded with the lease: a different one means the pid now names another process,
/// so the leasing process is already gone.
pub fn watch(pool: Arc<Pool>, lease_id: u64, pid: u32, start: Option<u64>) {
    tokio::spawn(async move {
        match pidfd_open(pid) {
            Ok(fd) if start.is_none() || process_start_time(pid) == start => {
                match wait_exit(fd).await {
                    Ok(()) => {}
                    Err(err) => {
                        tracing::warn!(pid, %err, "cannot watch process: lease stays until released");
                        return;
                    }
                }
            }
            _ => {}
        }
        tracing::info!(lease = lease_id, pid, "leasing process exited: releasing");
        let released = tokio::task::spawn_blocking(move || pool.release(lease_id)).await;
        match released {
            Ok(Ok(_)) | Ok(Err(PoolError::NotFound { .. })) => {}
            Ok(Err(err)) => tracing::error!(lease = lease_id, %err, "automatic release failed"),
            Err(err) => tracing::error!(lease = lease_id, %err, "automatic release task died"),
        }
    });
}

/// Arms a watch for every journaled lease that names a process (after a restart).
pub fn watch_existing(pool: &Arc<Pool>) {
    for (lease, pid, start) in pool.leases_with_pid() {
        watch(Arc::clone(pool), lease, pid, start);
    }
}
