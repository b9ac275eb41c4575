//! The parts of a libvirt domain XML that decide a domain's memory backends, read with a real
//! XML parser (roxmltree): identity, memory sizes, `<memoryBacking>`, guest NUMA cells,
//! `<numatune>` and hugeprep's optional `<metadata>` element.

use super::error::{HookError, Result};
use crate::page_size::PageSize;

/// hugeprep's XML namespace for `<metadata>`.
pub const METADATA_NS: &str = "urn:hugeprep:libvirt:1";

/// A domain as the hook needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Domain {
    /// `<name>`.
    pub name: String,
    /// `<uuid>`, lower case.
    pub uuid: String,
    /// `id` of `<domain>`: the number of this start (present from `prepare begin` on).
    pub id: Option<u32>,
    /// `<memory>` in bytes.
    pub memory: u64,
    /// `<memoryBacking><source type=..>`.
    pub source_type: Option<String>,
    /// `<memoryBacking><access mode=..>`.
    pub access_mode: Option<String>,
    /// Whether `<memoryBacking><hugepages>` is present (libvirt then passes a directory).
    pub hugepages: bool,
    /// Whether `<memoryBacking><discard/>` is present.
    pub discard: bool,
    /// Guest NUMA cells, in document order.
    pub cells: Vec<Cell>,
    /// `<numatune>`.
    pub numatune: NumaTune,
    /// hugeprep's `<metadata>` element, when present.
    pub metadata: Option<Metadata>,
    /// `<label>` of the domain's `<seclabel model='dac'>`: the `USER:GROUP` its QEMU runs
    /// as (libvirt adds `+UID:+GID` before the `start begin` hook; a static per-domain
    /// label is in the definition itself).
    pub dac_label: Option<String>,
}

/// One `<cpu><numa><cell>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    /// `id`.
    pub id: u32,
    /// `memory` in bytes.
    pub memory: u64,
    /// `memAccess`, which overrides the domain's access mode for this cell.
    pub mem_access: Option<String>,
}

/// `<numatune>`: the host nodes the guest's memory is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NumaTune {
    /// `<memory nodeset=..>`: the whole guest.
    pub memory: Option<Vec<u32>>,
    /// `<memnode cellid=.. nodeset=..>`: per guest cell.
    pub memnodes: Vec<(u32, Vec<u32>)>,
}

/// `<metadata><hugeprep:memory xmlns:hugeprep="urn:hugeprep:libvirt:1" page_size="2M">
/// <hugeprep:cell id="0" node="0"/></hugeprep:memory></metadata>`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Metadata {
    /// `page_size`.
    pub page_size: Option<PageSize>,
    /// `node` of `<memory>`: the host node of every cell.
    pub node: Option<u32>,
    /// `<cell id node>`: the host node per guest cell.
    pub cells: Vec<(u32, u32)>,
}

fn bad(field: &str, message: impl Into<String>) -> HookError {
    HookError::Xml {
        field: field.to_string(),
        message: message.into(),
    }
}

/// Bytes in `value` of libvirt's `unit` (default KiB): `b`/`bytes`, `KB`/`MB`/`GB`/`TB`
/// (powers of 1000), `k`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` (powers of 1024).
pub fn scaled_bytes(field: &str, value: &str, unit: Option<&str>) -> Result<u64> {
    let n: u64 = value
        .trim()
        .parse()
        .map_err(|_| bad(field, format!("{value:?} is not a whole number")))?;
    let scale: u64 = match unit.unwrap_or("KiB") {
        "b" | "bytes" => 1,
        "KB" => 1000,
        "k" | "K" | "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "M" | "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "G" | "GiB" => 1 << 30,
        "TB" => 1_000_000_000_000,
        "T" | "TiB" => 1 << 40,
        other => return Err(bad(field, format!("unknown unit {other:?}"))),
    };
    n.checked_mul(scale).ok_or_else(|| {
        bad(
            field,
            format!("{value} {scale}-byte units overflow 64 bits"),
        )
    })
}

/// Parses a libvirt nodeset (`0-3,^2,5`) into sorted node numbers.
///
/// ```
/// use hugeprep::vmm::libvirt::parse_nodeset;
/// assert_eq!(parse_nodeset("0-3,^2").unwrap(), vec![0, 1, 3]);
/// ```
pub fn parse_nodeset(text: &str) -> Result<Vec<u32>> {
    let mut nodes = Vec::new();
    let mut excluded = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (list, target) = match part.strip_prefix('^') {
            Some(rest) => (rest, &mut excluded),
            None => (part, &mut nodes),
        };
        let parsed = crate::topology::parse_list(list).ok_or_else(|| {
            bad(
                "nodeset",
                format!(
                    "{text:?} is not a node list of numbers 0-{}",
                    crate::topology::MAX_LIST_ID
                ),
            )
        })?;
        for n in parsed {
            target.push(u32::try_from(n).map_err(|_| bad("nodeset", format!("{n} too large")))?);
        }
    }
    nodes.retain(|n| !excluded.contains(n));
    nodes.sort_unstable();
    nodes.dedup();
    if nodes.is_empty() {
        return Err(bad("nodeset", format!("{text:?} names no node")));
    }
    Ok(nodes)
}

fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children().find(|c| {
        c.is_element() && c.tag_name().name() == name && c.tag_name().namespace().is_none()
    })
}

fn children<'a, 'i: 'a>(
    node: roxmltree::Node<'a, 'i>,
    name: &'a str,
) -> impl Iterator<Item = roxmltree::Node<'a, 'i>> + 'a {
    node.children()
        .filter(move |c| c.is_element() && c.tag_name().name() == name)
}

fn attr_u32(node: roxmltree::Node, field: &str, name: &str) -> Result<Option<u32>> {
    node.attribute(name)
        .map(|v| {
            v.trim()
                .parse()
                .map_err(|_| bad(field, format!("{name}={v:?} is not a whole number")))
        })
        .transpose()
}

fn sized(node: roxmltree::Node, field: &str, value: &str) -> Result<u64> {
    scaled_bytes(field, value, node.attribute("unit"))
}

impl Domain {
    /// Parses a domain XML document (as libvirt passes it to a hook on stdin).
    pub fn parse(xml: &str) -> Result<Domain> {
        let doc = roxmltree::Document::parse(xml).map_err(|e| HookError::Malformed {
            message: e.to_string(),
        })?;
        let root = doc.root_element();
        if root.tag_name().name() != "domain" {
            return Err(bad(
                "domain",
                format!("root element is <{}>, not <domain>", root.tag_name().name()),
            ));
        }
        let text = |name: &str| child(root, name).and_then(|n| n.text()).map(str::trim);
        let mut d = Domain {
            name: text("name")
                .ok_or_else(|| bad("name", "missing"))?
                .to_string(),
            uuid: text("uuid")
                .ok_or_else(|| bad("uuid", "missing"))?
                .to_ascii_lowercase(),
            id: match root.attribute("id") {
                Some("-1") | None => None,
                Some(_) => attr_u32(root, "domain id", "id")?,
            },
            ..Domain::default()
        };
        check_uuid(&d.uuid)?;
        if let Some(m) = child(root, "memory") {
            d.memory = sized(m, "memory", m.text().unwrap_or(""))?;
        }
        if let Some(mb) = child(root, "memoryBacking") {
            d.source_type = child(mb, "source").and_then(|s| s.attribute("type").map(String::from));
            d.access_mode = child(mb, "access").and_then(|s| s.attribute("mode").map(String::from));
            d.hugepages = child(mb, "hugepages").is_some();
            d.discard = child(mb, "discard").is_some();
        }
        if let Some(numa) = child(root, "cpu").and_then(|c| child(c, "numa")) {
            for cell in children(numa, "cell") {
                let id = attr_u32(cell, "cell id", "id")?;
                let id = id.unwrap_or(d.cells.len() as u32);
                let memory = cell
                    .attribute("memory")
                    .ok_or_else(|| bad("cell memory", format!("cell {id} has no memory")))?;
                d.cells.push(Cell {
                    id,
                    memory: sized(cell, "cell memory", memory)?,
                    mem_access: cell.attribute("memAccess").map(String::from),
                });
            }
        }
        if let Some(tune) = child(root, "numatune") {
            if let Some(set) = child(tune, "memory").and_then(|m| m.attribute("nodeset")) {
                d.numatune.memory = Some(parse_nodeset(set)?);
            }
            for mn in children(tune, "memnode") {
                let cell = attr_u32(mn, "memnode cellid", "cellid")?
                    .ok_or_else(|| bad("memnode cellid", "missing"))?;
                let set = mn
                    .attribute("nodeset")
                    .ok_or_else(|| bad("memnode nodeset", format!("cell {cell}: missing")))?;
                d.numatune.memnodes.push((cell, parse_nodeset(set)?));
            }
        }
        d.dac_label = children(root, "seclabel")
            .filter(|s| s.attribute("model") == Some("dac"))
            .find_map(|s| child(s, "label").and_then(|l| l.text()))
            .map(|l| l.trim().to_string());
        if let Some(meta) = child(root, "metadata") {
            d.metadata = meta
                .children()
                .find(|c| c.is_element() && c.tag_name().namespace() == Some(METADATA_NS))
                .map(parse_metadata)
                .transpose()?;
        }
        Ok(d)
    }
}

/// Whether `s` is a UUID in its hyphenated 8-4-4-4-12 form, hex digits of either case (as
/// libvirt's domains and Placement's consumers are spelt; the only 36-byte form `uuid` parses).
pub fn is_uuid(s: &str) -> bool {
    s.len() == 36 && uuid::Uuid::try_parse(s).is_ok()
}

fn check_uuid(uuid: &str) -> Result<()> {
    if is_uuid(uuid) {
        Ok(())
    } else {
        Err(bad("uuid", format!("{uuid:?} is not a uuid")))
    }
}

