//! Shared helpers for the hugetlbfs tests: a hugetlbfs of our own in a temporary directory,
//! a reservation of pages held for the whole test, and pool readings.
#![allow(dead_code)]

use std::path::Path;

use hugeprep::hugetlb::pool::{self, Scope};
use hugeprep::hugetlb::{MountOptions, OwnedMount};
use hugeprep::testing::HugepageReservation;
use hugeprep::PageSize;

/// Everything a hugepage test holds: the reservation (and with it the machine-wide test
/// lock) and a hugetlbfs mounted for this test. Field order matters: the mount goes first,
/// then the pages.
pub struct HugeEnv {
    pub mount: OwnedMount,
    pub reservation: HugepageReservation,
}

impl HugeEnv {
    /// Reserves `pages` free pages and mounts a hugetlbfs of `page_size`; `None` (after
    /// printing why) when the kernel cannot supply 1 GiB pages (a fragmented host). 2 MiB
    /// pages a test machine must supply: their absence fails the test.
    pub fn new(page_size: PageSize, pages: u64) -> Option<HugeEnv> {
        let reservation = HugepageReservation::ensure_free(page_size, pages)
            .expect("reading/writing the hugepage pool (run as root)");
        let Some(reservation) = reservation else {
            assert_ne!(
                page_size,
                PageSize::Size2M,
                "the kernel cannot supply {pages} free 2M hugepages"
            );
            let why = hugeprep::testing::shortfall_note(page_size, pages);
            eprintln!("SKIPPED: {why}");
            return None;
        };
        let mount = OwnedMount::new_temp(&std::env::temp_dir(), &MountOptions::new(page_size))
            .expect("mounting hugetlbfs (run as root)");
        Some(HugeEnv { mount, reservation })
    }

    pub fn dir(&self) -> &Path {
        self.mount.path()
    }

    /// Free pages of the test's page size, machine-wide.
    pub fn free(&self) -> u64 {
        self.reservation.free_pages()
    }

    /// Free pages once a file this process closed has let go of its pages (see
    /// `HugepageReservation::wait_free`): the count to compare after a close or removal.
    pub fn free_after_close(&self, expected: u64) -> u64 {
        self.reservation.wait_free(expected)
    }

    /// Names in the mount directory.
    pub fn files(&self) -> Vec<String> {
        std::fs::read_dir(self.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

/// Free pages of `page_size` on the whole machine.
pub fn system_free(page_size: PageSize) -> u64 {
    pool::read(Scope::System, page_size).unwrap().free
}
