//! Calibration on real memory: it times every available method and reports which backing it
//! used. No speed is asserted here (that belongs in `hugeprep bench clear`).

use std::time::Duration;

use hugeprep::clear::{available_methods, calibrate, calibrate_with, Calibration};
use hugeprep::testing::HugepageReservation;
use hugeprep::{Method, PageSize};

fn check(c: &Calibration, methods: &[Method]) {
    let timed: Vec<Method> = c.methods.iter().map(|t| t.method).collect();
    assert_eq!(timed, methods);
    assert!(c.methods.iter().all(|t| t.gbps > 0.0), "{c:?}");
    assert!(methods.contains(&c.fastest));
    assert!(c.within(c.fastest, 0.0));
    let best = c.gbps_of(c.fastest).unwrap();
    assert!(c.methods.iter().all(|t| t.gbps <= best), "{c:?}");
    let json = serde_json::to_value(c).unwrap();
    assert_eq!(json["fastest"], c.fastest.name());
}

#[test]
fn calibration_on_2m_hugepages_times_every_available_method() {
    let Some(_reservation) = HugepageReservation::ensure_free(PageSize::Size2M, 64).unwrap() else {
        panic!("cannot reserve 64 2M hugepages");
    };
    let c = calibrate(Duration::from_millis(200)).unwrap();
    assert!(c.hugepage_backed, "{c:?}");
    assert_eq!(c.buffer_bytes, 128 << 20);
    check(&c, &available_methods());
}

#[test]
fn calibration_rounds_the_buffer_to_2m_and_falls_back_to_anonymous_memory() {
    // Holding the lock without reserving: free 2M pages are whatever the host has, so either
    // backing is fine, as long as the result says which and still times every method.
    let _lock = hugeprep::testing::lock().unwrap();
    let methods = [Method::WriteBytes, Method::RepStosb];
    let c = calibrate_with(&methods, (3 << 20) + 1, Duration::from_millis(20)).unwrap();
    assert_eq!(c.buffer_bytes, 4 << 20);
    check(&c, &methods);
}
