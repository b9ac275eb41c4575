//! Strategies shared by the property tests (`tests/proptest_parsers.rs`,
//! `tests/daemon_proptest.rs`): the strings a client or an operator might write where a size,
//! page size, name, user or word belongs, valid, invalid and hostile.

use proptest::prelude::*;

/// Known words, sizes, paths and names, then any short printable string.
pub fn word() -> impl Strategy<Value = String> {
    const WORDS: &[&str] = &[
        "",
        "2M",
        "1G",
        "4K",
        "4M",
        "8M",
        "3M",
        "64T",
        "99999999999999999999G",
        "lots",
        "-1",
        "0",
        "../etc",
        "a/b",
        ".hidden",
        "root",
        "nobody-such-user",
        "sample",
        "full",
        "demand",
        "rep-stosb",
        "avx512-nt",
        "llc",
        "all",
    ];
    prop_oneof![
        3 => prop::sample::select(WORDS).prop_map(str::to_string),
        1 => Just("x".repeat(200)),
        2 => "\\PC{0,12}",
    ]
}

/// `cases` per property (the suite's bound), or `PROPTEST_CASES` when set for a deeper run.
pub fn cases(cases: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases)
}
