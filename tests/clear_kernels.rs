//! Every available clearing method, at every thread count, over awkward sizes and unaligned
//! starts, on ordinary and hugepage-backed memory: the extent must end up exactly as the
//! naive reference leaves it (zero inside, the pattern untouched in the guard bytes).

use hugeprep::clear::{available_methods, ClearError, ClearPurpose, Clearer};
use hugeprep::sys::affinity::allowed_cpus;
use hugeprep::sys::mmap::MmapRegion;
use hugeprep::testing::HugepageReservation;
use hugeprep::{ClearPlan, Method, PageSize};

const SIZES: [usize; 7] = [0, 1, 63, 4095, 4096 + 13, 2 << 20, (64 << 20) + 7];
/// Start offsets from a 4 KiB boundary: aligned, odd, one short of a line, mid-page.
const OFFSETS: [usize; 4] = [0, 1, 63, 2048 + 8];
/// Guard bytes on each side of the extent that must keep the pattern.
const GUARD: usize = 4096;

/// Never zero, and with a period (251) that does not divide any line or page size, so a
/// misplaced or shifted store shows up.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 | 1).collect()
}

/// The naive reference: one byte at a time.
fn naive_zero(buf: &mut [u8]) {
    for byte in buf {
        *byte = 0;
    }
}

/// The plans every method is run with: streaming from the first byte (with a fence interval
/// that is not a power of two, to exercise partial slices), the default plan, and a plan
/// whose `nt_min_extent` sends everything under 1 MiB to the cached path.
fn plans(method: Method) -> [ClearPlan; 3] {
    [
        ClearPlan {
            method,
            fence_interval: 3 * 64,
            nt_min_extent: 0,
            purpose: ClearPurpose::UseSoon,
        },
        ClearPlan::always(method),
        ClearPlan {
            method,
            fence_interval: 64 << 10,
            nt_min_extent: 1 << 20,
            purpose: ClearPurpose::UseSoon,
        },
    ]
}

/// Runs every method x thread count x plan over every size and offset inside `region`,
/// comparing the whole region (guards included) with the reference.
fn check_all(region: &mut [u8], sizes: &[usize]) {
    let cpus = allowed_cpus();
    let methods = available_methods();
    let pattern = pattern(region.len());
    for &size in sizes {
        // The largest extent costs most of the run: two unaligned starts cover its head and
        // tail cases (an odd start and a mid-page start).
        let offsets: &[usize] = if size > 2 << 20 {
            &[1, 2048 + 8]
        } else {
            &OFFSETS
        };
        for &offset in offsets {
            let start = GUARD + offset;
            assert!(start + size + GUARD <= region.len(), "region too small");
            let mut expected = pattern.clone();
            naive_zero(&mut expected[start..start + size]);
            for &method in &methods {
                for plan in plans(method) {
                    let clearer = Clearer::new(plan).unwrap();
                    region.copy_from_slice(&pattern);
                    clearer.clear(&mut region[start..start + size]);
                    assert_same(region, &expected, &plan, 0, size, offset);
                    for threads in 1..=cpus.len() {
                        region.copy_from_slice(&pattern);
                        clearer
                            .clear_parallel(&mut region[start..start + size], &cpus[..threads])
                            .unwrap();
                        assert_same(region, &expected, &plan, threads, size, offset);
                    }
                }
            }
        }
    }
}

fn assert_same(
    got: &[u8],
    expected: &[u8],
    plan: &ClearPlan,
    threads: usize,
    size: usize,
    offset: usize,
) {
    if got != expected {
        let first = got.iter().zip(expected).position(|(a, b)| a != b).unwrap();
        panic!(
            "{plan:?} with {threads} threads (0: calling thread) on {size} bytes at offset \
             {offset}: byte {first} is {:#x}, expected {:#x}",
            got[first], expected[first]
        );
    }
}

fn region_len(largest: usize) -> usize {
    let len = GUARD + OFFSETS.iter().max().unwrap() + largest + GUARD;
    len.div_ceil(2 << 20) * (2 << 20)
}

