//! Operator traces from what a host already records:
//!
//! - libvirt's lifecycle events, `virsh event --all --loop --timestamp` (`Started` is a
//!   start, `Stopped` a stop, whatever the detail: booted, restored, migrated; destroyed,
//!   shut down, saved, crashed). The events carry no memory size: it comes from the
//!   domains' XML (`virsh dumpxml`, or /etc/libvirt/qemu/*.xml), by name or UUID.
//! - hugeprep's own log of the libvirt hook's leases: the daemon's `leased` and `released`
//!   lines (stderr, `journalctl -o short-iso-precise`, or `journalctl -o json`). A hook
//!   lease is named `libvirt-<uuid>-<alias>`; a domain's leases make one VM, started at its
//!   first lease and stopped at its last release. Any other lease is a VM of its own.

use std::collections::BTreeMap;

use super::time::parse_time;
use super::Event;
use hugeprep::page_size::PageSize;

/// A line the converter cannot use.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ConvertError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// A domain's memory, from its XML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainMemory {
    /// Its name.
    pub name: String,
    /// Its UUID.
    pub uuid: Option<String>,
    /// `<memory>`, bytes.
    pub bytes: u64,
    /// The page size of `<memoryBacking><hugepages><page>`, when it names one.
    pub page_size: Option<PageSize>,
}

fn unit_bytes(unit: &str) -> Option<u64> {
    Some(match unit {
        "b" | "bytes" => 1,
        "k" | "KiB" => 1 << 10,
        "KB" => 1000,
        "M" | "MiB" => 1 << 20,
        "MB" => 1_000_000,
        "G" | "GiB" => 1 << 30,
        "GB" => 1_000_000_000,
        "T" | "TiB" => 1 << 40,
        _ => return None,
    })
}

fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, tag: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children().find(|c| c.is_element() && c.has_tag_name(tag))
}

/// The name, UUID, memory and page size of a domain XML.
pub fn domain_memory(xml: &str) -> Result<DomainMemory, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("domain XML: {e}"))?;
    let root = doc.root_element();
    let name = child(root, "name")
        .and_then(|n| n.text())
        .ok_or("domain XML: no <name>")?
        .trim()
        .to_string();
    let uuid = child(root, "uuid")
        .and_then(|n| n.text())
        .map(|t| t.trim().to_string());
    let mem = child(root, "memory").ok_or("domain XML: no <memory>")?;
    let unit = unit_bytes(mem.attribute("unit").unwrap_or("KiB"))
        .ok_or("domain XML: <memory unit> is not a unit libvirt knows")?;
    let value: u64 = mem
        .text()
        .and_then(|t| t.trim().parse().ok())
        .ok_or("domain XML: <memory> is not a number")?;
    let page_size = child(root, "memoryBacking")
        .and_then(|m| child(m, "hugepages"))
        .and_then(|h| child(h, "page"))
        .and_then(|p| {
            let size: u64 = p.attribute("size")?.parse().ok()?;
            let unit = unit_bytes(p.attribute("unit").unwrap_or("KiB"))?;
            PageSize::from_bytes(size * unit)
        });
    Ok(DomainMemory {
        name,
        uuid,
        bytes: value.saturating_mul(unit),
        page_size,
    })
}

/// What `virsh event --all --loop --timestamp` printed, as events; the domains' memory
/// looked up by name or UUID in `domains`, and `default_page` where a domain names no page
/// size. Lines that are not lifecycle starts or stops are skipped; a start of a domain
/// `domains` does not know is an error naming it.
pub fn from_virsh_events(
    text: &str,
    domains: &[DomainMemory],
    default_page: PageSize,
) -> Result<Vec<Event>, ConvertError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let err = |message: String| ConvertError {
            line: i + 1,
            message,
        };
        let Some((when, rest)) = line.split_once(": event '") else {
            if line.starts_with("event '") {
                return Err(err(
                    "no time: capture with `virsh event --all --loop --timestamp`".into(),
                ));
            }
            continue;
        };
        if !rest.starts_with("lifecycle'") {
            continue;
        }
        let Some((_, dom)) = rest.split_once(" for domain '") else {
            continue;
        };
        let Some((name, detail)) = dom.rsplit_once("': ") else {
            continue;
        };
        let start = match detail.split_whitespace().next() {
            Some("Started") => true,
            Some("Stopped") => false,
            _ => continue,
        };
        let at_s = parse_time(when.trim()).map_err(err)?;
        let known = domains
            .iter()
            .find(|d| d.name == name || d.uuid.as_deref() == Some(name));
        let (bytes, page_size) = match known {
            Some(d) => {
                let ps = d.page_size.unwrap_or(default_page);
                // The pool's files are whole pages.
                (Some(d.bytes.div_ceil(ps.bytes()) * ps.bytes()), ps)
            }
            None if start => {
                return Err(err(format!(
                    "domain {name:?} started, but no domain XML given names it (--domain-xml)"
                )))
            }
            None => (None, default_page),
        };
        out.push(Event {
            at_s,
            vm: name.to_string(),
            start,
            bytes: if start { bytes } else { None },
            page_size,
            node: None,
        });
    }
    Ok(out)
}

