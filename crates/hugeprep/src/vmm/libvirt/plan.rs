//! From a domain to the leases it needs: whether it opts in, one backend per QEMU memory
//! object (alias, size, page size, host node), the lease names and the paths QEMU opens.
//! Pure functions: no daemon, no file system.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use super::domain::Domain;
use super::error::{HookError, Result};
use crate::page_size::PageSize;

/// Prefix of every lease the hook takes.
pub const LEASE_PREFIX: &str = "libvirt-";

/// How many bytes (or characters, in a UTF-8 locale) of the name libvirt keeps in the
/// per-domain directory name (`VIR_DOMAIN_SHORT_NAME_MAX`).
pub const SHORT_NAME_MAX: usize = 20;

/// One QEMU memory backend and the lease that backs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// QEMU's object id, the file name in the per-domain directory (`pc.ram`, `ram-node0`).
    pub alias: String,
    /// Guest cell, when the guest has NUMA cells.
    pub cell: Option<u32>,
    /// Bytes.
    pub size: u64,
    /// Host NUMA node, when the domain binds this memory to one.
    pub node: Option<u32>,
}

/// The leases a domain needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Page size of every backend.
    pub page_size: PageSize,
    /// One per QEMU memory backend.
    pub backends: Vec<Backend>,
}

/// Why a domain does not take its memory from hugeprep (it starts as libvirt would start
/// it without the hook).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotOptedIn {
    /// No `<memoryBacking><source type='file'/>`.
    NoFileSource,
    /// Some memory is not shared: QEMU would map the file private and take new pages.
    NotShared,
    /// `<hugepages>` makes libvirt pass a directory, in which pre-placed files are not used.
    Hugepages,
}

/// Whether a domain opts in: file-backed memory, mapped shared, without `<hugepages>`.
pub fn opts_in(d: &Domain) -> std::result::Result<(), NotOptedIn> {
    if d.source_type.as_deref() != Some("file") {
        return Err(NotOptedIn::NoFileSource);
    }
    if d.hugepages {
        return Err(NotOptedIn::Hugepages);
    }
    let domain_shared = d.access_mode.as_deref() == Some("shared");
    let shared = if d.cells.is_empty() {
        domain_shared
    } else {
        d.cells.iter().all(|c| match c.mem_access.as_deref() {
            Some(mode) => mode == "shared",
            None => domain_shared,
        })
    };
    if shared {
        Ok(())
    } else {
        Err(NotOptedIn::NotShared)
    }
}

/// The host node of guest cell `cell` (`None`: the guest has no NUMA cells): hugeprep's
/// `<metadata>` cell, then its `node`, then `<numatune><memnode cellid>`, then
/// `<numatune><memory>`; of a nodeset, the lowest node. `None` when nothing binds it.
pub fn select_host_node(d: &Domain, cell: Option<u32>) -> Option<u32> {
    let meta = d.metadata.as_ref();
    let from_meta_cell = cell
        .and_then(|c| meta.and_then(|m| m.cells.iter().find(|(id, _)| *id == c).map(|(_, n)| *n)));
    let from_memnode = || {
        cell.and_then(|c| {
            d.numatune
                .memnodes
                .iter()
                .find(|(id, _)| *id == c)
                .and_then(|(_, set)| set.first().copied())
        })
    };
    from_meta_cell
        .or_else(|| meta.and_then(|m| m.node))
        .or_else(from_memnode)
        .or_else(|| d.numatune.memory.as_ref().and_then(|s| s.first().copied()))
}

/// The backends of an opted-in domain whose memory lives on a mount of `mount_page_size`.
pub fn plan(d: &Domain, mount_page_size: PageSize) -> Result<Plan> {
    let page_size = d
        .metadata
        .as_ref()
        .and_then(|m| m.page_size)
        .unwrap_or(mount_page_size);
    if page_size != mount_page_size {
        return Err(HookError::Plan(format!(
            "hugeprep page_size {page_size} in <metadata> but memory_backing_dir is on a \
             {mount_page_size} hugetlbfs mount"
        )));
    }
    let backends: Vec<Backend> = if d.cells.is_empty() {
        vec![Backend {
            alias: "pc.ram".into(),
            cell: None,
            size: d.memory,
            node: select_host_node(d, None),
        }]
    } else {
        d.cells
            .iter()
            .map(|c| Backend {
                alias: format!("ram-node{}", c.id),
                cell: Some(c.id),
                size: c.memory,
                node: select_host_node(d, Some(c.id)),
            })
            .collect()
    };
    for b in &backends {
        if b.size == 0 || b.size % page_size.bytes() != 0 {
            return Err(HookError::Plan(format!(
                "{} of {} bytes is not a whole number of {page_size} pages",
                b.alias, b.size
            )));
        }
    }
    Ok(Plan {
        page_size,
        backends,
    })
}

