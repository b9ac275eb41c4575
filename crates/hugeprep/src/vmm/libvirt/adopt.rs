//! `hugeprep libvirt-adopt`: rewriting a domain that asks for `<memoryBacking><hugepages>`
//! (libvirt then hands QEMU a directory, in which a pre-placed lease is never used) into
//! file-backed shared memory that the hook serves. Pure text in, text out: the domain is
//! read with roxmltree and only the byte ranges of `<memoryBacking>` and of hugeprep's
//! `<metadata>` element change, so everything else (comments, order, passwords that
//! `--security-info` put in) is defined again exactly as libvirt gave it.
//!
//! What is kept: the page size (as hugeprep's `<metadata>` `page_size`, which the hook checks
//! against the mount of `memory_backing_dir`), `<numatune>` (the hook binds each cell's lease
//! to its host node from it) and the other `<memoryBacking>` children (`<nosharepages/>`,
//! `<locked/>`, `<allocation>`, `<discard/>`). What is refused, with the reason: memfd sources,
//! cells with private memory access, cells on different page sizes, page sizes other than the
//! mount's, and anything the hook would then refuse to serve.

use super::domain::{scaled_bytes, Domain, METADATA_NS};
use super::plan;
use crate::page_size::PageSize;

/// Why a domain cannot be adopted. Each message names the element and what to change.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// The document is not XML.
    #[error("domain XML is malformed: {0}")]
    Malformed(String),
    /// The domain does not ask for hugepages (and is not file-backed already).
    #[error("<memoryBacking> has no <hugepages>: the domain uses ordinary memory, which hugeprep does not serve (add <hugepages/> first if it should)")]
    NoHugepages,
    /// A memfd (or other non-file) memory source.
    #[error("<memoryBacking><source type='{0}'/>: QEMU allocates that memory itself ({0} backend), hugeprep can only hand over files; remove the source element (or ask for type='file') to adopt")]
    Source(String),
    /// A guest cell maps its memory private.
    #[error("<cpu><numa><cell id='{cell}' memAccess='{mode}'>: a private mapping takes new pages instead of the lease; set memAccess='shared' or remove it")]
    PrivateCell {
        /// The cell.
        cell: u32,
        /// Its `memAccess`.
        mode: String,
    },
    /// A `<page>` size that is not a hugepage size hugeprep serves.
    #[error(
        "<hugepages><page size='{size}' unit='{unit}'>: not a page size hugeprep serves (2M, 1G)"
    )]
    PageSize {
        /// `size`.
        size: String,
        /// `unit` (default KiB).
        unit: String,
    },
    /// Cells on different page sizes: hugeprep's metadata holds one page size per domain.
    #[error("<hugepages> puts cells on different page sizes ({0}): hugeprep serves one page size per domain")]
    MixedPageSizes(String),
    /// The page size is not the one of the mount `memory_backing_dir` is on.
    #[error("the domain's page size is {domain} but memory_backing_dir {dir} is on a {mount} hugetlbfs mount: point memory_backing_dir at a {domain} mount the daemon serves")]
    MountPageSize {
        /// The domain's page size.
        domain: PageSize,
        /// The mount's.
        mount: PageSize,
        /// `memory_backing_dir`.
        dir: String,
    },
    /// hugeprep's metadata already names another page size.
    #[error("hugeprep <metadata> says page_size {metadata} but <hugepages> asks for {hugepages}")]
    MetadataPageSize {
        /// The metadata's.
        metadata: PageSize,
        /// `<hugepages>`'s.
        hugepages: PageSize,
    },
    /// The rewritten domain would not be served by the hook (sizes, cells, ...).
    #[error("the rewritten domain would not start through the hook: {0}")]
    Hook(Box<super::HookError>),
}

impl From<super::HookError> for AdoptError {
    fn from(e: super::HookError) -> Self {
        AdoptError::Hook(Box::new(e))
    }
}

/// What [`adopt`] made of a domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adoption {
    /// The domain XML to define instead, and the page size it keeps.
    Rewritten {
        /// The new document.
        xml: String,
        /// The page size of its memory.
        page_size: PageSize,
    },
    /// Already file-backed shared memory without `<hugepages>`: nothing to change.
    AlreadyFileBacked,
}

fn element<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children().find(|c| {
        c.is_element() && c.tag_name().name() == name && c.tag_name().namespace().is_none()
    })
}

