//! An in-process daemon for benchmarks: the warm pool, its worker and the API on a unix
//! socket, so a benchmark talks to hugeprep the way a VMM integration does (over the API)
//! without depending on a daemon installed on the host.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hugeprep::api::{self, ApiState, CpuReport};
use hugeprep::clear::ClearPlan;
use hugeprep::client::Client;
use hugeprep::pool::{Pool, PoolConfig, PoolError, PoolPolicy};

/// Starting or waiting for the benchmark's daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchDaemonError {
    /// The pool could not open.
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
    #[error("the warm pool did not settle within {seconds} s")]
    Settle {
        /// The bound.
        seconds: u64,
    },
}

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> BenchDaemonError {
    move |source| BenchDaemonError::Io { op, source }
}

/// A pool with its worker and API server; stopped on drop.
#[derive(Debug)]
pub struct BenchDaemon {
    pool: Arc<Pool>,
    worker: Option<std::thread::JoinHandle<()>>,
    runtime: tokio::runtime::Runtime,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    socket: PathBuf,
    client: Client,
}

impl BenchDaemon {
    /// Opens a pool on the hugetlbfs `mount` with `policy`, its journal in `dir/state`,
    /// starts its worker and serves the API on `dir/bench.sock`.
    ///
    /// A benchmark borrows its pages itself and gives back exactly those, so its pool never
    /// raises the kernel's pools on top (`reserve` is turned off whatever `policy` says).
    pub fn start(
        dir: &Path,
        mount: &Path,
        mut policy: PoolPolicy,
        plan: ClearPlan,
    ) -> Result<BenchDaemon, BenchDaemonError> {
        policy.reserve.enabled = false;
        let socket = &dir.join("bench.sock");
        let pool = Pool::open(PoolConfig {
            state_dir: dir.join("state"),
            mounts: vec![mount.to_path_buf()],
            policy,
            plan,
        })?;
        let worker = pool.spawn_worker().map_err(io("spawn the pool worker"))?;
        // As in the daemon: the API threads run above ordinary processes.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .on_thread_start(|| {
                let _ = hugeprep::sys::priority::set_current_thread_api();
            })
            .enable_all()
            .build()
            .map_err(io("start the runtime"))?;
        let _ = std::fs::remove_file(socket);
        let listener = runtime
            .block_on(async { tokio::net::UnixListener::bind(socket) })
            .map_err(io("bind the benchmark's API socket"))?;
        let state = ApiState {
            pool: Arc::clone(&pool),
            cpu: Arc::new(CpuReport {
                method: plan.method,
                plan,
                rule: "bench".into(),
                source: "the benchmark's own plan".into(),
                decided_by: hugeprep::policy::DecidedBy::Rule,
                confidence: hugeprep::policy::Confidence::default(),
                reason: "the benchmark's own plan".into(),
                calibration: None,
            }),
            placement: None,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // The benchmark's own user (and root) are admin on its socket.
        let access = Arc::new(api::access::Access::new(
            &api::access::AccessConfig::default(),
            None,
        ));
        let limits = api::limits::Limits::for_process();
        let server = runtime.spawn(api::serve(
            listener,
            false,
            None,
            state,
            access,
            limits,
            async {
                let _ = stopped.await;
            },
        ));
        Ok(BenchDaemon {
            pool,
            worker: Some(worker),
            runtime,
            server: Some(server),
            stop: Some(stop),
            socket: socket.to_path_buf(),
            client: Client::new(socket),
        })
    }

    /// The API socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A client of the API socket.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Runs `f` on the daemon's runtime (client calls are async).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The runtime the server runs on (for async clients).
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.runtime
    }

    /// Waits until nothing is in flight and every kind is at or above its warm target.
    pub fn settle(&self, timeout: Duration) -> Result<(), BenchDaemonError> {
        self.settle_until(timeout, |warm, target| warm >= target)
    }

    /// Sets the pool's policy and waits until it holds exactly its targets: filled up, or,
    /// for a lowered target, trimmed down so that other files can have the pages.
    pub fn set_policy_settled(
        &self,
        policy: PoolPolicy,
        timeout: Duration,
    ) -> Result<(), BenchDaemonError> {
        self.pool.set_policy(policy);
        self.settle_until(timeout, |warm, target| warm == target)
    }

    fn settle_until(
        &self,
        timeout: Duration,
        met: impl Fn(u64, u64) -> bool,
    ) -> Result<(), BenchDaemonError> {
        let deadline = Instant::now() + timeout;
        while !(self.pool.is_idle()
            && self
                .pool
                .status()
                .kinds
                .iter()
                .all(|k| met(k.warm_bytes, k.target_bytes)))
        {
            if Instant::now() > deadline {
                return Err(BenchDaemonError::Settle {
                    seconds: timeout.as_secs(),
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
            let _ = self.runtime.block_on(server);
        }
        self.pool.shutdown();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
