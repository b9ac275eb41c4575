//! The daemon's configuration file (`hugeprep serve --config`): parsed, then its pool table
//! and access table validated, as `serve` does.
#![no_main]

use hugeprep::daemon::config::ConfigFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = toml::from_str::<ConfigFile>(text) {
        if let Some(p) = c.pool {
            let _ = p.validate();
        }
    }
});