/// The page size of every guest cell (or of the whole guest without cells): a `<page>`
/// whose `nodeset` names the cell, else one without `nodeset`, else the host's default.
fn page_size_of(
    hugepages: roxmltree::Node,
    cells: &[u32],
    default_page: PageSize,
) -> Result<PageSize, AdoptError> {
    let mut pages: Vec<(Option<Vec<u32>>, PageSize)> = Vec::new();
    for page in hugepages
        .children()
        .filter(|c| c.is_element() && c.tag_name().name() == "page")
    {
        let size = page.attribute("size").unwrap_or("");
        let unit = page.attribute("unit").unwrap_or("KiB");
        let refuse = || AdoptError::PageSize {
            size: size.to_string(),
            unit: unit.to_string(),
        };
        let bytes = scaled_bytes("page size", size, Some(unit)).map_err(|_| refuse())?;
        let ps = PageSize::from_bytes(bytes).ok_or_else(refuse)?;
        let nodeset = page
            .attribute("nodeset")
            .map(super::parse_nodeset)
            .transpose()?;
        pages.push((nodeset, ps));
    }
    let for_cell = |cell: Option<u32>| {
        cell.and_then(|c| {
            pages
                .iter()
                .find(|(set, _)| set.as_ref().is_some_and(|s| s.contains(&c)))
        })
        .or_else(|| pages.iter().find(|(set, _)| set.is_none()))
        .map_or(default_page, |(_, ps)| *ps)
    };
    let mut sizes: Vec<PageSize> = if cells.is_empty() {
        vec![for_cell(None)]
    } else {
        cells.iter().map(|&c| for_cell(Some(c))).collect()
    };
    sizes.sort();
    sizes.dedup();
    match sizes.as_slice() {
        [one] => Ok(*one),
        many => Err(AdoptError::MixedPageSizes(
            many.iter().map(|p| p.name()).collect::<Vec<_>>().join(", "),
        )),
    }
}

/// The whitespace before `node` in the document (its indentation), or `fallback`.
fn indent_before(node: roxmltree::Node, fallback: &str) -> String {
    node.prev_sibling()
        .filter(|p| p.is_text())
        .and_then(|p| p.text())
        .filter(|t| t.trim().is_empty())
        .map_or_else(|| fallback.to_string(), str::to_string)
}

/// Rewrites `xml` (a `virsh dumpxml --inactive --security-info` document) so that the hook
/// serves its memory from a mount of `mount_page_size`; `default_page` is the host's default
/// hugepage size, which libvirt uses for a `<hugepages/>` without `<page>`.
/// `memory_backing_dir` only words the refusal.
pub fn adopt(
    xml: &str,
    mount_page_size: PageSize,
    default_page: PageSize,
    memory_backing_dir: &str,
) -> Result<Adoption, AdoptError> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| AdoptError::Malformed(e.to_string()))?;
    let root = doc.root_element();
    let parsed = Domain::parse(xml)?;
    let Some(mb) = element(root, "memoryBacking") else {
        return Err(AdoptError::NoHugepages);
    };
    let Some(hugepages) = element(mb, "hugepages") else {
        return match plan::opts_in(&parsed) {
            Ok(()) => Ok(Adoption::AlreadyFileBacked),
            Err(_) => Err(AdoptError::NoHugepages),
        };
    };
    if let Some(t) = element(mb, "source").and_then(|s| s.attribute("type")) {
        if t != "file" && t != "anonymous" {
            return Err(AdoptError::Source(t.to_string()));
        }
    }
    if let Some(c) = parsed
        .cells
        .iter()
        .find(|c| c.mem_access.as_deref().is_some_and(|m| m != "shared"))
    {
        return Err(AdoptError::PrivateCell {
            cell: c.id,
            mode: c.mem_access.clone().unwrap_or_default(),
        });
    }
    let cells: Vec<u32> = parsed.cells.iter().map(|c| c.id).collect();
    let page_size = page_size_of(hugepages, &cells, default_page)?;
    if page_size != mount_page_size {
        return Err(AdoptError::MountPageSize {
            domain: page_size,
            mount: mount_page_size,
            dir: memory_backing_dir.to_string(),
        });
    }
    if let Some(metadata) = parsed.metadata.as_ref().and_then(|m| m.page_size) {
        if metadata != page_size {
            return Err(AdoptError::MetadataPageSize {
                metadata,
                hugepages: page_size,
            });
        }
    }

    // The new <memoryBacking>: its children in their order, <hugepages> gone, the source a
    // file and the access shared (where <hugepages> stood when the domain had none).
    let inner_indent = mb
        .children()
        .find(|c| c.is_element())
        .map_or_else(|| "\n    ".to_string(), |c| indent_before(c, "\n    "));
    let closing_indent = mb
        .last_child()
        .filter(|c| c.is_text())
        .and_then(|c| c.text())
        .filter(|t| t.trim().is_empty())
        .unwrap_or("\n  ");
    let has = |name| element(mb, name).is_some();
    let mut parts: Vec<String> = Vec::new();
    for child in mb.children().filter(|c| c.is_element()) {
        match child.tag_name().name() {
            "hugepages" => {
                if !has("source") {
                    parts.push("<source type='file'/>".into());
                }
                if !has("access") {
                    parts.push("<access mode='shared'/>".into());
                }
            }
            "source" => parts.push("<source type='file'/>".into()),
            "access" => parts.push("<access mode='shared'/>".into()),
            _ => parts.push(xml[child.range()].to_string()),
        }
    }
    let mut new_mb = String::from("<memoryBacking>");
    for p in &parts {
        new_mb.push_str(&inner_indent);
        new_mb.push_str(p);
    }
    new_mb.push_str(closing_indent);
    new_mb.push_str("</memoryBacking>");

    // Edits as (byte range, replacement), applied from the end so ranges stay valid.
    let mut edits: Vec<(std::ops::Range<usize>, String)> = vec![(mb.range(), new_mb)];
    if let Some(edit) = metadata_edit(xml, root, page_size) {
        edits.push(edit);
    }
    edits.sort_by_key(|(r, _)| std::cmp::Reverse(r.start));
    let mut out = xml.to_string();
    for (range, text) in edits {
        out.replace_range(range, &text);
    }

    // What the hook will do with it: the same checks it makes at `start begin`.
    let adopted = Domain::parse(&out)?;
    if plan::opts_in(&adopted).is_err() {
        return Err(super::HookError::Plan("the rewritten domain does not opt in".into()).into());
    }
    plan::plan(&adopted, mount_page_size)?;
    Ok(Adoption::Rewritten {
        xml: out,
        page_size,
    })
}

