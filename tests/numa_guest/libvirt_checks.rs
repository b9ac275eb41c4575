//! The libvirt hook's per-cell placement on a multi-node guest, without libvirt: the guest
//! runs `hugeprep libvirt-hook NAME start begin -` with a domain XML on stdin, as libvirtd
//! would, and checks with `numa_maps` that each guest cell's file sits on the host node its
//! `<numatune><memnode>` names; `release end` gives every lease back.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::daemon_checks::{Daemon, DIR};
use crate::kernel;
use crate::{Guest, Report};

/// Where the hook links files, as `memory_backing_dir` in qemu.conf would say.
const BACKING_DIR: &str = "/mnt/huge/libvirt";
/// The domain's start id and name: libvirt's directory is `<id>-<name>`.
const DOMAIN_DIR: &str = "7-numa-guest";

/// Runs the hook check.
pub fn run(guest: &Guest, report: &mut Report, daemon: &Daemon) {
    report.check(
        "libvirt_hook_puts_each_cell_on_its_numatune_node",
        hook_cells(guest, daemon),
    );
}

/// Guest cell -> host node: crossed (cell 0 on node 1, cell 1 on node 0), so that a cell
/// id taken for a node id fails; on the 4-node guest cell 2 goes to node 3, which has no
/// CPUs.
fn cell_nodes(guest: &Guest) -> Vec<(u32, u32)> {
    let mut cells = vec![(0, 1), (1, 0)];
    if let Some(node) = guest.cpuless_node() {
        cells.push((2, node));
    }
    cells
}

fn domain_xml(cells: &[(u32, u32)]) -> String {
    let cell_lines: String = cells
        .iter()
        .map(|(c, _)| format!("<cell id='{c}' cpus='{c}' memory='4' unit='MiB'/>"))
        .collect();
    let memnodes: String = cells
        .iter()
        .map(|(c, n)| format!("<memnode cellid='{c}' mode='strict' nodeset='{n}'/>"))
        .collect();
    format!(
        "<domain type='kvm' id='7'><name>numa-guest</name>\
         <uuid>4b1e7a52-0c1d-4a55-9d7e-1f2a3b4c5d6e</uuid>\
         <memory unit='MiB'>{}</memory><vcpu>{}</vcpu>\
         <memoryBacking><source type='file'/><access mode='shared'/></memoryBacking>\
         <cpu><numa>{cell_lines}</numa></cpu><numatune>{memnodes}</numatune></domain>",
        4 * cells.len(),
        cells.len()
    )
}

/// Runs `hugeprep libvirt-hook` for `op subop` with `xml` on stdin.
fn hook(config: &str, op: &str, subop: &str, xml: &str) -> Result<(), String> {
    let mut child = Command::new("hugeprep")
        .args([
            "libvirt-hook",
            "--config",
            config,
            "numa-guest",
            op,
            subop,
            "-",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("hugeprep libvirt-hook: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(xml.as_bytes()).map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "libvirt-hook {op} {subop} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn hook_cells(guest: &Guest, daemon: &Daemon) -> Result<String, String> {
    let cells = cell_nodes(guest);
    // Room for 4 MiB per cell on every node the cells use, beside the earlier checks' leases.
    for &(_, node) in &cells {
        let nr = kernel::node_counter(node, "nr_hugepages")?;
        kernel::set_node_pages(node, nr + 2)?;
    }
    std::fs::create_dir_all(BACKING_DIR).map_err(|e| e.to_string())?;
    let config = format!("{DIR}/libvirt-hook.toml");
    std::fs::write(
        &config,
        format!(
            "socket = \"{DIR}/sock\"\nmemory_backing_dir = \"{BACKING_DIR}\"\nutf8_locale = true\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let xml = domain_xml(&cells);
    hook(&config, "start", "begin", &xml)?;
    let dir = Path::new(BACKING_DIR).join("libvirt/qemu").join(DOMAIN_DIR);
    let placed: Result<Vec<String>, String> = cells
        .iter()
        .map(|&(cell, node)| {
            let file = dir.join(format!("ram-node{cell}"));
            let seen = kernel::file_nodes(&file)?;
            if seen != BTreeMap::from([(node, 2)]) {
                return Err(format!(
                    "{}: numa_maps pages per node {seen:?}, expected 2 on node {node}",
                    file.display()
                ));
            }
            Ok(format!("cell {cell} -> node {node}"))
        })
        .collect();
    // libvirt deletes the domain's directory on stop, then runs `release end`.
    let _ = std::fs::remove_dir_all(&dir);
    let released = hook(&config, "release", "end", &xml);
    let placed = placed?;
    released?;
    let left: Vec<String> = daemon
        .leases()?
        .into_iter()
        .filter(|l| l.name.starts_with("libvirt-"))
        .map(|l| l.name)
        .collect();
    if !left.is_empty() {
        return Err(format!("leases left after release end: {left:?}"));
    }
    Ok(format!(
        "{} (numa_maps), every lease released",
        placed.join(", ")
    ))
}
