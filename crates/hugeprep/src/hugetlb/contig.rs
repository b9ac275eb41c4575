//! Why the kernel could not assemble gigantic (1 GiB) pages at run time.
//!
//! A 1 GiB page is one naturally aligned GiB of physical memory. Without CMA the kernel gets
//! one at run time only from `alloc_contig_pages`, which tries each aligned range of a zone
//! in turn and needs every page of the range online, in that one zone, and movable (free, or
//! on an LRU list so it can be migrated away). A slab page, a page table, a reserved page or a
//! smaller hugetlb page anywhere in the range rules it out (Linux 6.18; later kernels migrate
//! smaller hugetlb pages). After a few hours of builds such pages sit in every GiB of a
//! small host, and no compaction moves them: only pages reserved at boot
//! (`hugepagesz=1G hugepages=N`), or CMA set aside at boot (`hugetlb_cma=`), are then left.
//!
//! [`Census::take`] counts, for every aligned range, the pages that rule it out, from
//! `/proc/kpageflags` (root only) and the memory blocks in `/sys/devices/system/memory`, so
//! that a shortfall can be reported with its cause.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::page_size::PageSize;

const MEMORY_BLOCKS: &str = "/sys/devices/system/memory";
const KPAGEFLAGS: &str = "/proc/kpageflags";
const SMALL_PAGE: u64 = 4096;

// Bits of /proc/kpageflags (include/uapi/linux/kernel-page-flags.h).
const KPF_SLAB: u32 = 7;
const KPF_HUGE: u32 = 17;
const KPF_NOPAGE: u32 = 20;
const KPF_PGTABLE: u32 = 26;
const KPF_RESERVED: u32 = 32;

/// Reading the kernel's view of memory failed.
#[derive(Debug, thiserror::Error)]
pub enum ContigError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A file held something other than expected.
    #[error("{path}: cannot parse {text:?}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it held.
        text: String,
    },
}

fn read_text(path: &Path) -> Result<String, ContigError> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| ContigError::Read {
            path: path.to_path_buf(),
            source,
        })
}

/// One naturally aligned range of physical memory the size of the page, as the kernel's
/// run-time allocator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeCensus {
    /// The range's first physical address.
    pub start: u64,
    /// The zone every page of the range is in; `None` when part of it is a hole, offline, or
    /// in another zone (the allocator skips such a range).
    pub zone: Option<String>,
    /// Slab pages (kernel objects: inodes, dentries, page-cache tree nodes, ...).
    pub slab: u64,
    /// Page-table pages.
    pub page_tables: u64,
    /// Reserved pages (the kernel's own memory, firmware tables).
    pub reserved: u64,
    /// Pages of hugetlb pages of another size (2 MiB pools).
    pub hugetlb: u64,
}

impl RangeCensus {
    /// Pages in the range that the allocator can neither use nor move.
    pub fn unmovable(&self) -> u64 {
        self.slab + self.page_tables + self.reserved + self.hugetlb
    }

    /// Whether the allocator could take this range now.
    pub fn usable(&self) -> bool {
        self.zone.is_some() && self.unmovable() == 0
    }

    fn what(&self) -> String {
        let mut parts = Vec::new();
        for (n, name) in [
            (self.slab, "slab"),
            (self.page_tables, "page-table"),
            (self.reserved, "reserved"),
            (self.hugetlb, "2M-hugetlb"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {name}"));
            }
        }
        format!(
            "{} pages at {} GiB",
            parts.join(", "),
            self.start as f64 / (1u64 << 30) as f64
        )
    }
}

/// Every aligned range of one page size, and what the kernel offers besides.
#[derive(Debug, Clone)]
pub struct Census {
    /// The page size counted.
    pub page_size: PageSize,
    /// The ranges of memory that is present (holes left out).
    pub ranges: Vec<RangeCensus>,
    /// Whether the kernel has CMA (`CmaTotal` in /proc/meminfo); without it `hugetlb_cma=`
    /// on the command line does nothing.
    pub cma: bool,
}

