//! `hugeprep bench vm-start --migrate`: incoming live migration. A source QEMU (running,
//! its guest memory a file on hugetlbfs filled with a pattern by the bench, untimed) migrates
//! over a unix socket to a destination QEMU started with `-incoming defer`, whose memory is
//! prepared three ways, side by side in one run:
//! - **hugeprep**: a warm lease (over the API, inside the timed span) with `qemu-args`;
//! - **prealloc**: a fresh file with `prealloc=on,prealloc-threads=N` (QEMU's own threads);
//! - **floor**: a fresh file, no preallocation (the kernel faults each page as the stream
//!   writes it).
//!
//! Per case: **ready**, from the destination's exec (or the lease request) until
//! `migrate-incoming` is accepted; **total** and **downtime**, the source's `query-migrate`
//! once it completed; **loaded**, from the `migrate` command until the destination left
//! `inmigrate` (wall clock). Every case runs once untimed first, then the cases alternate in
//! each repetition (the first one rotating). Each size needs three copies of the guest's
//! memory in the page size (source, warm pool, fresh destination file); without them the size
//! is skipped with a line saying so.

mod report;

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::holdback::Holdback;
use super::table;
use super::world::{page_world, PageWorld};
use super::{check, mem_available, Result, VmStartBenchConfig, VmStartBenchError, World};
use crate::turns::turns;
use hugeprep::client::Client;
use hugeprep::hugetlb::{BackingFile, PoolTopUp};
use hugeprep::page_size::PageSize;
use hugeprep::units::format_bytes;
use hugeprep::vmm::{qemu as handoff, GuestMemoryFile};
use hugeprep_testkit::qemu::{vm_args, QemuConfig, QemuVm};

pub use report::{MigrateCaseResult, MigrateReport, MigrateResult, READY_TARGET_S};

/// How long a QEMU may take to become ready, and a migration to complete (liveness bounds).
const LIMIT: Duration = Duration::from_secs(300);

/// How the destination's memory is prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MigrateCase {
    /// A warm hugeprep lease with `qemu-args`.
    Hugeprep,
    /// A fresh file, `prealloc=on`.
    Prealloc,
    /// A fresh file, no preallocation.
    Floor,
}

impl MigrateCase {
    /// Every case, in table order.
    pub const ALL: [MigrateCase; 3] = [
        MigrateCase::Hugeprep,
        MigrateCase::Prealloc,
        MigrateCase::Floor,
    ];

    /// The row label.
    pub fn label(self, threads: usize) -> String {
        match self {
            MigrateCase::Hugeprep => "hugeprep warm lease, qemu-args".into(),
            MigrateCase::Prealloc => format!("prealloc=on, prealloc-threads={threads}"),
            MigrateCase::Floor => "file, prealloc=off (floor)".into(),
        }
    }
}

/// One incoming migration's measurements, seconds.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sample {
    /// Destination exec (or lease request) to `migrate-incoming` accepted.
    pub ready: f64,
    /// The source's `total-time`.
    pub total: f64,
    /// The source's `downtime`.
    pub downtime: f64,
    /// `migrate` sent until the destination left `inmigrate`.
    pub loaded: f64,
}

/// The (size, page size) pairs to run: `--sizes` on every page size, or without sizes the
/// issue's defaults (4 GiB on 2 MiB pages, 8 GiB on 1 GiB pages).
pub fn default_pairs(sizes: &[u64], page_sizes: &[PageSize]) -> Vec<(u64, PageSize)> {
    if sizes.is_empty() {
        return page_sizes
            .iter()
            .map(|&ps| {
                let size = if ps == PageSize::Size1G {
                    8 << 30
                } else {
                    4 << 30
                };
                (size, ps)
            })
            .collect();
    }
    sizes
        .iter()
        .flat_map(|&s| page_sizes.iter().map(move |&ps| (s, ps)))
        .collect()
}

/// Runs the migrations; `log` gets a line per migration and per skipped size.
pub fn run(
    cfg: &VmStartBenchConfig,
    pairs: &[(u64, PageSize)],
    log: &dyn Fn(&str),
) -> Result<MigrateReport> {
    check(cfg)?;
    let load_before = crate::load_average();
    let mut not_measured = Vec::new();
    let cgroups = super::vmm_cgroups(&[super::Vmm::Qemu], &mut not_measured, log);
    let mut results = Vec::new();
    let mut skipped = Vec::new();
    for &(size, ps) in pairs {
        let name = format!("{} on {ps} pages", format_bytes(size));
        if size % ps.bytes() != 0 {
            table::skip(
                &mut skipped,
                log,
                format!("{name}: not a whole number of pages"),
            );
            continue;
        }
        let top_up = match three_copies(cfg, size, ps) {
            Ok(t) => t,
            Err(why) => {
                table::skip(&mut skipped, log, format!("{name}: {why}"));
                continue;
            }
        };
        let pw = page_world(cfg, size, ps, top_up, false, cgroups.as_ref())?;
        results.push(run_world(cfg, &pw, log)?);
    }
    Ok(report::report(
        cfg,
        not_measured,
        results,
        skipped,
        load_before,
    ))
}

