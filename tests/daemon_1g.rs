//! A daemon that serves only 1 GiB pages: bad requests get a 4xx naming the field and leave
//! no pages or files behind (a 1G lease of a size that is not a multiple of 1 GiB, a 2M
//! request to it, and a 1G request to a 2M-only daemon), and its calibration times the
//! clearing methods on a 1G page, or says why it could not.

mod daemon_util;

use daemon_util::Env;
use hugeprep::hugetlb::pool::{self, Scope};
use hugeprep::hugetlb::BackingFile;
use hugeprep::PageSize;

const GIB: u64 = 1 << 30;

/// Kernel pool counts of both page sizes, machine-wide: what a refused request must not move.
fn kernel_pools() -> Vec<(u64, u64)> {
    PageSize::ALL
        .iter()
        .map(|&ps| {
            let c = pool::read(Scope::System, ps).unwrap();
            (c.total, c.free)
        })
        .collect()
}

/// Sends each `(body, field)` as a lease request and checks the 400 names `field`.
fn refused(d: &daemon_util::Daemon, cases: &[(&str, &str)]) {
    for (body, field) in cases {
        let (status, json) = d.raw("POST", "/v1/leases", body.as_bytes());
        assert_eq!(status, 400, "{body}: {json}");
        assert_eq!(json["field"].as_str(), Some(*field), "{body}: {json}");
        let error = json["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(field),
            "{body}: the message names {field}: {json}"
        );
    }
}

/// Neither daemon needs a page for this: each request is refused before anything is taken.
#[test]
fn page_size_mismatches_and_sizes_off_the_page_name_the_field_and_leak_nothing() {
    let gig = Env::fresh_on("1g-bad-input", PageSize::Size1G);
    let d = gig.spawn(&["--no-reserve"]);
    assert_eq!(d.pool().kinds[0].page_size, PageSize::Size1G);
    let pools = kernel_pools();
    refused(
        &d,
        &[
            (r#"{"name":"a","size":"1536M","page_size":"1G"}"#, "size"),
            (r#"{"name":"a","size":"512M","page_size":"1G"}"#, "size"),
            (r#"{"name":"a","size":"3G","page_size":"2M"}"#, "page_size"),
            // No page size: a request for 2M pages, which this daemon does not serve.
            (r#"{"name":"a","size":"2G"}"#, "page_size"),
        ],
    );
    assert!(d.leases().is_empty());
    assert_eq!(gig.mount_used(), 0);
    assert!(Env::names(&gig.lease_dir()).is_empty());
    assert_eq!(kernel_pools(), pools);
    drop(d);
    drop(gig);

    let two = Env::fresh_on("2m-bad-input", PageSize::Size2M);
    let d = two.spawn(&["--no-reserve"]);
    let pools = kernel_pools();
    refused(
        &d,
        &[(r#"{"name":"a","size":"1G","page_size":"1G"}"#, "page_size")],
    );
    assert!(d.leases().is_empty());
    assert_eq!(two.mount_used(), 0);
    assert_eq!(kernel_pools(), pools);
}

/// A daemon on a 1G mount alone, one 1G page free: its calibration buffer is that page.
#[test]
fn a_one_gig_only_daemon_calibrates_on_a_one_gig_page() {
    let Some(env) = Env::try_with_page_size("1g-calibrate", PageSize::Size1G, GIB) else {
        eprintln!(
            "SKIPPED: {}",
            hugeprep::testing::shortfall_note(PageSize::Size1G, 1)
        );
        return;
    };
    let d = env.spawn(&["--calibration", "auto"]);
    let (_, cpu) = d.raw("GET", "/v1/cpu", b"");
    let measured = &cpu["calibration"]["measured"];
    assert_eq!(measured["page_size"], "1G", "{cpu:#}\n{}", env.log());
    assert_eq!(measured["memory"], "free-hugepages", "{cpu:#}");
    assert_eq!(measured["hugepage_backed"], true, "{cpu:#}");
    assert!(measured["backing_note"].is_null(), "{cpu:#}");
    // The page went back to the pool once timed: free for the daemon's own files.
    assert!(pool::available(None, PageSize::Size1G).unwrap() >= 1);
}

/// No free 1G page and no raise allowed (`--no-reserve`): the daemon still calibrates, on the
/// memory there is, and says so (never silently on ordinary memory).
#[test]
fn a_one_gig_only_daemon_without_a_page_says_why() {
    let env = Env::fresh_on("1g-calibrate-none", PageSize::Size1G);
    // Every free 1G page mapped for the test's length, so none is left to the daemon.
    let occupied: Vec<BackingFile> = (0..pool::available(None, PageSize::Size1G).unwrap())
        .map(|i| {
            let f = BackingFile::memfd(&format!("occupy-{i}"), GIB, PageSize::Size1G).unwrap();
            f.allocate(0, GIB).unwrap();
            f
        })
        .collect();
    assert_eq!(pool::available(None, PageSize::Size1G).unwrap(), 0);
    let d = env.spawn(&["--no-reserve", "--calibration", "auto"]);
    let (_, cpu) = d.raw("GET", "/v1/cpu", b"");
    let measured = &cpu["calibration"]["measured"];
    assert_ne!(measured["page_size"], "1G", "{cpu:#}");
    let note = measured["backing_note"].as_str().unwrap_or_default();
    assert!(note.contains("no free 1G page"), "{cpu:#}");
    assert!(note.contains("reserve = false"), "{cpu:#}");
    assert!(
        env.log()
            .contains("calibration not timed on the 1G pages the daemon scrubs"),
        "{}",
        env.log()
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["status", "--socket"])
        .arg(&env.socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no free 1G page"), "{text}");
    drop(d);
    drop(occupied);
}
