//! Limits per principal (see `policy::tenants` and `docs/security.md`, "Limits per tenant"):
//! what one principal holds is counted from the pool's files (journaled leases carry their
//! principal, so a restart counts them again), the leases it is taking now, and its
//! released files waiting aside. A lease that would take it over a limit is refused before
//! anything is chosen or changed, under the same lock hold that claims the file, so two
//! requests at once cannot both pass.

use std::collections::BTreeMap;
use std::path::Path;

use super::state::{State, Taking};
use super::{FileState, PageSize, Pool, PoolError, Result, ValidRequest};
use crate::policy::tenants::Limits;

/// Names the libvirt hook derives (`libvirt-<domain uuid>-<alias>`, see
/// `vmm::libvirt::hook`): only an admin principal (the hook runs as root) may lease them, so
/// no tenant can take a domain's name first and make its next start fail.
pub const HOOK_PREFIX: &str = crate::vmm::libvirt::plan::LEASE_PREFIX;

/// The key that names tenants' directories (see [`scope_dir`]): 32 random bytes kept in
/// the state directory (`scope.key`, 0600), so a tenant's directory keeps its name across
/// restarts and nobody without the key can tell whose directory it is.
pub struct ScopeKey(ring::hmac::Key);

impl std::fmt::Debug for ScopeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScopeKey(..)")
    }
}

/// The file of the [`ScopeKey`] in the state directory.
pub const SCOPE_KEY_FILE: &str = "scope.key";

impl ScopeKey {
    /// Reads the key from `state_dir`, or makes it (once: a key made by another start in
    /// the meantime wins).
    pub fn open(state_dir: &Path) -> Result<ScopeKey> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = state_dir.join(SCOPE_KEY_FILE);
        let io = |op: &'static str, source: std::io::Error| PoolError::Io {
            op,
            path: path.clone(),
            source,
        };
        loop {
            match std::fs::read(&path) {
                Ok(bytes) if bytes.len() == 32 => {
                    return Ok(ScopeKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &bytes)))
                }
                Ok(bytes) => {
                    return Err(io(
                        "read the tenant directories' key",
                        std::io::Error::other(format!(
                            "{} bytes where 32 were written: remove it to make a new one (tenants' new leases then go to new directories)",
                            bytes.len()
                        )),
                    ))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("read the tenant directories' key", e)),
            }
            let mut key = [0u8; 32];
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key).map_err(
                |_| {
                    io(
                        "make the tenant directories' key",
                        std::io::Error::other("no random bytes"),
                    )
                },
            )?;
            let tmp = state_dir.join(format!("{SCOPE_KEY_FILE}.{}", std::process::id()));
            // A crash between the create and the link below leaves this name; a later start
            // with the same pid would then fail. The state directory is the daemon's alone,
            // so the name is its own leftover: gone or not, the create below says.
            let _ = std::fs::remove_file(&tmp);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| io("make the tenant directories' key", e))?;
            f.write_all(&key)
                .and_then(|()| f.sync_all())
                .map_err(|e| io("write the tenant directories' key", e))?;
            drop(f);
            // Linked, not renamed: an existing key is never replaced.
            let linked = std::fs::hard_link(&tmp, &path);
            let _ = std::fs::remove_file(&tmp);
            match linked {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io("write the tenant directories' key", e)),
            }
        }
    }

    /// A key of `bytes` (for tests).
    pub fn from_bytes(bytes: &[u8; 32]) -> ScopeKey {
        ScopeKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, bytes))
    }
}

/// The directory below the lease directory that holds a tenant's lease paths: `.uid-N`
/// for a unix peer, `.p-<HMAC-SHA256 of the principal>` (64 hex digits, keyed by
/// [`ScopeKey`]) for any other principal (a token, a certificate): any local user can list
/// the lease directory, and the name tells it neither a token's name nor a certificate's
/// subject, nor can it be guessed from them; two principals never share one. Lease names
/// never start with `.`, so no lease path of an admin's can be one of them.
pub fn scope_dir(principal: &str, key: &ScopeKey) -> String {
    match principal.strip_prefix("uid:") {
        Some(uid) if uid.bytes().all(|b| b.is_ascii_digit()) && !uid.is_empty() => {
            format!(".uid-{uid}")
        }
        _ => {
            let tag = ring::hmac::sign(&key.0, principal.as_bytes());
            let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            format!(".p-{hex}")
        }
    }
}

