//! Idempotent leases: a request with an idempotency key is served at most once. A retry with
//! the same key and the same request gets the same lease back (while it lives, across
//! restarts: the key is journaled with the lease); the same key with a different request is
//! refused naming `idempotency_key`. A retry that arrives while the first request is still
//! running waits for it and gets its answer.
//!
//! Keys belong to the principal that sent them: the same key from another principal is
//! another key (its own lease, or its own conflict), so no principal can learn, block or
//! answer for another's.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::*;

/// The longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 128;

/// The key a lease was made with and the request it answered, journaled with the lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Idempotency {
    /// The client's key (1 to [`MAX_IDEMPOTENCY_KEY`] visible ASCII characters).
    pub key: String,
    /// The request as first made; a retry must be equal to it.
    pub request: LeaseRequest,
}

/// Checks a key: 1 to 128 bytes of visible ASCII (no spaces or control characters).
///
/// ```
/// use hugeprep::pool::idempotency::check_key;
/// assert!(check_key("2f1c-retry-7").is_ok());
/// assert!(check_key("").is_err());
/// ```
pub fn check_key(key: &str) -> Result<()> {
    let bad = |message: String| PoolError::Field {
        field: "idempotency_key",
        message,
    };
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY {
        return Err(bad(format!(
            "{} bytes: must be 1 to {MAX_IDEMPOTENCY_KEY}",
            key.len()
        )));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(format!(
            "{key:?} must be visible ASCII characters (no spaces or control characters)"
        )));
    }
    Ok(())
}

fn conflict(key: &str, why: &str) -> PoolError {
    PoolError::KeyReused {
        message: format!("key {key:?} was used for {why}: a retry must repeat the same request"),
    }
}

impl Pool {
    /// The live lease `principal` made with `key`, with the request it answered.
    fn lease_of_key(
        &self,
        st: &State,
        key: &str,
        principal: Option<&str>,
    ) -> Option<(LeaseInfo, LeaseRequest)> {
        st.core.files().find_map(|e| match &e.rec().state {
            FileState::Leased(l) => match &l.idempotency {
                Some(tag) if tag.key == key && l.principal.as_deref() == principal => {
                    Some((LeaseInfo::of(e.rec(), l), tag.request.clone()))
                }
                _ => None,
            },
            _ => None,
        })
    }

    /// Takes a lease at most once per `key` (see the module documentation). Returns the lease
    /// and whether it was made by an earlier request (a replay).
    pub fn lease_idempotent(&self, req: &LeaseRequest, key: &str) -> Result<(LeaseInfo, bool)> {
        self.lease_idempotent_as(req, key, None)
    }

    /// [`Pool::lease_idempotent`] on behalf of `tenant` (journaled as the lease's owner; its
    /// keys are its own: a replay finds only a lease it made).
    pub fn lease_idempotent_as(
        &self,
        req: &LeaseRequest,
        key: &str,
        tenant: Option<&Tenant>,
    ) -> Result<(LeaseInfo, bool)> {
        check_key(key)?;
        let principal = tenant.map(|t| t.principal.as_str());
        // Keys in flight, by principal and key (a newline is in no key).
        let scoped = format!("{}\n{key}", principal.unwrap_or(""));
        let deadline = Instant::now() + LEASE_WAIT;
        {
            let mut st = self.lock();
            loop {
                if self.table.is_shut_down() {
                    return Err(PoolError::ShuttingDown);
                }
                if let Some((info, first)) = self.lease_of_key(&st, key, principal) {
                    if first != *req {
                        return Err(conflict(
                            key,
                            &format!("another request (lease {})", info.id),
                        ));
                    }
                    drop(st);
                    let mut one = vec![info];
                    self.mark_pinned(&mut one);
                    return Ok((one.remove(0), true));
                }
                match st.keyed.get(&scoped) {
                    Some(running) if running.request != *req => {
                        return Err(conflict(key, "another request still running"));
                    }
                    Some(_) if Instant::now() < deadline => {
                        st = st.wait_timeout(&self.table.changed, Duration::from_millis(50));
                    }
                    Some(_) => return Err(conflict(key, "a request that is still running")),
                    None => {
                        st.keyed.insert(
                            scoped.clone(),
                            Idempotency {
                                key: key.to_string(),
                                request: req.clone(),
                            },
                        );
                        break;
                    }
                }
            }
        }
        let tag = self.lock().keyed.get(&scoped).cloned();
        let result = self.lease_tagged(req, tag.as_ref(), tenant);
        let mut st = self.lock();
        st.keyed.remove(&scoped);
        self.table.changed.notify_all();
        result.map(|info| (info, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_bounded_visible_ascii() {
        assert!(check_key("a").is_ok());
        assert!(check_key(&"k".repeat(MAX_IDEMPOTENCY_KEY)).is_ok());
        for bad in ["", "a b", "a\nb", "é", &"k".repeat(MAX_IDEMPOTENCY_KEY + 1)] {
            assert_eq!(check_key(bad).unwrap_err().field(), Some("idempotency_key"));
        }
    }
}
