//! Free hugepages asked for many times a second: the counters [`pool::available`] reads,
//! kept open and re-read at offset 0, so that one reading costs three `pread`s and no path
//! walk through sysfs. A lease asks on every decision, and so does the pool's worker.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::pool::{self, PoolError, Result, Scope};
use crate::page_size::PageSize;

/// One counter file, open.
#[derive(Debug)]
struct Counter {
    scope: Scope,
    path: PathBuf,
    file: File,
}

impl Counter {
    fn open(scope: Scope, page_size: PageSize, name: &str) -> Result<Counter> {
        let path = scope.dir(page_size).join(name);
        let file = File::open(&path).map_err(|source| PoolError::Read {
            scope,
            page_size,
            path: path.clone(),
            source,
        })?;
        Ok(Counter { scope, path, file })
    }

    fn read(&self, page_size: PageSize) -> Result<u64> {
        let mut buf = [0u8; 32];
        let n = self
            .file
            .read_at(&mut buf, 0)
            .map_err(|source| PoolError::Read {
                scope: self.scope,
                page_size,
                path: self.path.clone(),
                source,
            })?;
        let text = String::from_utf8_lossy(&buf[..n]);
        text.trim().parse().map_err(|_| PoolError::Parse {
            path: self.path.clone(),
            text: text.trim().to_string(),
        })
    }
}

/// Free, unreserved pages of one page size that a mapping bound to a node (or anywhere) can
/// get, the same figure as [`pool::available`], from counters kept open.
///
/// ```
/// use hugeprep::hugetlb::free::FreePages;
/// use hugeprep::PageSize;
/// let free = FreePages::open(Some(0), PageSize::Size2M).unwrap();
/// let pool = hugeprep::hugetlb::pool::read(hugeprep::hugetlb::Scope::Node(0), PageSize::Size2M);
/// assert!(free.pages().unwrap() <= pool.unwrap().total);
/// ```
#[derive(Debug)]
pub struct FreePages {
    page_size: PageSize,
    system_free: Counter,
    system_reserved: Counter,
    node_free: Option<Counter>,
}

impl FreePages {
    /// Opens the counters of `node`'s pool (the machine's for `None`) of `page_size`. A node
    /// or page size the kernel does not have is the error [`pool::read`] gives.
    pub fn open(node: Option<u32>, page_size: PageSize) -> Result<FreePages> {
        // One full reading first: it names a missing node or page size properly.
        pool::available(node, page_size)?;
        Ok(FreePages {
            page_size,
            system_free: Counter::open(Scope::System, page_size, "free_hugepages")?,
            system_reserved: Counter::open(Scope::System, page_size, "resv_hugepages")?,
            node_free: node
                .map(|n| Counter::open(Scope::Node(n), page_size, "free_hugepages"))
                .transpose()?,
        })
    }

    /// The free, unreserved pages now.
    pub fn pages(&self) -> Result<u64> {
        let (system, node_free) = self.parts()?;
        Ok(pool::node_capped(system, node_free))
    }

    /// What [`FreePages::pages`] is made of: the machine's free unreserved pages, and the
    /// node's free pages (reservations are machine-wide; `None` for no node).
    pub fn parts(&self) -> Result<(u64, Option<u64>)> {
        let ps = self.page_size;
        let system = self
            .system_free
            .read(ps)?
            .saturating_sub(self.system_reserved.read(ps)?);
        let node_free = self.node_free.as_ref().map(|c| c.read(ps)).transpose()?;
        Ok((system, node_free))
    }
}