/// Refuses a name of the hook's to anyone but an admin.
pub(super) fn check_reserved_name(name: &str, tenant: &Tenant) -> Result<()> {
    if name.starts_with(HOOK_PREFIX) && !tenant.admin {
        return Err(PoolError::Field {
            field: "name",
            message: format!(
                "names beginning with {HOOK_PREFIX:?} are the libvirt hook's: only an admin may lease them"
            ),
        });
    }
    Ok(())
}

/// Who asks for a lease, and what it may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// The principal (`uid:N`, `token:NAME`, ...).
    pub principal: String,
    /// Whether it is an admin (names the libvirt hook derives are its alone).
    pub admin: bool,
    /// Its limits.
    pub limits: Limits,
}

/// What a principal holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Leased bytes per page size.
    pub leased_bytes: BTreeMap<PageSize, u64>,
    /// Leases, and released files kept past the kernel's path (see `kept`).
    pub leases: u64,
    /// pidfds and pins held for its leases.
    pub descriptors: u64,
    /// Released bytes still held by someone: waiting aside, or kept past the kernel's path
    /// (the latter count in `leased_bytes` too).
    pub held_bytes: u64,
}

impl Usage {
    /// Adds `bytes` of `page_size` to the leased bytes, saturating.
    fn add_bytes(&mut self, page_size: PageSize, bytes: u64) {
        let sum = self.leased_bytes.entry(page_size).or_default();
        *sum = sum.saturating_add(bytes);
    }
}

/// The descriptors a request makes the daemon hold: a pidfd for `pid`, a ring for `pin`.
fn descriptors_of(v: &ValidRequest) -> u64 {
    u64::from(v.pid.is_some()) + u64::from(v.pin)
}

/// The first limit `ask` would cross: (limit name, limit, in use, asked).
pub(crate) fn over(
    limits: &Limits,
    usage: &Usage,
    page_size: PageSize,
    size: u64,
    descriptors: u64,
) -> Option<(String, u64, u64, u64)> {
    let leased = usage.leased_bytes.get(&page_size).copied().unwrap_or(0);
    let checks = [
        (
            format!("leased_bytes.{page_size}"),
            limits.leased_bytes.get(&page_size).copied().flatten(),
            leased,
            size,
        ),
        ("leases".to_string(), limits.leases, usage.leases, 1),
        (
            "descriptors".to_string(),
            limits.descriptors,
            usage.descriptors,
            descriptors,
        ),
    ];
    // `held_bytes` is kept where files are set aside (see `aside`): a held file over it
    // takes the kernel's path at once, which frees its pages whatever the holder does.
    checks.into_iter().find_map(|(name, limit, used, asked)| {
        let limit = limit?;
        (asked > 0 && used.saturating_add(asked) > limit).then_some((name, limit, used, asked))
    })
}

/// The lengths of a principal's leased files, by file id (see [`Pool::extents_of`]).
pub(super) type Extents = BTreeMap<u64, u64>;

impl Pool {
    /// What `principal` holds now (under the state lock), its leased files' lengths taken
    /// from `extents` (read before the lock, see [`Pool::extents_of`]); a lease not in it
    /// (taken since) is read here.
    pub(super) fn usage_locked(&self, st: &State, principal: &str, extents: &Extents) -> Usage {
        // Every sum saturates: a lessee may grow a file to near 2^63 bytes (hugetlbfs takes
        // any page-aligned length up to `s_maxbytes`), and two such files must not wrap the
        // total back under a limit.
        let mut u = Usage::default();
        for e in st.core.files() {
            if let FileState::Leased(l) = &e.rec().state {
                if l.principal.as_deref() == Some(principal) {
                    let extent = extents
                        .get(&e.rec().id)
                        .copied()
                        .unwrap_or_else(|| self.leased_extent(e.rec()));
                    u.add_bytes(e.rec().page_size, extent);
                    u.leases = u.leases.saturating_add(1);
                    u.descriptors = u.descriptors.saturating_add(
                        u64::from(l.pid.is_some()) + u64::from(st.pinned.contains(&e.rec().id)),
                    );
                }
            }
        }
        for t in st.taking.values().filter(|t| t.principal == principal) {
            u.add_bytes(t.page_size, t.size);
            u.leases = u.leases.saturating_add(1);
            u.descriptors = u.descriptors.saturating_add(t.descriptors);
        }
        // Pages kept past a release (a read lease on a file the kernel's path could not
        // truncate) are still the principal's: each file counts as a lease of its bytes
        // until its holder lets go (see `kept`).
        let (files, kept) = self.tenants.kept.of(principal, &*self.host);
        u.leases = u.leases.saturating_add(files);
        for (ps, bytes) in kept {
            u.add_bytes(ps, bytes);
            u.held_bytes = u.held_bytes.saturating_add(bytes);
        }
        u.held_bytes = u
            .held_bytes
            .saturating_add(st.aside.held_bytes(Some(principal)));
        u
    }

