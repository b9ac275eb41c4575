//! An in-process daemon for benchmarks: the warm pool, its worker and the API on a unix
//! socket in a temporary directory, with a client, so a benchmark measures leases the way a
//! VMM host gets them without touching the daemon's default paths.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::{self, ApiState, CpuReport};
use crate::clear::ClearPlan;
use crate::client::Client;
use crate::pool::{Pool, PoolConfig, PoolError, PoolPolicy};

/// Starting or running the benchmark's daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchDaemonError {
    /// The pool could not be opened.
    #[error("{0}")]
    Pool(#[from] PoolError),
    /// Starting a thread, the runtime or the socket failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being started.
        op: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The warm pool did not reach its target in time (a liveness bound).
    #[error("the warm pool did not refill within {seconds} s")]
    Settle {
        /// The bound.
        seconds: u64,
    },
}

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> BenchDaemonError {
    move |source| BenchDaemonError::Io { op, source }
}

/// A running pool, worker and API server; stopped (and its directory removed) on drop.
#[derive(Debug)]
pub struct BenchDaemon {
    /// The pool, for direct inspection.
    pub pool: Arc<Pool>,
    /// A client of the daemon's socket.
    pub client: Client,
    rt: tokio::runtime::Runtime,
    worker: Option<std::thread::JoinHandle<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    base: PathBuf,
}

impl BenchDaemon {
    /// Starts a daemon with its journal and socket under `base` (emptied first), serving
    /// the hugetlbfs `mount` with `policy`.
    pub fn start(
        base: PathBuf,
        mount: &Path,
        policy: PoolPolicy,
        plan: ClearPlan,
    ) -> Result<BenchDaemon, BenchDaemonError> {
        let _ = std::fs::remove_dir_all(&base);
        let pool = Pool::open(PoolConfig {
            state_dir: base.join("state"),
            mounts: vec![mount.to_path_buf()],
            policy,
            plan,
        })?;
        let worker = pool.spawn_worker().map_err(io("spawn the pool worker"))?;
        let socket = base.join("bench.sock");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(io("start the runtime"))?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let listener = rt
            .block_on(async { tokio::net::UnixListener::bind(&socket) })
            .map_err(io("bind the benchmark's API socket"))?;
        let state = ApiState {
            pool: Arc::clone(&pool),
            cpu: Arc::new(CpuReport {
                method: plan.method,
                plan,
                rule: "bench".into(),
                source: "the benchmark's own plan".into(),
                decided_by: crate::policy::DecidedBy::Rule,
                calibration: None,
            }),
        };
        let server = rt.spawn(api::serve(listener, state, async {
            let _ = stop_rx.await;
        }));
        Ok(BenchDaemon {
            pool,
            client: Client::new(&socket),
            rt,
            worker: Some(worker),
            stop: Some(stop_tx),
            server: Some(server),
            base,
        })
    }

    /// Runs `f` on the daemon's runtime (client calls are async).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Waits until nothing is in flight and every target is met.
    pub fn settle(&self) -> Result<(), BenchDaemonError> {
        let bound = Duration::from_secs(120);
        let deadline = Instant::now() + bound;
        while !(self.pool.is_idle()
            && self
                .pool
                .status()
                .kinds
                .iter()
                .all(|k| k.warm_bytes >= k.target_bytes))
        {
            if Instant::now() > deadline {
                return Err(BenchDaemonError::Settle {
                    seconds: bound.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = self.rt.block_on(server);
        }
        self.pool.shutdown();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}
