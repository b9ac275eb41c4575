//! `hugeprep serve`: the daemon. Start-up order: lock the state directory, find or mount
//! hugetlbfs, reconcile the journal (pool), start the worker, bind the socket, re-arm the
//! pid watches of journaled leases, tell systemd READY. SIGTERM/SIGINT: STOPPING, cancel
//! scrubs, finish requests in flight, stop the worker, write the clean-shutdown marker,
//! remove the socket. SIGHUP (`systemctl reload`): re-read the configuration and policies and
//! replace the pool policy; a configuration that does not parse or validate is refused, logged
//! with its file, line and field, and the running one stays.

pub mod calibration;
pub mod calibration_pages;
pub mod config;
pub mod config_page;
pub mod mounts;
mod notify;
mod socket;

use std::path::PathBuf;
use std::sync::Arc;

use crate::api::{self, ApiState, CpuReport};
use crate::clear::ClearPlan;
use crate::pool::{Pool, PoolConfig, PoolError, PoolPolicy};
use crate::units::format_bytes;

/// Default API socket.
pub const DEFAULT_SOCKET: &str = crate::client::DEFAULT_SOCKET;
/// Default journal directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/hugeprep";
/// Default runtime directory.
pub const DEFAULT_RUN_DIR: &str = "/run/hugeprep";

/// The daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Another daemon holds the state directory's lock.
    #[error("another hugeprep daemon is running on this state directory (lock {lock} is held)")]
    AlreadyRunning {
        /// The lock file.
        lock: PathBuf,
    },
    /// Something answers on the socket path already.
    #[error("socket {socket} is in use by a running process")]
    SocketInUse {
        /// The socket.
        socket: PathBuf,
    },
    /// The socket group does not exist.
    #[error("socket group {group:?}: no such group")]
    UnknownGroup {
        /// The group.
        group: String,
    },
    /// No hugetlbfs mount could be found or made.
    #[error("no hugetlbfs mount found and none could be mounted under {run_dir}")]
    NoMount {
        /// Where mounts were tried.
        run_dir: PathBuf,
    },
    /// A file system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// The pool could not start.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The TLS listener could not start.
    #[error(transparent)]
    Tls(#[from] crate::api::tls::TlsError),
    /// The monitoring listener could not bind its address.
    #[error("metrics listener {addr}: {source}")]
    MetricsListen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

/// Everything the daemon needs, after config file and flags are merged.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// API socket.
    pub socket: PathBuf,
    /// Group for the socket.
    pub socket_group: Option<String>,
    /// Journal directory.
    pub state_dir: PathBuf,
    /// Runtime directory for own mounts.
    pub run_dir: PathBuf,
    /// hugetlbfs mounts; empty: find or mount one per page size.
    pub mounts: Vec<PathBuf>,
    /// Pool policy.
    pub policy: PoolPolicy,
    /// Clearing plan.
    pub plan: ClearPlan,
    /// What `/v1/cpu` reports.
    pub cpu: CpuReport,
    /// Re-reads the configuration on SIGHUP; `None`: SIGHUP only logs that nothing changes.
    pub reload: Option<Reload>,
    /// Roles of unix socket peers and tokens, and the TCP listener's address.
    pub access: crate::api::access::AccessConfig,
    /// The TCP listener's TLS configuration (built from `access` at start).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The read-only monitoring listener's address (`/metrics`, `/health`); `None`: off.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Publish warm capacity to OpenStack Placement; `None`: off.
    pub placement: Option<crate::placement::PlacementConfig>,
}

/// Builds the pool policy again from the configuration file and the command line, for a
/// reload; the error names the file, line and field.
#[derive(Clone)]
pub struct Reload(pub Arc<dyn Fn() -> Result<PoolPolicy, String> + Send + Sync>);

impl std::fmt::Debug for Reload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reload(..)")
    }
}