/// Tops the kernel's pool up to three copies of `size` (source, warm pool, fresh
/// destination); `Err` with the reason when the machine cannot spare them.
pub(super) fn three_copies(
    cfg: &VmStartBenchConfig,
    size: u64,
    ps: PageSize,
) -> std::result::Result<PoolTopUp, String> {
    let pages = 3 * (size / ps.bytes());
    let free = hugeprep::hugetlb::pool::available(None, ps).unwrap_or(0);
    let taken = pages.saturating_sub(free) * ps.bytes();
    if taken > 0 && mem_available().is_some_and(|m| m < taken + cfg.headroom) {
        return Err(format!(
            "needs 3 x {} of {ps} hugepages (source, warm pool, fresh destination), more than \
             the pool's {free} free pages and the memory available less the headroom",
            format_bytes(size)
        ));
    }
    PoolTopUp::ensure_free(None, ps, pages).map_err(|e| e.to_string())
}

/// The source's memory: a file on the scratch mount with every page written (a pattern, so
/// the stream carries data rather than zero pages), kept for the whole size; removed on drop.
struct SourceMemory {
    file: Option<BackingFile>,
}

impl SourceMemory {
    fn fill(world: &World) -> Result<SourceMemory> {
        let path = world.scratch.join("migrate-source");
        let _ = std::fs::remove_file(&path);
        let file = BackingFile::create(&path, world.size, world.page_size, None)?;
        // Removed on drop if the map fails.
        let memory = SourceMemory { file: Some(file) };
        if let Some(file) = &memory.file {
            let mut region = file.map()?;
            for (i, chunk) in region.as_mut_slice().chunks_mut(4096).enumerate() {
                chunk.fill((i % 251) as u8 + 1);
            }
        }
        Ok(memory)
    }

    fn path(&self) -> &Path {
        self.file.as_ref().map_or(Path::new(""), |f| f.path())
    }
}

impl Drop for SourceMemory {
    fn drop(&mut self) {
        if let Some(f) = self.file.take() {
            let _ = f.remove();
        }
    }
}

fn run_world(
    cfg: &VmStartBenchConfig,
    pw: &PageWorld,
    log: &dyn Fn(&str),
) -> Result<MigrateResult> {
    let world = &pw.world;
    let name = format!("{} {}", format_bytes(world.size), world.page_size);
    log(&format!("{name}: filling the source's memory (untimed)"));
    let source = SourceMemory::fill(world)?;
    let cases = MigrateCase::ALL;
    let mut samples: Vec<Vec<Sample>> = vec![Vec::with_capacity(cfg.reps); cases.len()];
    for turn in turns(cfg.reps, cases.len()) {
        cfg.check_cancelled()?;
        let case = cases[turn.case];
        // While the lease is timed the pool cannot refill behind it.
        let held = if case == MigrateCase::Hugeprep {
            world.size / world.page_size.bytes()
        } else {
            0
        };
        let holdback = Holdback::reserve(&world.scratch, held, world.page_size)?;
        let tag = format!("{}-{}", turn.rep, turn.case);
        let sample = migrate_once(&cfg.qemu, world, source.path(), case, &tag)?;
        world.settle()?;
        drop(holdback);
        log(&format!(
            "{name} {:<8} {:<40} ready {:.4} s, total {:.3} s, downtime {:.3} s, loaded {:.3} s",
            turn.when(cfg.reps),
            case.label(world.threads),
            sample.ready,
            sample.total,
            sample.downtime,
            sample.loaded
        ));
        if turn.timed {
            samples[turn.case].push(sample);
        }
    }
    drop(source);
    Ok(report::world_result(world, &cases, samples))
}