/// The `key=value` fields of a log line (values unquoted).
fn fields(line: &str) -> BTreeMap<&str, &str> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k, v.trim_matches('"')))
        .collect()
}

/// One `leased` or `released` line: (time, is a lease, name, size, page size).
type LogLine = (f64, bool, String, Option<u64>, Option<PageSize>);

fn log_line(line: &str) -> Result<Option<LogLine>, String> {
    if line.trim_start().starts_with('{') {
        // `journalctl -o json`: one entry a line.
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("journal JSON: {e}"))?;
        let s = |k: &str| v.get(k).and_then(|x| x.as_str());
        let lease = match s("MESSAGE") {
            Some("leased") => true,
            Some("released") => false,
            _ => return Ok(None),
        };
        let us: f64 = s("__REALTIME_TIMESTAMP")
            .and_then(|t| t.parse().ok())
            .ok_or("journal JSON: no __REALTIME_TIMESTAMP")?;
        let name = s("NAME").ok_or("journal JSON: a lease line without NAME")?;
        return Ok(Some((
            us / 1e6,
            lease,
            name.to_string(),
            s("SIZE").and_then(|x| x.parse().ok()),
            s("PAGE_SIZE").and_then(|x| x.parse().ok()),
        )));
    }
    let lease = if line.contains(": leased ") {
        true
    } else if line.contains(": released ") {
        false
    } else {
        return Ok(None);
    };
    let first = line.split_whitespace().next().unwrap_or("");
    let at_s = parse_time(first).map_err(|e| {
        format!("time: {e} (a log without times: read it with `journalctl -o short-iso-precise`)")
    })?;
    let f = fields(line);
    let name = f.get("name").ok_or("a lease line without name=")?;
    Ok(Some((
        at_s,
        lease,
        name.to_string(),
        f.get("size").and_then(|x| x.parse().ok()),
        f.get("page_size").and_then(|x| x.parse().ok()),
    )))
}

/// The VM a lease name belongs to: a hook lease's domain UUID, else the name.
fn vm_of(name: &str) -> &str {
    hugeprep::vmm::libvirt::plan::lease_uuid(name).unwrap_or(name)
}