fn parse_metadata(el: roxmltree::Node) -> Result<Metadata> {
    let page_size = el
        .attribute("page_size")
        .map(|p| {
            p.parse::<PageSize>()
                .map_err(|e| bad("hugeprep page_size", e.to_string()))
        })
        .transpose()?;
    let mut cells = Vec::new();
    for c in el
        .children()
        .filter(|c| c.is_element() && c.tag_name().name() == "cell")
    {
        let id = attr_u32(c, "hugeprep cell id", "id")?
            .ok_or_else(|| bad("hugeprep cell id", "missing"))?;
        let node = attr_u32(c, "hugeprep cell node", "node")?
            .ok_or_else(|| bad("hugeprep cell node", format!("cell {id}: missing")))?;
        cells.push((id, node));
    }
    Ok(Metadata {
        page_size,
        node: attr_u32(el, "hugeprep node", "node")?,
        cells,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_CELLS: &str = r#"<domain type='kvm' id='7'>
  <name>vm one</name>
  <uuid>0A1B2C3D-0000-4000-8000-000000000001</uuid>
  <metadata>
    <hp:memory xmlns:hp="urn:hugeprep:libvirt:1" page_size="2M"><hp:cell id="1" node="3"/></hp:memory>
  </metadata>
  <memory unit='MiB'>256</memory>
  <memoryBacking><source type='file'/><access mode='shared'/><discard/></memoryBacking>
  <numatune><memory mode='strict' nodeset='0-1'/><memnode cellid='0' mode='strict' nodeset='1'/></numatune>
  <cpu><numa><cell id='0' cpus='0' memory='131072' unit='KiB'/><cell id='1' cpus='1' memory='128' unit='MiB' memAccess='shared'/></numa></cpu>
  <seclabel type='dynamic' model='selinux' relabel='yes'><label>system_u:system_r:svirt_t:s0:c1,c2</label></seclabel>
  <seclabel type='dynamic' model='dac' relabel='yes'><label>+64055:+64055</label><imagelabel>+64055:+64055</imagelabel></seclabel>
</domain>"#;

    #[test]
    fn parses_a_two_cell_domain() {
        let d = Domain::parse(TWO_CELLS).unwrap();
        assert_eq!(d.name, "vm one");
        assert_eq!(d.uuid, "0a1b2c3d-0000-4000-8000-000000000001");
        assert_eq!(d.id, Some(7));
        assert_eq!(d.memory, 256 << 20);
        assert_eq!(d.source_type.as_deref(), Some("file"));
        assert_eq!(d.access_mode.as_deref(), Some("shared"));
        assert!(d.discard && !d.hugepages);
        assert_eq!(d.cells.len(), 2);
        assert_eq!(d.cells[0].memory, 128 << 20);
        assert_eq!(d.cells[1].mem_access.as_deref(), Some("shared"));
        assert_eq!(d.numatune.memory, Some(vec![0, 1]));
        assert_eq!(d.numatune.memnodes, vec![(0, vec![1])]);
        let m = d.metadata.unwrap();
        assert_eq!(m.page_size, Some(PageSize::Size2M));
        assert_eq!(m.cells, vec![(1, 3)]);
        assert_eq!(d.dac_label.as_deref(), Some("+64055:+64055"));
    }

    #[test]
    fn units_follow_libvirt() {
        assert_eq!(scaled_bytes("memory", "1", None).unwrap(), 1024);
        assert_eq!(
            scaled_bytes("memory", "1", Some("GB")).unwrap(),
            1_000_000_000
        );
        assert_eq!(scaled_bytes("memory", "2", Some("G")).unwrap(), 2 << 30);
        let e = scaled_bytes("memory", "1", Some("parsecs")).unwrap_err();
        assert!(e.to_string().contains("memory"), "{e}");
        assert!(scaled_bytes("memory", "-1", None).is_err());
        assert!(scaled_bytes("memory", &u64::MAX.to_string(), Some("T")).is_err());
    }

    #[test]
    fn nodesets() {
        assert_eq!(parse_nodeset("1").unwrap(), vec![1]);
        assert_eq!(parse_nodeset("0-3,^1-2").unwrap(), vec![0, 3]);
        assert!(parse_nodeset("^0").is_err());
        assert!(parse_nodeset("x").is_err());
        // A hostile range is refused, not expanded into 4 billion entries.
        let e = parse_nodeset("0-4000000000").unwrap_err().to_string();
        assert!(e.contains("nodeset") && e.contains("0-8191"), "{e}");
    }

    #[test]
    fn malformed_and_incomplete_documents_name_the_problem() {
        let e = Domain::parse("<domain><name>a</name").unwrap_err();
        assert!(matches!(e, HookError::Malformed { .. }), "{e}");
        let e = Domain::parse("<domain><name>a</name></domain>").unwrap_err();
        assert!(e.to_string().contains("uuid"), "{e}");
        let e = Domain::parse("<network/>").unwrap_err();
        assert!(e.to_string().contains("<network>"), "{e}");
        let e =
            Domain::parse("<domain><name>a</name><uuid>not-a-uuid</uuid></domain>").unwrap_err();
        assert!(e.to_string().contains("not a uuid"), "{e}");
    }
}