impl Census {
    /// Counts every aligned range of `page_size`. Needs root (`/proc/kpageflags`).
    pub fn take(page_size: PageSize) -> Result<Census, ContigError> {
        let blocks = MemoryBlocks::read(Path::new(MEMORY_BLOCKS))?;
        let flags_path = Path::new(KPAGEFLAGS);
        let flags = File::open(flags_path).map_err(|source| ContigError::Read {
            path: flags_path.to_path_buf(),
            source,
        })?;
        let range_bytes = page_size.bytes();
        let last = blocks.end();
        let mut ranges = Vec::new();
        let mut start = 0;
        while start < last {
            if let Some(zone) = blocks.zone_of(start, range_bytes) {
                let mut census = count_range(&flags, start, range_bytes)?;
                census.zone = zone;
                ranges.push(census);
            }
            start += range_bytes;
        }
        let meminfo = read_text(Path::new("/proc/meminfo"))?;
        Ok(Census {
            page_size,
            ranges,
            cma: meminfo.lines().any(|l| l.starts_with("CmaTotal:")),
        })
    }

    /// Why no page could be assembled: how many ranges each kind of page rules out, the
    /// cleanest range, and whether CMA could help. When some range is usable now the
    /// shortfall was a race or memory use, and it says so.
    pub fn cause(&self) -> String {
        let ps = self.page_size;
        let usable = self.ranges.iter().filter(|r| r.usable()).count();
        let in_zone: Vec<&RangeCensus> = self.ranges.iter().filter(|r| r.zone.is_some()).collect();
        let mut text = if usable > 0 {
            format!(
                "{usable} of the {} aligned {ps} ranges are free of unmovable pages now",
                in_zone.len()
            )
        } else {
            let count = |f: fn(&RangeCensus) -> u64| in_zone.iter().filter(|r| f(r) > 0).count();
            let mut text = format!(
                "none of the {} aligned {ps} ranges within one zone is free of pages the kernel \
                 cannot move ({} hold slab pages, {} page tables, {} reserved pages, {} smaller \
                 hugetlb pages)",
                in_zone.len(),
                count(|r| r.slab),
                count(|r| r.page_tables),
                count(|r| r.reserved),
                count(|r| r.hugetlb),
            );
            if let Some(best) = in_zone.iter().min_by_key(|r| r.unmovable()) {
                text.push_str(&format!("; the cleanest holds {}", best.what()));
            }
            text
        };
        text.push_str(if self.cma {
            "; the kernel has CMA: hugetlb_cma= on its command line sets memory aside for them"
        } else {
            "; the kernel has no CMA (CONFIG_CMA), so hugetlb_cma= cannot set memory aside"
        });
        text
    }

    /// [`Census::cause`] and what gets pages instead.
    pub fn explain(&self) -> String {
        format!(
            "{}; reserve them at boot (hugepagesz={} hugepages=N) or right after boot, before \
             builds fragment memory (scripts/gigantic-pages take N)",
            self.cause(),
            self.page_size
        )
    }
}

/// Counts the pages of one range that rule it out.
fn count_range(flags: &File, start: u64, bytes: u64) -> Result<RangeCensus, ContigError> {
    let mut census = RangeCensus {
        start,
        zone: None,
        slab: 0,
        page_tables: 0,
        reserved: 0,
        hugetlb: 0,
    };
    const CHUNK: u64 = 1 << 16; // pages per read: 512 KiB of flags
    let first = start / SMALL_PAGE;
    let pages = bytes / SMALL_PAGE;
    let mut buf = vec![0u8; (CHUNK * 8) as usize];
    let mut done = 0;
    while done < pages {
        let n = CHUNK.min(pages - done);
        let buf = &mut buf[..(n * 8) as usize];
        flags
            .read_exact_at(buf, (first + done) * 8)
            .map_err(|source| ContigError::Read {
                path: PathBuf::from(KPAGEFLAGS),
                source,
            })?;
        for word in buf.chunks_exact(8) {
            let mut b = [0u8; 8];
            b.copy_from_slice(word);
            let f = u64::from_ne_bytes(b);
            let bit = |k: u32| f >> k & 1 == 1;
            if bit(KPF_NOPAGE) {
                continue;
            }
            if bit(KPF_SLAB) {
                census.slab += 1;
            } else if bit(KPF_PGTABLE) {
                census.page_tables += 1;
            } else if bit(KPF_RESERVED) {
                census.reserved += 1;
            } else if bit(KPF_HUGE) {
                census.hugetlb += 1;
            }
        }
        done += n;
    }
    Ok(census)
}