/// The lease name of a domain's backend: `libvirt-<uuid>-<alias>` (at most 64 bytes).
pub fn lease_name(uuid: &str, alias: &str) -> String {
    format!("{}-{alias}", lease_prefix(uuid))
}

/// The prefix shared by every lease of one domain.
pub fn lease_prefix(uuid: &str) -> String {
    format!("{LEASE_PREFIX}{uuid}")
}

/// The domain UUID a hook lease name belongs to.
pub fn lease_uuid(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(LEASE_PREFIX)?;
    (rest.len() > 37 && rest.as_bytes()[36] == b'-').then(|| &rest[..36])
}

/// libvirt's short domain name `<id>-<name>` (`virDomainDefGetShortName`): the name cut to
/// 20 characters when libvirtd's locale decodes it (`utf8_locale`), else to 20 bytes (in
/// the C locale a non-ASCII name does not decode and libvirt cuts bytes, which may split a
/// character).
pub fn short_name(id: u32, name: &str, utf8_locale: bool) -> OsString {
    let mut out = format!("{id}-").into_bytes();
    if utf8_locale || name.is_ascii() {
        out.extend(
            name.chars()
                .take(SHORT_NAME_MAX)
                .collect::<String>()
                .bytes(),
        );
    } else {
        out.extend(name.bytes().take(SHORT_NAME_MAX));
    }
    OsString::from_vec(out)
}