/// One migration into a destination of `case`; both QEMUs are gone, the lease released
/// and the fresh file removed when it returns.
fn migrate_once(
    qemu: &Path,
    world: &World,
    source_mem: &Path,
    case: MigrateCase,
    tag: &str,
) -> Result<Sample> {
    let dir = &world.tmp;
    let src_qmp = dir.join(format!("mig-src-{tag}.qmp"));
    let dst_qmp = dir.join(format!("mig-dst-{tag}.qmp"));
    let channel = dir.join(format!("mig-{tag}.sock"));
    let _ = std::fs::remove_file(&channel);
    let config = QemuConfig {
        binary: qemu.to_path_buf(),
        size: world.size,
        mem_path: source_mem.to_path_buf(),
        share: true,
        prealloc: false,
        prealloc_threads: world.threads,
        qmp_socket: src_qmp.clone(),
    };
    let mut src = QemuVm::spawn_in(&config, world.vmm_cgroup("mig-src")?)?;
    src.wait_ready(LIMIT)?;
    src.execute("cont")?;
    src.execute_with(
        "migrate-set-parameters",
        serde_json::json!({ "max-bandwidth": 1u64 << 40 }),
    )?;
    let fresh = world.scratch.join(format!("mig-dst-{tag}"));
    let _ = std::fs::remove_file(&fresh);
    let client = Client::new(world.daemon.socket());
    let start = Instant::now();
    let (args, lease) = match case {
        MigrateCase::Hugeprep => {
            let lease =
                client.blocking(client.lease(&world.lease_request(format!("migrate-{tag}"))))?;
            let mut args = vm_args(&dst_qmp);
            args.extend(handoff::machine_args(&GuestMemoryFile {
                id: "mem0",
                path: &lease.path,
                size: lease.size,
                node: Some(lease.node),
            }));
            (args, Some(lease))
        }
        MigrateCase::Prealloc | MigrateCase::Floor => {
            let dst = QemuConfig {
                mem_path: fresh.clone(),
                prealloc: case == MigrateCase::Prealloc,
                qmp_socket: dst_qmp.clone(),
                ..config.clone()
            };
            (dst.args(), None)
        }
    };
    let result = (|| {
        let mut args = args;
        args.extend(["-incoming".to_string(), "defer".to_string()]);
        let mut dst = QemuVm::spawn_args_in(
            &config.binary,
            &args,
            &dst_qmp,
            world.vmm_cgroup("mig-dst")?,
        )?;
        dst.wait_ready(LIMIT)?;
        let uri = format!("unix:{}", channel.display());
        dst.execute_with("migrate-incoming", serde_json::json!({ "uri": uri }))?;
        let ready = start.elapsed().as_secs_f64();
        let sent = Instant::now();
        src.execute_with("migrate", serde_json::json!({ "uri": uri }))?;
        let info = wait_migrated(&mut src)?;
        wait_loaded(&mut dst)?;
        let loaded = sent.elapsed().as_secs_f64();
        let ms = |key: &str| info.get(key).and_then(|v| v.as_f64()).unwrap_or(f64::NAN) / 1e3;
        dst.quit(Duration::from_secs(10));
        Ok(Sample {
            ready,
            total: ms("total-time"),
            downtime: ms("downtime"),
            loaded,
        })
    })();
    src.quit(Duration::from_secs(10));
    if let Some(lease) = lease {
        client.blocking(client.release(lease.id))?;
    }
    let _ = std::fs::remove_file(&fresh);
    let _ = std::fs::remove_file(&channel);
    result
}

/// Polls the source's `query-migrate` until it completed; its answer.
fn wait_migrated(src: &mut QemuVm) -> Result<serde_json::Value> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let info = src.execute("query-migrate")?;
        // QEMU 7.2 says `completed` a moment before it has filled in the times (a run
        // here read total-time 0 once): ask again until they are there.
        let timed = info.get("total-time").and_then(|t| t.as_u64()).unwrap_or(0) > 0;
        match info.get("status").and_then(|s| s.as_str()) {
            Some("completed") if timed || Instant::now() > deadline => return Ok(info),
            Some("failed") | Some("cancelled") => {
                return Err(VmStartBenchError::Invalid {
                    field: "migrate",
                    reason: format!("the migration did not complete: {info}"),
                })
            }
            _ if Instant::now() > deadline => {
                return Err(VmStartBenchError::Invalid {
                    field: "migrate",
                    reason: format!("the migration did not complete within {LIMIT:?}: {info}"),
                })
            }
            _ => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Polls the destination until it is no longer `inmigrate`.
fn wait_loaded(dst: &mut QemuVm) -> Result<()> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let status = dst.execute("query-status")?;
        if status.get("status").and_then(|s| s.as_str()) != Some("inmigrate") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(VmStartBenchError::Invalid {
                field: "migrate",
                reason: format!("the destination was still inmigrate after {LIMIT:?}"),
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
