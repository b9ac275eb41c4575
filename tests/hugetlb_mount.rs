//! hugetlbfs mounts: mounting our own, finding it through mountinfo (escaped paths
//! included) with the page size statfs reports, and unmounting.

use hugeprep::hugetlb::mount::{self, MountOptions};
use hugeprep::hugetlb::{hugetlbfs_page_size, pool, OwnedMount};
use hugeprep::PageSize;

#[test]
fn mounts_are_found_by_page_size_even_with_spaces_in_the_path() {
    let _lock = hugeprep::testing::lock().unwrap();
    let parent = std::env::temp_dir().join(format!("hugeprep mount test {}", std::process::id()));
    std::fs::create_dir_all(&parent).unwrap();
    for size in pool::page_sizes() {
        let mut opts = MountOptions::new(size);
        opts.mode = 0o1770;
        let m = OwnedMount::new_temp(&parent, &opts).unwrap();
        assert_eq!(hugetlbfs_page_size(m.path()).unwrap(), Some(size));
        let found = mount::mounts().unwrap();
        let ours = found
            .iter()
            .find(|f| f.path == m.path())
            .unwrap_or_else(|| panic!("{} not in {found:?}", m.path().display()));
        assert_eq!(ours.page_size, size);
        assert!(mount::find(size).unwrap().is_some());
        let meta = std::fs::metadata(m.path()).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777,
            0o1770
        );
        let path = m.path().to_path_buf();
        m.unmount().unwrap();
        assert!(!mount::mounts().unwrap().iter().any(|f| f.path == path));
        assert!(!path.exists());
    }
    std::fs::remove_dir(&parent).unwrap();
}

#[test]
fn mounting_on_a_missing_directory_names_it() {
    let dir = std::env::temp_dir().join("hugeprep-no-such-dir/x");
    let err = mount::mount(&dir, &MountOptions::new(PageSize::Size2M)).unwrap_err();
    assert!(err.to_string().contains("hugeprep-no-such-dir"), "{err}");
}
