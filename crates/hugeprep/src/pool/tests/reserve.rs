//! Tests of the reservations: the raise plan, compaction, the ledger, explanations.

use super::*;
use crate::hugetlb::pool::Scope;
use crate::journal::Journal;
use crate::pool::host::ledger_key as key;

const G: u64 = 1 << 30;

#[test]
fn plan_is_bounded_by_the_limit_and_the_margin() {
    let on = ReservePolicy::default();
    let ps = PageSize::Size2M;
    assert_eq!(plan(512, ps, &on, 0, 8 * G), (512, None));
    // 1.5 GiB available, 1 GiB margin: 256 pages.
    let (pages, limit) = plan(2048, ps, &on, 0, 3 * G / 2);
    assert_eq!(pages, 256);
    assert!(matches!(limit, Some(Limit::Memory { .. })));
    let capped = ReservePolicy {
        limit: Some(2 * G),
        ..on.clone()
    };
    // 1 GiB already added on the node (any page size): 512 pages of room.
    assert_eq!(
        plan(2048, ps, &capped, G, 64 * G),
        (512, Some(Limit::Cap { limit: 2 * G }))
    );
    let off = ReservePolicy {
        enabled: false,
        ..on
    };
    assert_eq!(plan(1, ps, &off, 0, 64 * G), (0, Some(Limit::Disabled)));
}

#[test]
fn node_memory_compacts_through_the_node_file() {
    // Root, as the daemon: the per-node file the packaged unit leaves writable. Anyone
    // else (scripts/pool-unprivileged runs these tests as nobody) is refused, and the
    // error says so rather than falling back.
    if !nix::unistd::geteuid().is_root() {
        let err = compact_node(0).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
        return;
    }
    compact_node(0).unwrap();
    assert!(
        compact_node(u32::MAX).is_ok(),
        "falls back to compact_memory"
    );
}

#[test]
fn a_record_larger_than_the_pool_is_cut_to_it() {
    let dir = std::env::temp_dir().join(format!("hugeprep-ledger-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let journal = Journal::open(&dir.join(LEDGER_DIR)).unwrap();
    let huge = Reserved {
        node: 0,
        page_size: PageSize::Size1G,
        pages: 1 << 40,
    };
    journal.write(&key(0, PageSize::Size1G), &huge).unwrap();
    journal.write("stray", &huge).unwrap();
    let ledger = Reservations::open(&dir).unwrap();
    let total = kpool::read(Scope::Node(0), PageSize::Size1G).unwrap().total;
    assert_eq!(ledger.added(0, PageSize::Size1G), total);
    let kept: Vec<(String, Reserved)> = journal.load().unwrap();
    assert!(kept
        .iter()
        .all(|(k, r)| *k == key(0, r.page_size) && r.pages == total));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn explanations_name_the_node_and_the_remedy() {
    let text = Limit::Disabled.explain(0, PageSize::Size2M, 1024);
    assert!(
        text.starts_with("kernel pool short by 1024 2M pages on node 0; reserve disabled"),
        "{text}"
    );
    assert!(text.contains("hugeprep pool --set"), "{text}");
    assert!(text.contains("systemctl reload hugeprep"), "{text}");
    let text = Limit::Memory {
        available: 1288490189,
        margin: G,
    }
    .explain(0, PageSize::Size2M, 3);
    assert!(text.contains("node 0 has 1.2 GiB available"), "{text}");
}
