//! Holding the kernel's free pages back from the pool while a start or a storm is timed.

use super::Result;
use hugeprep::hugetlb::BackingFile;
use hugeprep::page_size::PageSize;
use hugeprep::sys::mmap::MmapRegion;

/// Maps (without faulting or zeroing) a file of `pages` pages, so that the kernel's free
/// pages it reserves cannot be taken by a refill while a start or a storm is timed.
pub(super) struct Holdback {
    _region: Option<MmapRegion>,
    file: Option<BackingFile>,
}

impl Holdback {
    pub(super) fn reserve(dir: &std::path::Path, pages: u64, ps: PageSize) -> Result<Holdback> {
        if pages == 0 {
            return Ok(Holdback {
                _region: None,
                file: None,
            });
        }
        let path = dir.join("holdback");
        let _ = std::fs::remove_file(&path);
        let file = BackingFile::create(&path, pages * ps.bytes(), ps, None)?;
        match file.map() {
            Ok(region) => Ok(Holdback {
                _region: Some(region),
                file: Some(file),
            }),
            Err(e) => {
                let _ = file.remove();
                Err(e.into())
            }
        }
    }
}

impl Drop for Holdback {
    fn drop(&mut self) {
        self._region = None;
        if let Some(file) = self.file.take() {
            let _ = file.remove();
        }
    }
}
