//! The clearing policy and the pool policy files.
#![no_main]

use hugeprep::policy::pool::PoolPolicy;
use hugeprep::policy::ClearingPolicy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = PoolPolicy::from_toml(text);
    let _ = ClearingPolicy::parse(text, std::path::Path::new("fuzz.toml"));
});