#[test]
fn every_method_and_thread_count_on_anonymous_memory() {
    let mut region = MmapRegion::anonymous(region_len(SIZES[6]), None).unwrap();
    check_all(region.as_mut_slice(), &SIZES);
}

#[test]
fn every_method_and_thread_count_on_2m_hugepages() {
    let len = region_len(SIZES[6]);
    let pages = (len / (2 << 20)) as u64;
    let Some(_reservation) = HugepageReservation::ensure_free(PageSize::Size2M, pages).unwrap()
    else {
        panic!("cannot reserve {pages} 2M hugepages");
    };
    let mut region = MmapRegion::anonymous(len, Some(PageSize::Size2M))
        .expect("map the reserved 2M pages (did a process outside the test lock take them?)");
    check_all(region.as_mut_slice(), &SIZES);
}

#[test]
fn every_available_method_is_offered_and_constructible() {
    let methods = available_methods();
    assert!(methods.contains(&Method::RepStosb));
    assert!(methods.contains(&Method::Movnti));
    assert!(methods.contains(&Method::WriteBytes));
    for method in Method::ALL {
        let result = Clearer::new(ClearPlan::always(method));
        assert_eq!(method.is_available(), result.is_ok(), "{method}");
        if let Err(err) = result {
            assert!(matches!(err, ClearError::Unavailable { .. }), "{err}");
            assert!(err.to_string().contains(method.name()), "{err}");
        }
    }
}

#[test]
fn invalid_fence_intervals_name_the_field() {
    for fence_interval in [0, 100] {
        let plan = ClearPlan {
            fence_interval,
            ..ClearPlan::always(Method::RepStosb)
        };
        let err = Clearer::new(plan).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("fence_interval"), "{text}");
        assert!(text.contains(&format!("= {fence_interval}")), "{text}");
    }
}

#[test]
fn small_extents_take_the_cached_path_for_streaming_methods_only() {
    for method in available_methods() {
        let clearer = Clearer::new(ClearPlan {
            method,
            fence_interval: 2 << 20,
            nt_min_extent: 32 << 20,
            purpose: ClearPurpose::UseSoon,
        })
        .unwrap();
        let small = if method.is_non_temporal() {
            Method::RepStosb
        } else {
            method
        };
        assert_eq!(clearer.method_for((32 << 20) - 1), small);
        assert_eq!(clearer.method_for(32 << 20), method);
    }
}

/// A scrub's memory is not read again soon: it streams at every extent size, even below an
/// LLC as large as the masked Intel Xeon's 480 MiB.
#[test]
fn a_scrub_streams_below_nt_min_extent() {
    for method in available_methods() {
        let plan = ClearPlan {
            method,
            fence_interval: 2 << 20,
            nt_min_extent: 480 << 20,
            purpose: ClearPurpose::Scrub,
        };
        let clearer = Clearer::new(plan).unwrap();
        assert_eq!(clearer.method_for(4096), method);
        assert_eq!(clearer.method_for(64 << 20), method);
        let scrubber = hugeprep::scrub::Scrubber::new(plan.for_purpose(ClearPurpose::UseSoon));
        assert_eq!(scrubber.unwrap().plan().purpose, ClearPurpose::Scrub);
    }
}

#[test]
fn parallel_clear_without_cpus_or_with_a_missing_cpu_fails_clearly() {
    let clearer = Clearer::new(ClearPlan::always(Method::RepStosb)).unwrap();
    let mut buf = vec![1u8; 1 << 20];
    let err = clearer.clear_parallel(&mut buf, &[]).unwrap_err();
    assert!(
        matches!(err, ClearError::NoCpus { len } if len == 1 << 20),
        "{err}"
    );
    let err = clearer.clear_parallel(&mut buf, &[100_000]).unwrap_err();
    assert!(matches!(err, ClearError::Pin { .. }), "{err}");
    assert!(err.to_string().contains("100000"), "{err}");
}