/// The memory blocks of `/sys/devices/system/memory`: which are online, in which zone.
struct MemoryBlocks {
    block_bytes: u64,
    /// Per block number: `None` absent or offline; `Some(zone)` online (zone "none" when the
    /// block spans zones).
    zones: Vec<Option<String>>,
}

impl MemoryBlocks {
    fn read(root: &Path) -> Result<MemoryBlocks, ContigError> {
        let size_path = root.join("block_size_bytes");
        let text = read_text(&size_path)?;
        let block_bytes = u64::from_str_radix(&text, 16)
            .ok()
            .filter(|b| *b > 0)
            .ok_or_else(|| ContigError::Parse {
                path: size_path.clone(),
                text,
            })?;
        let mut zones = Vec::new();
        let entries = fs::read_dir(root).map_err(|source| ContigError::Read {
            path: root.to_path_buf(),
            source,
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(n) = name
                .to_str()
                .and_then(|s| s.strip_prefix("memory"))
                .and_then(|s| s.parse::<usize>().ok())
            else {
                continue;
            };
            let dir = entry.path();
            let zone = if read_text(&dir.join("state"))? == "online" {
                // An online block's valid_zones names the zone it is in ("none": several).
                Some(read_text(&dir.join("valid_zones"))?)
            } else {
                None
            };
            if zones.len() <= n {
                zones.resize(n + 1, None);
            }
            zones[n] = zone;
        }
        Ok(MemoryBlocks { block_bytes, zones })
    }

    fn end(&self) -> u64 {
        self.zones.len() as u64 * self.block_bytes
    }

    /// `None` when no block of the range is online (a hole: left out of the census);
    /// `Some(None)` when part of it is missing, offline or spans zones; `Some(Some(zone))`
    /// when all of it is online in one zone.
    fn zone_of(&self, start: u64, bytes: u64) -> Option<Option<String>> {
        let first = start / self.block_bytes;
        let last = (start + bytes - 1) / self.block_bytes;
        let zones: Vec<Option<&String>> = (first..=last)
            .map(|b| self.zones.get(b as usize).and_then(|z| z.as_ref()))
            .collect();
        if zones.iter().all(|z| z.is_none()) {
            return None;
        }
        let one = zones[0]?;
        let same = zones.iter().all(|z| *z == Some(one)) && !one.contains(' ') && one != "none";
        Some(same.then(|| one.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(zones: &[Option<&str>]) -> MemoryBlocks {
        MemoryBlocks {
            block_bytes: 128 << 20,
            zones: zones.iter().map(|z| z.map(str::to_string)).collect(),
        }
    }

    #[test]
    fn a_range_is_in_a_zone_only_when_all_its_blocks_are_online_there() {
        let gib = 1 << 30;
        let mut z = vec![Some("Normal"); 16];
        z[9] = None; // one offline block in the second GiB
        let b = blocks(&z);
        assert_eq!(b.zone_of(0, gib), Some(Some("Normal".to_string())));
        assert_eq!(b.zone_of(gib, gib), Some(None));
        let hole = blocks(&[None; 8]);
        assert_eq!(hole.zone_of(0, gib), None);
        let mixed = blocks(&[Some("none"), Some("DMA32")]);
        assert_eq!(mixed.zone_of(0, 256 << 20), Some(None));
    }

    #[test]
    fn the_explanation_names_the_cleanest_range_and_the_missing_cma() {
        let r = |start: u64, slab, page_tables| RangeCensus {
            start,
            zone: Some("Normal".into()),
            slab,
            page_tables,
            reserved: 0,
            hugetlb: 0,
        };
        let c = Census {
            page_size: PageSize::Size1G,
            ranges: vec![r(4 << 30, 5000, 200), r(12 << 30, 12, 4)],
            cma: false,
        };
        let text = c.explain();
        assert!(text.contains("none of the 2 aligned 1G ranges"), "{text}");
        assert!(text.contains("2 hold slab pages, 2 page tables"), "{text}");
        assert!(
            text.contains("12 slab, 4 page-table pages at 12 GiB"),
            "{text}"
        );
        assert!(text.contains("no CMA"), "{text}");
    }
}