/// The daemon's log of leases as events: one VM per libvirt domain (its leases summed),
/// `default_page` where a line names no page size (logs before it was logged).
pub fn from_daemon_log(text: &str, default_page: PageSize) -> Result<Vec<Event>, ConvertError> {
    let mut out: Vec<Event> = Vec::new();
    // Live leases by name: (VM, size); live VMs: (index of their start, live leases).
    let mut leases: BTreeMap<String, String> = BTreeMap::new();
    let mut vms: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let err = |message: String| ConvertError {
            line: i + 1,
            message,
        };
        let Some((at_s, lease, name, size, ps)) = log_line(line).map_err(err)? else {
            continue;
        };
        let vm = vm_of(&name).to_string();
        if lease {
            let size = size.ok_or_else(|| err(format!("lease {name:?} without size=")))?;
            leases.insert(name, vm.clone());
            match vms.get_mut(&vm) {
                Some((start, n)) => {
                    *n += 1;
                    let e = &mut out[*start];
                    e.bytes = Some(e.bytes.unwrap_or(0) + size);
                }
                None => {
                    vms.insert(vm.clone(), (out.len(), 1));
                    out.push(Event {
                        at_s,
                        vm,
                        start: true,
                        bytes: Some(size),
                        page_size: ps.unwrap_or(default_page),
                        node: None,
                    });
                }
            }
        } else if leases.remove(&name).is_some() {
            let last = vms.get_mut(&vm).is_some_and(|(_, n)| {
                *n -= 1;
                *n == 0
            });
            if last {
                let page_size = vms
                    .remove(&vm)
                    .map_or(default_page, |(s, _)| out[s].page_size);
                out.push(Event {
                    at_s,
                    vm,
                    start: false,
                    bytes: None,
                    page_size,
                    node: None,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn domain_xml_gives_memory_and_page_size() {
        let d = domain_memory(
            "<domain><name>a</name><uuid>u</uuid><memory unit='MiB'>64</memory>\
             <memoryBacking><hugepages><page size='1' unit='G'/></hugepages></memoryBacking></domain>",
        )
        .unwrap();
        assert_eq!(
            (d.bytes, d.page_size, d.uuid.as_deref()),
            (64 * MIB, Some(PageSize::Size1G), Some("u"))
        );
        let d = domain_memory("<domain><name>b</name><memory>65536</memory></domain>").unwrap();
        assert_eq!((d.bytes, d.page_size), (64 * MIB, None));
    }

    /// Lines as a real libvirtd 9.0 (`virsh event --all --loop --timestamp`) and the daemon
    /// printed them (tests/trace_csv_libvirt.rs captures them live).
    #[test]
    fn captured_virsh_events_and_daemon_lines_convert() {
        let virsh = "\
2026-11-27 10:44:42.604+0000: event 'lifecycle' for domain 'probe': Defined Added
2026-11-27 10:44:46.196+0000: event 'lifecycle' for domain 'tracevm': Started Booted
2026-11-27 10:44:46.196+0000: event 'lifecycle' for domain 'tracevm': Suspended Paused
2026-11-27 10:44:48.414+0000: event 'lifecycle' for domain 'tracevm': Shutdown Finished after host request
2026-11-27 10:44:48.443+0000: event 'lifecycle' for domain 'tracevm': Stopped Destroyed
";
        let dom = DomainMemory {
            name: "tracevm".into(),
            uuid: None,
            bytes: 32 * MIB,
            page_size: None,
        };
        let ev = from_virsh_events(virsh, &[dom], PageSize::Size2M).unwrap();
        let kinds: Vec<(bool, Option<u64>)> = ev.iter().map(|e| (e.start, e.bytes)).collect();
        assert_eq!(kinds, [(true, Some(32 * MIB)), (false, None)]);
        assert!((ev[1].at_s - ev[0].at_s - 2.247).abs() < 1e-6);
        let uuid = "5e1f0000-0000-4000-8000-000000000003";
        let log = format!(
            "\
2026-11-27T11:01:50.326921Z  INFO hugeprep::api::routes: leased id=1 name=libvirt-{uuid}-pc.ram size=16777216 page_size=2M node=0 source=\"warm-shrunk\" ready_ms=3.9
2026-11-27T11:01:50.400000Z  INFO hugeprep::api::routes: leased id=2 name=libvirt-{uuid}-ram1 size=16777216 page_size=2M node=0 source=\"warm-exact\" ready_ms=0.1
2026-11-27T11:01:50.907816Z  INFO hugeprep::api::routes: leased id=3 name=other size=1073741824 page_size=1G node=0 source=\"cold\" ready_ms=0.09
2026-11-27T11:02:50.000000Z  INFO hugeprep::pool::release: released lease=1 name=libvirt-{uuid}-pc.ram file=7
2026-11-27T11:02:51.000000Z  INFO hugeprep::pool::release: released lease=2 name=libvirt-{uuid}-ram1 file=8
"
        );
        let ev = from_daemon_log(&log, PageSize::Size2M).unwrap();
        let got: Vec<(&str, bool, Option<u64>, PageSize)> = ev
            .iter()
            .map(|e| (e.vm.as_str(), e.start, e.bytes, e.page_size))
            .collect();
        assert_eq!(
            got,
            [
                (uuid, true, Some(32 * MIB), PageSize::Size2M),
                ("other", true, Some(1 << 30), PageSize::Size1G),
                (uuid, false, None, PageSize::Size2M),
            ]
        );
    }

    #[test]
    fn unknown_domains_and_untimed_events_are_named() {
        let e = from_virsh_events(
            "2026-11-27 10:00:00.000+0000: event 'lifecycle' for domain 'x': Started Booted\n",
            &[],
            PageSize::Size2M,
        )
        .unwrap_err();
        assert!(e.message.contains("\"x\""), "{e}");
        let e = from_virsh_events(
            "event 'lifecycle' for domain 'x': Started Booted\n",
            &[],
            PageSize::Size2M,
        )
        .unwrap_err();
        assert!(e.message.contains("--timestamp"), "{e}");
    }
}