    /// What a leased file takes from the host: the size it was leased at, or more when its
    /// lessee grew it (`ftruncate` larger, `fallocate(FALLOC_FL_KEEP_SIZE)` past its end, a
    /// writable mapping past its end): its length rounded up to whole pages, or its
    /// allocated pages, whichever is larger ([`Keeper::leased_size`](super::host::Keeper)):
    /// a few microseconds each, per live lease of the principal, at each admission check.
    fn leased_extent(&self, rec: &super::FileRecord) -> u64 {
        match self.host.leased_size(super::host::FileAt::of(rec)) {
            Some((len, held)) => {
                rec.size
                    .max(crate::hugetlb::extent_of(len, held / 512, rec.page_size))
            }
            None => rec.size,
        }
    }

    /// What `principal` holds now.
    pub fn usage(&self, principal: &str) -> Usage {
        let extents = self.extents_of(principal);
        let st = self.lock();
        self.usage_locked(&st, principal, &extents)
    }

    /// The lengths of `principal`'s leased files, by file id: the files listed under the
    /// lock, each read by an `fstatat` outside it (about 11 us each, measured: median of 7
    /// runs of 50,000, range 2-49 us on the busy 2-vCPU test machine), so that an admission
    /// check does not hold every lease up for them. A lessee may grow its file after the
    /// read as it may after the check: the limit is an admission check either way.
    pub(super) fn extents_of(&self, principal: &str) -> Extents {
        let leased: Vec<super::FileRecord> = {
            let st = self.lock();
            st.core
                .files()
                .filter(|e| {
                    matches!(&e.rec().state, FileState::Leased(l) if l.principal.as_deref() == Some(principal))
                })
                .map(|e| e.rec().clone())
                .collect()
        };
        leased
            .iter()
            .map(|rec| (rec.id, self.leased_extent(rec)))
            .collect()
    }

    /// Refuses a lease that would take its tenant over a limit (429, naming the limit, what
    /// is in use and the principal); changes nothing. `extents`: see [`Pool::extents_of`].
    pub(super) fn check_limits(
        &self,
        st: &State,
        v: &ValidRequest,
        extents: &Extents,
    ) -> Result<()> {
        let Some(tenant) = &v.tenant else {
            return Ok(());
        };
        // An admin (the libvirt hook, root) has no limit: its usage, a `fstatat` per live
        // lease, is not read on its lease path.
        if tenant.limits.admits_anything() {
            return Ok(());
        }
        let usage = self.usage_locked(st, &tenant.principal, extents);
        match over(
            &tenant.limits,
            &usage,
            v.page_size,
            v.size,
            descriptors_of(v),
        ) {
            None => Ok(()),
            Some((limit, max, in_use, asked)) => Err(PoolError::OverLimit {
                principal: tenant.principal.clone(),
                limit,
                max,
                in_use,
                asked,
            }),
        }
    }

    /// Records a lease being taken by its tenant (counted until it is journaled or fails).
    pub(super) fn start_taking(&self, st: &mut State, v: &ValidRequest, id: u64) {
        if let Some(t) = &v.tenant {
            st.taking.insert(
                id,
                Taking {
                    principal: t.principal.clone(),
                    page_size: v.page_size,
                    size: v.size,
                    descriptors: descriptors_of(v),
                },
            );
        }
    }

