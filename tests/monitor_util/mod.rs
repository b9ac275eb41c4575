//! Helpers of the monitoring and Placement tests: HTTP requests through the daemon's own
//! Placement client, free loopback ports, child processes killed by pid on drop, and the
//! metrics listener's address from the daemon's log.

#![allow(dead_code)]

use std::process::Child;
use std::time::{Duration, Instant};

use hugeprep::placement::http::{Answer, Http};

/// One request; panics when there is no answer.
pub fn http(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&str>) -> Answer {
    try_http(method, url, headers, body).unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// One request.
pub fn try_http(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Result<Answer, hugeprep::placement::http::TransportError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let headers: Vec<_> = headers
        .iter()
        .map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap()))
        .collect();
    rt.block_on(Http::new(Duration::from_secs(20), None).send(
        method.parse().unwrap(),
        url,
        &headers,
        body.map(|b| b.as_bytes().to_vec()),
    ))
}

/// The body as JSON.
pub fn json(a: &Answer) -> serde_json::Value {
    serde_json::from_slice(&a.body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&a.body)))
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Percent-encodes a query value.
pub fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A child process, SIGTERMed then SIGKILLed by its pid on drop.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `f` every 200 ms until it returns `Some`; panics with `what` after `limit`.
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The metrics listener's address, from the daemon's log line.
pub fn metrics_addr(log: &str) -> Option<String> {
    log.lines()
        .find(|l| l.contains("serving /metrics and /health over http"))?
        .split_whitespace()
        .find_map(|w| w.strip_prefix("metrics="))
        .map(str::to_string)
}