/// Where hugeprep's `<metadata>` element with `page_size` goes: nothing when one says it
/// already; the attribute added to one without it; a new element at the end of an
/// existing `<metadata>`; or a new `<metadata>` after the domain's identity elements.
fn metadata_edit(
    xml: &str,
    root: roxmltree::Node,
    page_size: PageSize,
) -> Option<(std::ops::Range<usize>, String)> {
    let element_text = format!(
        "<hugeprep:memory xmlns:hugeprep='{METADATA_NS}' page_size='{}'/>",
        page_size.name()
    );
    if let Some(meta) = element(root, "metadata") {
        if let Some(ours) = meta
            .children()
            .find(|c| c.is_element() && c.tag_name().namespace() == Some(METADATA_NS))
        {
            if ours.attribute("page_size").is_some() {
                return None;
            }
            // After the qualified name of the start tag.
            let start = ours.range().start;
            let name_end = xml[start + 1..]
                .find(|c: char| c.is_whitespace() || c == '/' || c == '>')
                .map(|i| start + 1 + i)?;
            return Some((
                name_end..name_end,
                format!(" page_size='{}'", page_size.name()),
            ));
        }
        let range = meta.range();
        let text = &xml[range.clone()];
        let indent = indent_before(meta, "\n  ");
        if text.ends_with("/>") {
            return Some((
                range,
                format!("<metadata>{indent}  {element_text}{indent}</metadata>"),
            ));
        }
        let close = range.end - "</metadata>".len();
        // Before the whitespace that precedes `</metadata>`, so the closing tag keeps its line.
        let at = close - (xml[..close].len() - xml[..close].trim_end().len());
        return Some((at..at, format!("{indent}  {element_text}")));
    }
    let after = root.children().rfind(|c| {
        c.is_element()
            && matches!(
                c.tag_name().name(),
                "name" | "uuid" | "genid" | "title" | "description"
            )
    })?;
    let indent = indent_before(after, "\n  ");
    let at = after.range().end;
    Some((
        at..at,
        format!("{indent}<metadata>{indent}  {element_text}{indent}</metadata>"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_CELLS: &str = "<domain type='kvm'>
  <name>vm</name>
  <uuid>5e1f0000-0000-4000-8000-000000000001</uuid>
  <memory unit='KiB'>65536</memory>
  <memoryBacking>
    <hugepages>
      <page size='2048' unit='KiB' nodeset='0-1'/>
    </hugepages>
    <locked/>
  </memoryBacking>
  <numatune>
    <memnode cellid='0' mode='strict' nodeset='0'/>
    <memnode cellid='1' mode='strict' nodeset='0'/>
  </numatune>
  <cpu mode='host-passthrough'>
    <numa>
      <cell id='0' cpus='0' memory='32768' unit='KiB'/>
      <cell id='1' cpus='1' memory='32768' unit='KiB'/>
    </numa>
  </cpu>
</domain>
";

    fn rewritten(xml: &str) -> String {
        match adopt(
            xml,
            PageSize::Size2M,
            PageSize::Size2M,
            "/dev/hugepages/libvirt-backing",
        )
        .unwrap()
        {
            Adoption::Rewritten { xml, .. } => xml,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hugepages_become_shared_files_and_the_rest_stays() {
        let out = rewritten(TWO_CELLS);
        assert!(out.contains(
            "  <memoryBacking>\n    <source type='file'/>\n    <access mode='shared'/>\n    <locked/>\n  </memoryBacking>"
        ), "{out}");
        assert!(!out.contains("hugepages"), "{out}");
        assert!(out.contains("<memnode cellid='1' mode='strict' nodeset='0'/>"));
        assert!(out.contains(
            "<uuid>5e1f0000-0000-4000-8000-000000000001</uuid>\n  <metadata>\n    <hugeprep:memory xmlns:hugeprep='urn:hugeprep:libvirt:1' page_size='2M'/>\n  </metadata>"
        ), "{out}");
        let d = Domain::parse(&out).unwrap();
        assert_eq!(d.metadata.unwrap().page_size, Some(PageSize::Size2M));
        // Adopting again changes nothing.
        assert_eq!(
            adopt(&out, PageSize::Size2M, PageSize::Size2M, "x").unwrap(),
            Adoption::AlreadyFileBacked
        );
    }

    #[test]
    fn existing_metadata_gets_the_element_or_the_attribute() {
        let with_meta = TWO_CELLS.replace(
            "</uuid>",
            "</uuid>\n  <metadata>\n    <other:x xmlns:other='urn:x'/>\n  </metadata>",
        );
        let out = rewritten(&with_meta);
        assert!(out.contains("<other:x xmlns:other='urn:x'/>\n    <hugeprep:memory xmlns:hugeprep='urn:hugeprep:libvirt:1' page_size='2M'/>\n  </metadata>"), "{out}");
        let ours = TWO_CELLS.replace(
            "</uuid>",
            "</uuid>\n  <metadata><hp:memory xmlns:hp='urn:hugeprep:libvirt:1' node='0'/></metadata>",
        );
        let out = rewritten(&ours);
        assert!(out.contains("<hp:memory page_size='2M' xmlns:hp="), "{out}");
    }

    #[test]
    fn what_cannot_be_converted_is_refused_with_the_reason() {
        let refuse = |xml: &str, mount: PageSize| {
            adopt(xml, mount, PageSize::Size2M, "/mnt/huge2m/libvirt")
                .unwrap_err()
                .to_string()
        };
        let memfd = TWO_CELLS.replace("<locked/>", "<source type='memfd'/>");
        assert!(refuse(&memfd, PageSize::Size2M).contains("source type='memfd'"));
        let private = TWO_CELLS.replace("cpus='1' memory", "cpus='1' memAccess='private' memory");
        assert!(refuse(&private, PageSize::Size2M).contains("cell id='1' memAccess='private'"));
        let gig = TWO_CELLS.replace("size='2048' unit='KiB'", "size='1' unit='G'");
        let err = refuse(&gig, PageSize::Size2M);
        assert!(
            err.contains("page size is 1G but memory_backing_dir /mnt/huge2m/libvirt is on a 2M"),
            "{err}"
        );
        let mixed = TWO_CELLS.replace(
            "nodeset='0-1'/>",
            "nodeset='0'/><page size='1' unit='GiB' nodeset='1'/>",
        );
        assert!(refuse(&mixed, PageSize::Size2M).contains("different page sizes (2M, 1G)"));
        let odd = TWO_CELLS.replace("size='2048'", "size='64'");
        assert!(refuse(&odd, PageSize::Size2M).contains("page size='64' unit='KiB'"));
        let plain = TWO_CELLS.replace(
            "<hugepages>\n      <page size='2048' unit='KiB' nodeset='0-1'/>\n    </hugepages>",
            "",
        );
        assert!(refuse(&plain, PageSize::Size2M).contains("has no <hugepages>"));
        // A cell of 3 MiB is no whole number of 2M pages: the hook would refuse it.
        let uneven = TWO_CELLS.replace(
            "memory='32768' unit='KiB'/>\n      <cell id='1'",
            "memory='3072' unit='KiB'/>\n      <cell id='1'",
        );
        assert!(refuse(&uneven, PageSize::Size2M).contains("would not start through the hook"));
    }
}
