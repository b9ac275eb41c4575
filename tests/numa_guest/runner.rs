//! The checks that run inside the multi-node test guest (`scripts/numa-guest` boots it with
//! this program in its initramfs). Each check compares what hugeprep did or said with the
//! kernel's own accounting and prints one line, `ok NAME: what was seen` or
//! `FAIL NAME: what differed`, on the serial console; the host fails its run on any `FAIL`.
//!
//! Usage (inside the guest, as /init runs it): `numa_guest 2node|4node`.

mod cli_checks;
mod daemon_checks;
mod kernel;
mod libvirt_checks;

use hugeprep::topology::Topology;

/// Counts and prints check results.
pub struct Report {
    passed: usize,
    failed: usize,
}

impl Report {
    /// Prints one check's result; `Ok` carries what was seen, `Err` what differed.
    pub fn check(&mut self, name: &str, result: Result<String, String>) {
        match result {
            Ok(seen) => {
                self.passed += 1;
                println!("ok {name}: {seen}");
            }
            Err(why) => {
                self.failed += 1;
                println!("FAIL {name}: {why}");
            }
        }
    }
}

/// What the guest looks like, read once.
pub struct Guest {
    /// The machine's name (`2node`, `4node`).
    pub name: String,
    /// The kernel's topology.
    pub topology: Topology,
}

impl Guest {
    /// Node ids.
    pub fn nodes(&self) -> Vec<u32> {
        self.topology.node_ids()
    }

    /// The first node without CPUs, if the machine has one.
    pub fn cpuless_node(&self) -> Option<u32> {
        self.topology
            .nodes
            .iter()
            .find(|n| n.cpus.is_empty())
            .map(|n| n.id)
    }
}

fn main() {
    let name = std::env::args().nth(1).unwrap_or_else(|| "unnamed".into());
    if name == "move-pages" {
        // A lessee's process (daemon_checks): moves its lease's pages, says how many moved.
        let path = std::env::args().nth(2).unwrap_or_default();
        let node = std::env::args()
            .nth(3)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        match daemon_checks::move_pages(std::path::Path::new(&path), node) {
            Ok(n) => println!("{n}"),
            Err(e) => {
                eprintln!("move-pages: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let mut report = Report {
        passed: 0,
        failed: 0,
    };
    let guest = match Topology::detect() {
        Ok(topology) => Guest { name, topology },
        Err(e) => {
            report.check("topology", Err(e.to_string()));
            std::process::exit(1);
        }
    };
    report.check("topology", topology_matches(&guest));
    cli_checks::run(&guest, &mut report);
    daemon_checks::run(&guest, &mut report);
    println!(
        "numa_guest: {} passed, {} failed",
        report.passed, report.failed
    );
    std::process::exit(i32::from(report.failed > 0));
}

/// The guest has the nodes `scripts/numa-guest` asked QEMU for, so that "node 1" below is
/// really a second node.
fn topology_matches(guest: &Guest) -> Result<String, String> {
    let want: &[(u32, usize)] = match guest.name.as_str() {
        "2node" => &[(0, 1), (1, 1)],
        "4node" => &[(0, 1), (1, 1), (2, 1), (3, 0)],
        other => return Err(format!("unknown guest {other:?}")),
    };
    let seen: Vec<(u32, usize)> = guest
        .topology
        .nodes
        .iter()
        .map(|n| (n.id, n.cpus.len()))
        .collect();
    if seen == want {
        Ok(format!("nodes and CPU counts {seen:?}"))
    } else {
        Err(format!("nodes and CPU counts {seen:?}, expected {want:?}"))
    }
}
