//! The one-shot commands on a multi-node guest: `hugeprep pool` (show and `--set` per node)
//! and `hugeprep prepare --node N`, each against sysfs, `hugeadm` and `numa_maps`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::kernel::{self, per_node};
use crate::{Guest, Report};

/// Runs the CLI checks.
pub fn run(guest: &Guest, report: &mut Report) {
    report.check("pool_set_node1_changes_node1_only", pool_set_node1(guest));
    report.check("pool_agrees_with_sysfs_and_hugeadm", pool_agrees(guest));
    report.check(
        "prepare_node1_pages_and_workers_on_node1",
        prepare_on(guest, 1),
    );
    if let Some(node) = guest.cpuless_node() {
        report.check(
            "prepare_cpuless_node_places_memory_and_names_cpus",
            prepare_on(guest, node),
        );
    }
}

/// Runs `hugeprep ARGS`; its stdout, or an error with its stderr.
pub fn hugeprep(args: &[&str]) -> Result<String, String> {
    let out = Command::new("hugeprep")
        .args(args)
        .output()
        .map_err(|e| format!("hugeprep {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "hugeprep {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("bad JSON ({e}): {text}"))
}

fn pool_set_node1(guest: &Guest) -> Result<String, String> {
    let nodes = guest.nodes();
    let before = per_node(&nodes, "nr_hugepages")?;
    let want = before[&1] + 3;
    let out = hugeprep(&[
        "pool",
        "--local",
        "--json",
        "--set",
        &want.to_string(),
        "--node",
        "1",
    ])?;
    let after = per_node(&nodes, "nr_hugepages")?;
    let mut expected = before.clone();
    expected.insert(1, want);
    if after != expected {
        return Err(format!(
            "nr_hugepages per node before {before:?}, after {after:?}, expected {expected:?}"
        ));
    }
    let shown = node_totals(&json(&out)?)?;
    if shown.get(&1) != Some(&want) {
        return Err(format!(
            "hugeprep pool shows node totals {shown:?} after setting node 1 to {want}"
        ));
    }
    Ok(format!("nr_hugepages {before:?} -> {after:?}"))
}

/// The 2M totals per node in `hugeprep pool --json` output.
fn node_totals(v: &Value) -> Result<BTreeMap<u32, u64>, String> {
    let mut out = BTreeMap::new();
    for p in v["kernel"].as_array().ok_or("no kernel array")? {
        if p["page_size"] != "2M" {
            continue;
        }
        if let Some(node) = p["scope"]["node"].as_u64() {
            out.insert(node as u32, p["total"].as_u64().unwrap_or(u64::MAX));
        }
    }
    Ok(out)
}

fn pool_agrees(guest: &Guest) -> Result<String, String> {
    let nodes = guest.nodes();
    // Distinct sizes per node, so that a swapped node id cannot agree by chance.
    for &n in &nodes {
        kernel::set_node_pages(n, u64::from(n) + 2)?;
    }
    let v = json(&hugeprep(&["pool", "--local", "--json"])?)?;
    let mut seen = Vec::new();
    let mut system_total = None;
    for p in v["kernel"].as_array().ok_or("no kernel array")? {
        if p["page_size"] != "2M" {
            continue;
        }
        if p["scope"] == "system" {
            system_total = p["total"].as_u64();
            continue;
        }
        let node = p["scope"]["node"].as_u64().ok_or("scope without node")? as u32;
        for (field, counter) in [
            ("total", "nr_hugepages"),
            ("free", "free_hugepages"),
            ("surplus", "surplus_hugepages"),
        ] {
            let sysfs = kernel::node_counter(node, counter)?;
            if p[field].as_u64() != Some(sysfs) {
                return Err(format!(
                    "node {node} {field}: hugeprep {} sysfs {counter} {sysfs}",
                    p[field]
                ));
            }
        }
        seen.push(node);
    }
    if seen != nodes {
        return Err(format!(
            "hugeprep pool lists nodes {seen:?}, the kernel has {nodes:?}"
        ));
    }
    let sum: u64 = per_node(&nodes, "nr_hugepages")?.values().sum();
    if system_total != Some(sum) {
        return Err(format!(
            "system 2M total {system_total:?}, nodes sum to {sum}"
        ));
    }
    let current = hugeadm_current()?;
    if current != sum {
        return Err(format!(
            "hugeadm --pool-list Current {current}, hugeprep and sysfs {sum}"
        ));
    }
    Ok(format!(
        "nodes {seen:?}, every node's total/free/surplus as sysfs, {sum} pages as hugeadm"
    ))
}

/// `Current` of the 2 MiB line of `hugeadm --pool-list`.
fn hugeadm_current() -> Result<u64, String> {
    let out = Command::new("hugeadm")
        .arg("--pool-list")
        .output()
        .map_err(|e| format!("hugeadm: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"2097152"))
        .and_then(|f| f.get(2).and_then(|c| c.parse().ok()))
        .ok_or_else(|| format!("no 2097152 line in hugeadm --pool-list: {text}"))
}

/// `hugeprep prepare --node NODE` of 8 MiB: every page on the node (free pages and
/// numa_maps), no page elsewhere, and workers on the node's CPUs (or, for a node without
/// CPUs, the CPUs it says it used).
fn prepare_on(guest: &Guest, node: u32) -> Result<String, String> {
    let nodes = guest.nodes();
    let pages = 4;
    let nr = kernel::node_counter(node, "nr_hugepages")?;
    // One page more for the text-output run on a node without CPUs.
    kernel::set_node_pages(node, nr + pages + 1)?;
    let free_before = per_node(&nodes, "free_hugepages")?;
    let path = format!("/mnt/huge/prepare-node{node}");
    let result = (|| {
        let out = json(&hugeprep(&[
            "prepare",
            "--size",
            "8M",
            "--node",
            &node.to_string(),
            "--path",
            &path,
            "--json",
        ])?)?;
        let free_after = per_node(&nodes, "free_hugepages")?;
        let mut expected = free_before.clone();
        expected.insert(node, free_before[&node] - pages);
        if free_after != expected {
            return Err(format!(
                "free_hugepages per node {free_before:?} -> {free_after:?}, expected {expected:?}"
            ));
        }
        let placed = kernel::file_nodes(Path::new(&path))?;
        if placed != BTreeMap::from([(node, pages)]) {
            return Err(format!("numa_maps of the file: pages per node {placed:?}"));
        }
        let node_cpus = kernel::node_cpus(node)?;
        let said: Vec<usize> = serde_json::from_value(out["cpus"].clone())
            .map_err(|e| format!("cpus in {out}: {e}"))?;
        let seen: Vec<Vec<usize>> = serde_json::from_value(out["affinity"].clone())
            .map_err(|e| format!("affinity in {out}: {e}"))?;
        let allowed = kernel::process_cpus(std::process::id())?;
        let home = if node_cpus.is_empty() {
            &allowed
        } else {
            &node_cpus
        };
        if !kernel::all_within(&said, home) || !seen.iter().all(|a| kernel::all_within(a, home)) {
            return Err(format!(
                "workers pinned to {said:?}, their sched_getaffinity {seen:?}; node {node} CPUs {node_cpus:?}"
            ));
        }
        if out["node"] != node {
            return Err(format!("the report names node {}", out["node"]));
        }
        if node_cpus.is_empty() {
            // The text output says which CPUs ran a memory-only node's workers.
            let text_path = format!("{path}-text");
            let text = hugeprep(&[
                "prepare",
                "--size",
                "2M",
                "--node",
                &node.to_string(),
                "--path",
                &text_path,
            ]);
            let _ = std::fs::remove_file(&text_path);
            let text = text?;
            if !text.contains("has no CPUs") {
                return Err(format!(
                    "prepare on CPU-less node {node} does not say so: {text}"
                ));
            }
        }
        Ok(format!(
            "{pages} pages on node {node} (numa_maps {placed:?}), workers' affinity {seen:?}, node CPUs {node_cpus:?}"
        ))
    })();
    let _ = std::fs::remove_file(&path);
    let _ = kernel::set_node_pages(node, nr);
    result
}

/// Free 2M pages per node, for checks that must see no change on other nodes.
pub fn free_pages(nodes: &[u32]) -> Result<BTreeMap<u32, u64>, String> {
    per_node(nodes, "free_hugepages")
}