    /// The limit of held bytes of `principal`, as its last lease request gave it (`None`:
    /// no limit, or no request since the start: its files were leased before the restart
    /// and take the kernel's path anyway).
    pub(super) fn held_limit(&self, principal: Option<&str>) -> Option<u64> {
        let principal = principal?;
        self.tenants
            .limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(principal)
            .and_then(|l| l.held_bytes)
    }

    /// Remembers the limits of a tenant that asked for a lease (for its held files).
    pub(super) fn note_tenant(&self, tenant: &Tenant) {
        let mut known = self
            .tenants
            .limits
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Bounded by the principals the access rules let lease: one entry each.
        known.insert(tenant.principal.clone(), tenant.limits.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    fn limits() -> Limits {
        Limits {
            leased_bytes: [(PageSize::Size2M, Some(8 * M))].into_iter().collect(),
            leases: Some(3),
            descriptors: Some(1),
            held_bytes: Some(4 * M),
            starts_per_hour: Some(1),
        }
    }

    #[test]
    fn a_tenants_directory_names_no_principal_and_keeps_its_name() {
        let key = ScopeKey::from_bytes(&[7; 32]);
        assert_eq!(scope_dir("uid:64055", &key), ".uid-64055");
        let a = scope_dir("token:nova cert:CN=compute-1", &key);
        assert!(a.starts_with(".p-") && a.len() == 3 + 64, "{a}");
        assert!(!a.contains(
            &"nova"
                .bytes()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ));
        assert_eq!(a, scope_dir("token:nova cert:CN=compute-1", &key));
        assert_ne!(a, scope_dir("token:nova cert:CN=compute-2", &key));
        assert_ne!(
            a,
            scope_dir(
                "token:nova cert:CN=compute-1",
                &ScopeKey::from_bytes(&[8; 32])
            )
        );
        assert!(scope_dir(&"x".repeat(10_000), &key).len() < 255);
        // Made once in a state directory, read back the same after.
        let dir = std::env::temp_dir().join(format!("hugeprep-scope-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = scope_dir("token:t", &ScopeKey::open(&dir).unwrap());
        assert_eq!(first, scope_dir("token:t", &ScopeKey::open(&dir).unwrap()));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.join(SCOPE_KEY_FILE))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn files_grown_past_2_pow_63_saturate_the_sum_instead_of_wrapping_under_a_limit() {
        // Two files grown near 2^63 and one of 4 MiB once summed to 2^64, which wrapped to 0
        // in a release build (and panicked in a debug one, under the state lock).
        let mut u = Usage::default();
        let ps = PageSize::Size2M;
        u.add_bytes(ps, (1 << 63) - 2 * M);
        u.add_bytes(ps, (1 << 63) - 2 * M);
        u.add_bytes(ps, 4 * M);
        assert_eq!(u.leased_bytes[&ps], u64::MAX);
        assert_eq!(
            over(&limits(), &u, ps, 2 * M, 0),
            Some(("leased_bytes.2M".into(), 8 * M, u64::MAX, 2 * M))
        );
    }

    #[test]
    fn the_first_limit_crossed_is_named_with_its_use() {
        let mut u = Usage::default();
        let ps = PageSize::Size2M;
        assert_eq!(over(&limits(), &u, ps, 8 * M, 1), None);
        u.leased_bytes.insert(ps, 4 * M);
        assert_eq!(
            over(&limits(), &u, ps, 6 * M, 0),
            Some(("leased_bytes.2M".into(), 8 * M, 4 * M, 6 * M))
        );
        // Another page size has no limit here.
        assert_eq!(over(&limits(), &u, PageSize::Size1G, 1 << 30, 0), None);
        u.leases = 3;
        assert_eq!(
            over(&limits(), &u, ps, 2 * M, 0),
            Some(("leases".into(), 3, 3, 1))
        );
        u.leases = 0;
        u.descriptors = 1;
        assert_eq!(
            over(&limits(), &u, ps, 2 * M, 1),
            Some(("descriptors".into(), 1, 1, 1))
        );
        assert_eq!(over(&limits(), &u, ps, 2 * M, 0), None);
        assert_eq!(over(&Limits::default(), &u, ps, 1 << 40, 9), None);
    }
}
