//! Request bodies of the API (lease, targets, drain, resume) and the access files (tokens):
//! any bytes parse or are refused naming a field; nothing panics.
#![no_main]

use hugeprep::api::{decode_json, parse_lease_body, parse_targets_body, ResumeRequest};
use hugeprep::pool::DrainRequest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_lease_body(data);
    let _ = parse_targets_body(data);
    let _ = decode_json::<DrainRequest>(data);
    let _ = decode_json::<ResumeRequest>(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = hugeprep::api::access::parse_tokens(text);
        let _ = hugeprep::units::parse_bytes(text);
        let _ = hugeprep::pool::check_name(text);
    }
});