/// Applies a reload on every SIGHUP until the daemon stops.
fn spawn_reload_on_sighup(pool: Arc<Pool>, reload: Option<Reload>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        return;
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            notify::reloading();
            let Some(reload) = &reload else {
                tracing::warn!("reload: started without a configuration to re-read");
                notify::ready(&notify::status_line(&pool.status()));
                continue;
            };
            match (reload.0)() {
                Ok(policy) => {
                    pool.set_policy(policy);
                    // Targets set over the API stay in force: log what is, not what the file says.
                    tracing::info!(policy = %pool.policy().describe(), "reloaded: new pool policy in force");
                }
                Err(err) => tracing::error!(
                    error = %err,
                    "reload refused: the configuration in force stays"
                ),
            }
            notify::ready(&notify::status_line(&pool.status()));
        }
    });
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(config: DaemonConfig) -> Result<(), DaemonError> {
    // The API and the lease path (runtime workers, their blocking threads and this thread,
    // which runs the accept loops) run above ordinary processes; the pool worker lowers
    // itself to SCHED_IDLE.
    use crate::sys::priority;
    match priority::set_current_thread_api() {
        Ok(()) if priority::current_thread_is_realtime() => {
            tracing::info!(
                priority = priority::API_RT_PRIORITY,
                "API threads run SCHED_FIFO"
            );
        }
        Ok(()) => {
            tracing::info!(nice = priority::API_NICE, "real-time refused (RestrictRealtime=, a cgroup without real-time budget): API threads run at nice {}", priority::API_NICE);
        }
        Err(err) => {
            tracing::warn!(%err, nice = priority::API_NICE, "cannot raise the API's priority (CAP_SYS_NICE): leases slow down when every CPU is busy");
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(|| {
            // Whether the class can be had was logged just above; a thread that cannot
            // follow keeps the class it was started in.
            let _ = crate::sys::priority::set_current_thread_api();
        })
        .enable_all()
        .build()
        .map_err(|source| DaemonError::Io {
            op: "start runtime",
            path: PathBuf::new(),
            source,
        })?;
    rt.block_on(run_async(config))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => std::future::pending::<()>().await,
    }
}

async fn run_async(config: DaemonConfig) -> Result<(), DaemonError> {
    let _lock = socket::lock_state_dir(&config.state_dir)?;
    let mounts = if config.mounts.is_empty() {
        mounts::find_or_mount(&config.run_dir)?
    } else {
        config.mounts.clone()
    };
    let pool = Pool::open(PoolConfig {
        state_dir: config.state_dir.clone(),
        mounts,
        policy: config.policy.clone(),
        plan: config.plan,
    })?;
    let worker = pool.spawn_worker().map_err(|source| DaemonError::Io {
        op: "spawn worker",
        path: PathBuf::new(),
        source,
    })?;
    let api_socket = socket::listen(&config.socket, config.socket_group.as_deref())?;
    let socket_gid = std::os::unix::fs::MetadataExt::gid(
        &std::fs::metadata(&config.socket).map_err(|source| DaemonError::Io {
            op: "stat",
            path: config.socket.clone(),
            source,
        })?,
    );
    let access = Arc::new(api::access::Access::new(&config.access, Some(socket_gid)));
    let tls = match (&config.access.listen, &config.tls) {
        (Some((addr, _)), Some(tls)) => {
            let listener = api::tls::TlsListener::bind(*addr, Arc::clone(tls)).await?;
            tracing::info!(tls = %listener.local_addr(), "listening on tcp with tls");
            Some(listener)
        }
        _ => None,
    };
    let monitor = match config.metrics_listen {
        Some(addr) => {
            let listener = api::monitor::MonitorListener::bind(addr)
                .await
                .map_err(|source| DaemonError::MetricsListen { addr, source })?;
            let bound = listener.local_addr().map_or(addr, |a| a);
            tracing::info!(metrics = %bound, "serving /metrics and /health over http");
            Some(listener)
        }
        None => None,
    };
    api::pidwatch::watch_existing(&pool);
    let served: Vec<String> = pool
        .mounts()
        .values()
        .map(|m| format!("{} on {}", m.page_size, m.root.display()))
        .collect();
    tracing::info!(
        socket = %config.socket.display(),
        mounts = %served.join(", "),
        policy = %pool.policy().describe(),
        "listening"
    );
    // Recovery (Pool::open) is done: only now may systemd start what is ordered after us.
    notify::ready(&format!(
        "serving {} ({}); {} warm target",
        config.socket.display(),
        served.join(", "),
        format_bytes(pool.policy().targets.iter().map(|t| t.warm).sum())
    ));
    notify::spawn_status_and_watchdog(Arc::clone(&pool));
    // What the adaptive targets learnt before the restart, before any lease is served.
    let (p, dir) = (Arc::clone(&pool), config.state_dir.clone());
    let _ = tokio::task::spawn_blocking(move || p.adaptive_load(&dir)).await;
    crate::pool::adaptive::spawn_looks(Arc::clone(&pool), config.state_dir.clone());
    spawn_reload_on_sighup(Arc::clone(&pool), config.reload.clone());
    let placement = config
        .placement
        .clone()
        .map(|p| crate::placement::spawn(Arc::clone(&pool), p));
    let state = ApiState {
        pool: Arc::clone(&pool),
        cpu: Arc::new(config.cpu.clone()),
        placement: placement.as_ref().map(|p| Arc::clone(&p.status)),
    };
    let (monitor_stop, monitor_stopped) = tokio::sync::watch::channel(false);
    if let Some(monitor) = monitor {
        tokio::spawn(monitor.serve(state.clone(), monitor_stopped));
    }
    let pool_for_signal = Arc::clone(&pool);
    let shutdown = async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        notify::stopping();
        // Waiting leases and running scrubs stop now; requests in flight finish.
        pool_for_signal.shutdown();
    };
    let activated = api_socket.activated;
    let limits = api::limits::Limits::for_process();
    let served = api::serve(
        api_socket.listener,
        activated,
        tls,
        state,
        access,
        limits,
        shutdown,
    )
    .await;
    // Fails only when the monitor has ended already: nothing is left to stop.
    let _ = monitor_stop.send(true);
    if let Some(p) = placement {
        p.stop();
    }
    pool.shutdown();
    match tokio::task::spawn_blocking(move || worker.join()).await {
        Ok(Ok(())) => {}
        // Work it had in flight stays busy: the clean-shutdown mark below refuses.
        _ => tracing::error!("the pool worker panicked"),
    }
    // What the adaptive targets learnt, for the next start.
    pool.adaptive_save(&config.state_dir);
    if pool.policy().reserve.release_on_stop {
        match pool.give_back_on_stop() {
            Ok(report) => tracing::info!(released = ?report.released, "gave memory back on stop"),
            Err(err) => tracing::warn!(%err, "giving memory back on stop"),
        }
    }
    pool.mark_clean_shutdown()?;
    if !activated {
        if let Err(err) = std::fs::remove_file(&config.socket) {
            if err.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(socket = %config.socket.display(), %err, "cannot remove the API socket");
            }
        }
    }
    served.map_err(|source| DaemonError::Io {
        op: "serve",
        path: config.socket.clone(),
        source,
    })
}
