//! The daemon on a multi-node guest: warm targets on two nodes, leases from the right node,
//! the node of a lease that names none, a release on node 1 scrubbed by node 1's CPUs, and
//! a 422 naming the node that cannot supply a lease, with no change on the other nodes.
//!
//! The pools are sized so that the refill worker cannot top a node up behind a check's back:
//! node 0 holds 3 pages (2 warm, 1 free), node 1 holds 5 (4 warm, 1 free).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hugeprep::client::{Client, ClientError};
use hugeprep::pool::{KindStatus, LeaseInfo, LeaseRequest, PoolStatus};

use crate::cli_checks::free_pages;
use crate::kernel::{self, PAGE};
use crate::{Guest, Report};

/// The daemon's directory: socket, journal, config, log.
pub const DIR: &str = "/run/hugeprep-numa";
const MIB: u64 = 1 << 20;

/// Runs the daemon checks.
pub fn run(guest: &Guest, report: &mut Report) {
    let nodes = guest.nodes();
    let mut daemon = match start(&nodes) {
        Ok(d) => d,
        Err(e) => return report.check("daemon_starts_with_targets_on_two_nodes", Err(e)),
    };
    let d = &daemon;
    report.check("daemon_warm_targets_on_both_nodes", warm_targets(d, &nodes));
    report.check(
        "lease_without_node_goes_to_node_with_most_warm",
        lease_on(d, "auto", 4 * MIB, None, None, 1),
    );
    report.check(
        "lease_node0_from_node0",
        lease_on(d, "vm0", 4 * MIB, Some(0), None, 0),
    );
    report.check("lease_with_pid_goes_to_node_of_its_cpus", lease_with_pid(d));
    report.check(
        "lease_node1_from_node1",
        lease_on(d, "vm1", 4 * MIB, Some(1), None, 1),
    );
    report.check(
        "release_node1_scrubbed_on_node1_cpus",
        release_scrubbed_on_node1(d),
    );
    report.check(
        "pages_moved_by_the_lessee_take_the_kernels_path",
        moved_pages_take_the_kernels_path(d),
    );
    report.check(
        "lease_too_large_for_node1_is_422_naming_node",
        too_large(d, &nodes),
    );
    if let Some(node) = guest.cpuless_node() {
        report.check(
            "lease_on_cpuless_node_places_memory_there",
            lease_on(d, "cxl", 2 * MIB, Some(node), None, node),
        );
    }
    crate::libvirt_checks::run(guest, report, &daemon);
    daemon.stop();
}

/// The daemon child and its client.
pub struct Daemon {
    child: Child,
    client: Client,
}

impl Daemon {
    /// `GET /v1/leases`.
    pub fn leases(&self) -> Result<Vec<LeaseInfo>, String> {
        self.client
            .blocking(self.client.leases())
            .map_err(|e| format!("GET /v1/leases: {e}"))
    }

    fn pool(&self) -> Result<PoolStatus, String> {
        self.client
            .blocking(self.client.pool())
            .map_err(|e| format!("GET /v1/pool: {e}"))
    }

    fn lease(&self, req: &LeaseRequest) -> Result<LeaseInfo, ClientError> {
        self.client.blocking(self.client.lease(req))
    }

    fn release(&self, name: &str) -> Result<(), String> {
        let leases = self.leases()?;
        let lease = leases
            .iter()
            .find(|l| l.name == name)
            .ok_or_else(|| format!("no lease {name}"))?;
        self.client
            .blocking(self.client.release(lease.id))
            .map(drop)
            .map_err(|e| format!("release {name}: {e}"))
    }

    fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }

    /// Polls the pool until `done` holds for it.
    fn wait_pool(
        &self,
        what: &str,
        done: impl Fn(&PoolStatus) -> bool,
    ) -> Result<PoolStatus, String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let pool = self.pool();
            if let Ok(p) = &pool {
                if done(p) {
                    return pool;
                }
            }
            if Instant::now() > deadline {
                return Err(format!("{what}: not reached in 60 s; last pool {pool:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn kind(pool: &PoolStatus, node: u32) -> Option<&KindStatus> {
    pool.kinds.iter().find(|k| k.node == node)
}

fn settled(k: &KindStatus) -> bool {
    k.dirty_bytes == 0 && k.scrubbing_bytes == 0 && k.filling_bytes == 0
}

/// Sizes the pools, writes the config (warm 4M on node 0, 8M on node 1, 4M files), starts
/// `hugeprep serve` and waits until both targets are warm.
fn start(nodes: &[u32]) -> Result<Daemon, String> {
    for &n in nodes {
        kernel::set_node_pages(n, [3, 5].get(n as usize).copied().unwrap_or(1))?;
    }
    std::fs::create_dir_all(DIR).map_err(|e| e.to_string())?;
    let config = format!(
        "socket = \"{DIR}/sock\"\nstate_dir = \"{DIR}/state\"\nrun_dir = \"{DIR}/run\"\n\
         mounts = [\"/mnt/huge\"]\n[pool]\nscrub_bandwidth = \"0\"\n\
         [[pool.target]]\npage_size = \"2M\"\nnode = 0\nwarm = \"4M\"\nsizes = [\"4M\"]\n\
         [[pool.target]]\npage_size = \"2M\"\nnode = 1\nwarm = \"8M\"\nsizes = [\"4M\"]\n"
    );
    let config_path = format!("{DIR}/config.toml");
    std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
    let log = std::fs::File::create(format!("{DIR}/daemon.log")).map_err(|e| e.to_string())?;
    let child = Command::new("hugeprep")
        .args(["serve", "--config", &config_path, "--calibration", "off"])
        .env("RUST_LOG", "hugeprep=debug")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("hugeprep serve: {e}"))?;
    let daemon = Daemon {
        child,
        client: Client::new(format!("{DIR}/sock")).with_timeout(Duration::from_secs(30)),
    };
    daemon
        .wait_pool("warm targets", |p| {
            [(0, 4 * MIB), (1, 8 * MIB)]
                .iter()
                .all(|&(n, b)| kind(p, n).is_some_and(|k| k.warm_bytes == b && settled(k)))
        })
        .map_err(|e| format!("{e}\ndaemon log:\n{}", daemon_log()))?;
    Ok(daemon)
}

/// The daemon's log without its colour escapes (`ESC [ ... m`).
fn daemon_log() -> String {
    let raw = std::fs::read_to_string(format!("{DIR}/daemon.log")).unwrap_or_default();
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for e in chars.by_ref() {
                if e == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The warm bytes per node are the pages the kernel counts in use on that node.
fn warm_targets(d: &Daemon, nodes: &[u32]) -> Result<String, String> {
    let pool = d.pool()?;
    let mut seen = BTreeMap::new();
    for &n in nodes {
        let used =
            kernel::node_counter(n, "nr_hugepages")? - kernel::node_counter(n, "free_hugepages")?;
        let k = kind(&pool, n);
        let warm = k.map_or(0, |k| k.warm_bytes);
        if used * PAGE != warm {
            return Err(format!(
                "node {n}: {warm} bytes warm, the kernel has {used} pages in use"
            ));
        }
        if let Some(k) = k {
            let free = kernel::node_counter(n, "free_hugepages")?;
            if k.kernel_free_pages != free {
                return Err(format!(
                    "node {n}: status says {} free pages, sysfs {free}",
                    k.kernel_free_pages
                ));
            }
        }
        seen.insert(n, warm / MIB);
    }
    Ok(format!(
        "warm MiB per node {seen:?}, equal to the pages in use per node"
    ))
}

/// Takes a lease and checks with numa_maps that every page is on `want`.
fn lease_on(
    d: &Daemon,
    name: &str,
    size: u64,
    node: Option<u32>,
    pid: Option<u32>,
    want: u32,
) -> Result<String, String> {
    let req = LeaseRequest {
        name: name.into(),
        size,
        page_size: None,
        node,
        owner: None,
        pid,
        ..Default::default()
    };
    let lease = d.lease(&req).map_err(|e| format!("lease {name}: {e}"))?;
    let placed = kernel::file_nodes(&lease.path)?;
    let pages = size / PAGE;
    if lease.node != want || placed != BTreeMap::from([(want, pages)]) {
        return Err(format!(
            "lease {name} says node {}, numa_maps pages per node {placed:?}; expected {pages} on node {want}",
            lease.node
        ));
    }
    Ok(format!(
        "{} ({:?}), numa_maps {placed:?}",
        Path::new(&lease.path).display(),
        lease.source
    ))
}

/// A request with the pid of a process bound to node 0's CPUs (by numactl) goes to node 0,
/// although node 1 has more warm memory.
fn lease_with_pid(d: &Daemon) -> Result<String, String> {
    let mut child = Command::new("numactl")
        .args(["--cpunodebind=0", "sleep", "600"])
        .spawn()
        .map_err(|e| format!("numactl: {e}"))?;
    let pid = child.id();
    let result = (|| {
        let deadline = Instant::now() + Duration::from_secs(10);
        // numactl sets the affinity, then execs sleep.
        while kernel::process_cpus(pid)? != kernel::node_cpus(0)? {
            if Instant::now() > deadline {
                return Err(format!("pid {pid} never bound to node 0's CPUs"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let pool = d.pool()?;
        let warm = |n| kind(&pool, n).map_or(0, |k| k.warm_bytes);
        if warm(1) <= warm(0) {
            return Err(format!(
                "set-up: node 1 warm {} is not above node 0 warm {}",
                warm(1),
                warm(0)
            ));
        }
        let seen = lease_on(d, "pinned", 2 * MIB, None, Some(pid), 0)?;
        d.release("pinned")?;
        // Its scrub (node 0) ends before the node 1 checks look at the last scrub.
        d.wait_pool("pinned scrubbed", |p| kind(p, 0).is_some_and(settled))?;
        Ok(format!(
            "pid {pid} on CPUs {:?}: {seen}",
            kernel::process_cpus(pid)?
        ))
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// Releasing vm1 (node 1, pool below target) makes the worker scrub it: the scrub report's
/// worker affinity (sched_getaffinity inside each worker) and the daemon's debug log name
/// only node 1's CPUs, and the pages stay on node 1.
fn release_scrubbed_on_node1(d: &Daemon) -> Result<String, String> {
    let node1_cpus = kernel::node_cpus(1)?;
    // vm1 was mapped by this runner to read its placement: this runner, still running, opened
    // it, so its release takes the kernel's path (docs/security.md). A lease nobody opened
    // is proven out of reach and scrubbed on its node's CPUs.
    d.release("vm1")?;
    d.wait_pool("vm1 given back and the pool refilled", |p| {
        kind(p, 1).is_some_and(|k| k.warm_bytes >= 4 * MIB && k.leases == 1 && settled(k))
    })?;
    let req = LeaseRequest {
        name: "scrub1".into(),
        size: 4 * MIB,
        node: Some(1),
        ..Default::default()
    };
    d.lease(&req).map_err(|e| format!("lease scrub1: {e}"))?;
    let free_before = kernel::node_counter(1, "free_hugepages")?;
    let log_before = daemon_log().len();
    d.release("scrub1")?;
    let pool = d.wait_pool("scrub1 scrubbed back to warm", |p| {
        kind(p, 1).is_some_and(|k| k.warm_bytes >= 4 * MIB && k.leases == 1 && settled(k))
            && p.last_scrub.as_ref().is_some_and(|s| s.bytes == 4 * MIB)
    })?;
    let scrub = pool.last_scrub.as_ref().ok_or("no scrub report")?;
    if !scrub
        .affinity
        .iter()
        .all(|a| kernel::all_within(a, &node1_cpus))
        || scrub.affinity.is_empty()
    {
        return Err(format!(
            "scrub workers' affinity {:?}, node 1 CPUs {node1_cpus:?}",
            scrub.affinity
        ));
    }
    let log = daemon_log();
    let lines: Vec<&str> = log[log_before..]
        .lines()
        .filter(|l| l.contains("scrub worker pinned"))
        .collect();
    let want = format!("affinity=[{}]", join(&node1_cpus));
    if lines.is_empty() || !lines.iter().all(|l| l.contains(&want)) {
        return Err(format!("daemon log scrub lines {lines:?}, expected {want}"));
    }
    let free_after = kernel::node_counter(1, "free_hugepages")?;
    if free_after != free_before {
        return Err(format!(
            "node 1 free pages {free_before} -> {free_after}: the scrubbed file moved"
        ));
    }
    Ok(format!(
        "scrub workers' affinity {:?} (node 1 CPUs {node1_cpus:?}), log: {}",
        scrub.affinity,
        lines.first().map_or("", |l| l.trim())
    ))
}

/// A lessee moves pages of its node-1 lease to node 0 (`mbind(MPOL_MF_MOVE)`, which any
/// process may do with its own mapping) and lets go: the release is proven out of reach by
/// the kernel's counts, but its pages are off its node, so it takes the kernel's path
/// (`reason="node"`), whose truncate gives each page back to its own node; the next node-1
/// lease has every page on node 1.
fn moved_pages_take_the_kernels_path(d: &Daemon) -> Result<String, String> {
    let req = LeaseRequest {
        name: "moved".into(),
        size: 4 * MIB,
        node: Some(1),
        ..Default::default()
    };
    let lease = d.lease(&req).map_err(|e| format!("lease moved: {e}"))?;
    // In a process of its own, in a cgroup of its own that is removed once it exited: the
    // walk (the fallback the guest's daemon may use) proves such an opener gone.
    let cgroup = "/sys/fs/cgroup/hugeprep-lessee-moved";
    std::fs::create_dir_all(cgroup).map_err(|e| format!("mkdir {cgroup}: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new("sh")
        .args(["-c", r#"echo $$ > "$0/cgroup.procs" && exec "$@""#, cgroup])
        .arg(&exe)
        .args(["move-pages", &lease.path.display().to_string(), "0"])
        .output()
        .map_err(|e| format!("move-pages: {e}"))?;
    let _ = std::fs::remove_dir(cgroup);
    if !out.status.success() {
        return Err(format!(
            "move-pages: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let moved: usize = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("move-pages said {:?}: {e}", out.stdout))?;
    if moved == 0 {
        return Err("no page moved to node 0 (no free page there?)".into());
    }
    let log_before = daemon_log().len();
    d.release("moved")?;
    d.wait_pool("moved given back and the pool refilled", |p| {
        kind(p, 1).is_some_and(|k| k.warm_bytes >= 4 * MIB && settled(k))
    })?;
    let log = daemon_log();
    let line = log[log_before..]
        .lines()
        .find(|l| l.contains("takes the kernel's path"))
        .ok_or_else(|| format!("the release was recycled in place with {moved} pages on node 0"))?
        .to_string();
    if !line.contains("reason=\"node\"") {
        return Err(format!(
            "the release took the kernel's path for another reason: {line}"
        ));
    }
    let next = lease_on(d, "moved-next", 4 * MIB, Some(1), None, 1)?;
    d.release("moved-next")?;
    Ok(format!(
        "{moved} pages moved to node 0 by the lessee; {}; next: {next}",
        line.trim()
    ))
}

/// What the lessee of [`moved_pages_take_the_kernels_path`] does, in a process of its own
/// (`numa_guest move-pages PATH NODE`): maps the file, faults each page into its mapping
/// (mbind moves only pages its page tables hold), moves them to `node`
/// (`mbind(MPOL_MF_MOVE)`), and counts the pages there.
pub fn move_pages(path: &Path, node: u32) -> Result<usize, String> {
    let file = hugeprep::hugetlb::BackingFile::open(path, hugeprep::PageSize::Size2M)
        .map_err(|e| e.to_string())?;
    let region = file.map().map_err(|e| e.to_string())?;
    for at in (0..region.len()).step_by(PAGE as usize) {
        hugeprep::sys::numa::node_of(&region, at).map_err(|e| e.to_string())?;
    }
    hugeprep::sys::numa::move_region(&region, node).map_err(|e| e.to_string())?;
    Ok((0..region.len())
        .step_by(PAGE as usize)
        .filter(|&at| hugeprep::sys::numa::node_of(&region, at).is_ok_and(|n| n == node))
        .count())
}

fn join(cpus: &[usize]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// 64 MiB on node 1 (which holds 5 pages) is refused with 422 naming node 1, and no node's
/// free pages or pool counts change.
fn too_large(d: &Daemon, nodes: &[u32]) -> Result<String, String> {
    let pool_before = d.wait_pool("every node settled", |p| p.kinds.iter().all(settled))?;
    let free_before = free_pages(nodes)?;
    let req = LeaseRequest {
        name: "too-large".into(),
        size: 64 * MIB,
        page_size: None,
        node: Some(1),
        owner: None,
        pid: None,
        ..Default::default()
    };
    let (status, error) = match d.lease(&req) {
        Err(ClientError::Api { status, body }) => (status, body.error),
        Ok(l) => return Err(format!("64M on node 1 was granted: {l:?}")),
        Err(e) => return Err(format!("64M on node 1: {e}")),
    };
    if status != 422 || !error.contains("node 1") {
        return Err(format!("answer {status}: {error}"));
    }
    let free_after = free_pages(nodes)?;
    let pool_after = d.pool()?;
    let counts = |p: &PoolStatus| -> Vec<(u32, u64, u64, usize)> {
        p.kinds
            .iter()
            .map(|k| (k.node, k.warm_bytes, k.leased_bytes, k.leases))
            .collect()
    };
    if free_after != free_before || counts(&pool_after) != counts(&pool_before) {
        return Err(format!(
            "free pages {free_before:?} -> {free_after:?}, pool {:?} -> {:?}",
            counts(&pool_before),
            counts(&pool_after)
        ));
    }
    Ok(format!(
        "{status}: {error}; free pages per node unchanged {free_after:?}"
    ))
}