/// The directory libvirt gives QEMU: `<memory_backing_dir>/libvirt/qemu/<id>-<short name>`.
pub fn domain_dir(memory_backing_dir: &Path, short_name: &OsString) -> PathBuf {
    memory_backing_dir.join("libvirt/qemu").join(short_name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::libvirt::domain::{Cell, Metadata};

    fn domain(cells: &[(u32, u64)]) -> Domain {
        Domain {
            name: "vm".into(),
            uuid: "0a1b2c3d-0000-4000-8000-000000000001".into(),
            id: Some(3),
            memory: cells.iter().map(|c| c.1).sum::<u64>().max(64 << 20),
            source_type: Some("file".into()),
            access_mode: Some("shared".into()),
            cells: cells
                .iter()
                .map(|&(id, memory)| Cell {
                    id,
                    memory,
                    mem_access: None,
                })
                .collect(),
            ..Domain::default()
        }
    }

    #[test]
    fn one_backend_without_guest_numa() {
        let p = plan(&domain(&[]), PageSize::Size2M).unwrap();
        assert_eq!(
            p.backends,
            vec![Backend {
                alias: "pc.ram".into(),
                cell: None,
                size: 64 << 20,
                node: None
            }]
        );
    }

    #[test]
    fn one_backend_per_cell_with_its_node() {
        let mut d = domain(&[(0, 32 << 20), (1, 64 << 20)]);
        d.numatune.memnodes = vec![(0, vec![0]), (1, vec![1, 2])];
        let p = plan(&d, PageSize::Size2M).unwrap();
        let got: Vec<_> = p
            .backends
            .iter()
            .map(|b| (b.alias.as_str(), b.size, b.node))
            .collect();
        assert_eq!(
            got,
            vec![
                ("ram-node0", 32 << 20, Some(0)),
                ("ram-node1", 64 << 20, Some(1))
            ]
        );
    }

    #[test]
    fn metadata_wins_over_numatune() {
        let mut d = domain(&[(0, 32 << 20), (1, 32 << 20)]);
        d.numatune.memory = Some(vec![5]);
        d.numatune.memnodes = vec![(0, vec![4])];
        d.metadata = Some(Metadata {
            cells: vec![(1, 7)],
            ..Metadata::default()
        });
        assert_eq!(select_host_node(&d, Some(0)), Some(4));
        assert_eq!(select_host_node(&d, Some(1)), Some(7));
        d.metadata.as_mut().unwrap().node = Some(6);
        assert_eq!(select_host_node(&d, Some(0)), Some(6));
        d.metadata = None;
        d.numatune.memnodes.clear();
        assert_eq!(select_host_node(&d, Some(0)), Some(5));
        assert_eq!(select_host_node(&d, None), Some(5));
    }

    #[test]
    fn opt_in_needs_file_and_shared() {
        let mut d = domain(&[]);
        assert_eq!(opts_in(&d), Ok(()));
        d.access_mode = Some("private".into());
        assert_eq!(opts_in(&d), Err(NotOptedIn::NotShared));
        let mut d = domain(&[(0, 32 << 20)]);
        d.access_mode = None;
        d.cells[0].mem_access = Some("shared".into());
        assert_eq!(opts_in(&d), Ok(()));
        d.hugepages = true;
        assert_eq!(opts_in(&d), Err(NotOptedIn::Hugepages));
        d.source_type = None;
        assert_eq!(opts_in(&d), Err(NotOptedIn::NoFileSource));
    }

    #[test]
    fn sizes_must_be_whole_pages_of_the_mount() {
        let mut d = domain(&[]);
        d.memory = 3 << 20;
        let e = plan(&d, PageSize::Size2M).unwrap_err();
        assert!(e.to_string().contains("pc.ram"), "{e}");
        let mut d = domain(&[]);
        d.metadata = Some(Metadata {
            page_size: Some(PageSize::Size1G),
            ..Metadata::default()
        });
        let e = plan(&d, PageSize::Size2M).unwrap_err();
        assert!(e.to_string().contains("1G"), "{e}");
    }

    #[test]
    fn names_round_trip_and_fit() {
        let uuid = "0a1b2c3d-0000-4000-8000-000000000001";
        let n = lease_name(uuid, "ram-node15");
        assert!(n.len() <= crate::pool::MAX_NAME, "{n}");
        assert_eq!(lease_uuid(&n), Some(uuid));
        assert_eq!(lease_uuid("libvirt-short"), None);
        assert_eq!(lease_uuid("other"), None);
    }

    #[test]
    fn short_names_follow_libvirt() {
        assert_eq!(short_name(4, "abc", false), OsString::from("4-abc"));
        let long = "a-very-long-domain-name-indeed";
        assert_eq!(
            short_name(1, long, false),
            OsString::from("1-a-very-long-domain-n")
        );
        let uni = "ünïcødé ünïcødé ünïcødé";
        assert_eq!(
            short_name(2, uni, true),
            OsString::from(format!("2-{}", uni.chars().take(20).collect::<String>()))
        );
        assert_eq!(short_name(2, uni, false).len(), 2 + 20);
    }

    #[test]
    fn the_integration_examples_opt_in_and_plan() {
        for (xml, expected) in [
            (
                include_str!("../../../../../integration/libvirt/domain-1cell.xml"),
                vec![("pc.ram", 4u64 << 30, None)],
            ),
            (
                include_str!("../../../../../integration/libvirt/domain-2cell.xml"),
                vec![
                    ("ram-node0", 4 << 30, Some(0)),
                    ("ram-node1", 4 << 30, Some(1)),
                ],
            ),
            (
                include_str!("../../../../../integration/libvirt/domain-metadata.xml"),
                vec![
                    ("ram-node0", 1 << 30, Some(0)),
                    ("ram-node1", 1 << 30, Some(1)),
                ],
            ),
        ] {
            // Examples carry no uuid or id: libvirt adds them.
            let xml = xml.replace(
                "<domain type='kvm'>",
                "<domain type='kvm' id='1'><uuid>5e1f0000-0000-4000-8000-000000000001</uuid>",
            );
            let d = Domain::parse(&xml).unwrap();
            assert_eq!(opts_in(&d), Ok(()));
            let got: Vec<_> = plan(&d, PageSize::Size2M)
                .unwrap()
                .backends
                .into_iter()
                .map(|b| (b.alias, b.size, b.node))
                .collect();
            let expected: Vec<_> = expected
                .into_iter()
                .map(|(a, s, n)| (a.to_string(), s, n))
                .collect();
            assert_eq!(got, expected);
        }
    }
}
