//! One-shot preparation of a guest memory file (`hugeprep prepare`) and growing a file by a
//! prefaulted tail, both all-or-nothing: on failure no file and no faulted page is left.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use super::{prefault, PrefaultError, PrefaultOptions, PrefaultReport};
use crate::hugetlb::{check_size, hugetlbfs_page_size, mount, pool, BackingFile, Owner, Scope};
use crate::hugetlb::{FileError, MountError, PoolError};
use crate::page_size::PageSize;
use crate::topology::Topology;

/// Where a prepared file goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Exactly this path (must not exist; its directory must be on hugetlbfs of the size).
    Path(PathBuf),
    /// A new file with a generated name in this hugetlbfs mount (or directory on one).
    Mount(PathBuf),
    /// A new file in the first mounted hugetlbfs of the page size.
    Auto,
}

/// A request to create and fill one file.
#[derive(Debug, Clone)]
pub struct PrepareSpec {
    /// Bytes; a positive multiple of the page size.
    pub size: u64,
    /// Page size.
    pub page_size: PageSize,
    /// Where the file goes.
    pub target: Target,
    /// User (name or uid) to own the file, e.g. the VMM's user.
    pub owner: Option<String>,
    /// Threads, node, extent, lock, cancellation.
    pub prefault: PrefaultOptions,
}

/// A prepared file and how it was filled.
#[derive(Debug)]
pub struct Prepared {
    /// The file, every page present.
    pub file: BackingFile,
    /// What the prefault did.
    pub report: PrefaultReport,
}

/// Errors from [`prepare`]. [`PrepareError::Invalid`] names the argument at fault
/// (`size`, `page-size`, `node`, `path`, `mount`, `owner`, `threads`), as the CLI spells it
/// without the dashes.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// An argument is out of range or inconsistent.
    #[error("{field}: {reason}")]
    Invalid {
        /// The argument.
        field: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// No target given and no hugetlbfs of the page size is mounted.
    #[error(
        "no hugetlbfs mount of page size {page_size}: mount one (mkdir -p DIR && mount -t \
         hugetlbfs -o pagesize={page_size} none DIR) or name one with --mount DIR or --path FILE"
    )]
    NoMount {
        /// The page size asked for.
        page_size: PageSize,
    },
    /// Reading the mount table failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// Reading the pool failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// Creating the file failed (it was removed).
    #[error(transparent)]
    File(#[from] FileError),
    /// Filling the file failed (it was removed).
    #[error(transparent)]
    Prefault(#[from] PrefaultError),
}

impl PrepareError {
    /// The argument at fault, for an invalid-argument error.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            PrepareError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> PrepareError {
    PrepareError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// Checks that `dir` is on hugetlbfs of `page_size`; the error is for `field`.
fn check_hugetlbfs_dir(
    field: &'static str,
    dir: &Path,
    page_size: PageSize,
) -> Result<(), PrepareError> {
    match hugetlbfs_page_size(dir) {
        Ok(Some(found)) if found == page_size => Ok(()),
        Ok(Some(found)) => Err(invalid(
            field,
            format!(
                "{} is on hugetlbfs with {found} pages, not {page_size}",
                dir.display()
            ),
        )),
        Ok(None) => Err(invalid(
            field,
            format!("{} is not on hugetlbfs", dir.display()),
        )),
        Err(e) => Err(invalid(field, format!("{}: {e}", dir.display()))),
    }
}

fn generated_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "hugeprep-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Resolves the target to the file path to create.
fn resolve_path(spec: &PrepareSpec) -> Result<PathBuf, PrepareError> {
    match &spec.target {
        Target::Path(path) => {
            if path.symlink_metadata().is_ok() {
                return Err(invalid(
                    "path",
                    format!("{} already exists", path.display()),
                ));
            }
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            check_hugetlbfs_dir("path", dir, spec.page_size)?;
            Ok(path.clone())
        }
        Target::Mount(dir) => {
            if !dir.is_dir() {
                return Err(invalid(
                    "mount",
                    format!("{} is not a directory", dir.display()),
                ));
            }
            check_hugetlbfs_dir("mount", dir, spec.page_size)?;
            Ok(dir.join(generated_name()))
        }
        Target::Auto => match mount::find(spec.page_size)? {
            Some(m) => Ok(m.path.join(generated_name())),
            None => Err(PrepareError::NoMount {
                page_size: spec.page_size,
            }),
        },
    }
}

/// Checks every argument of `spec` before anything is created; returns the file path and
/// the owner.
pub fn validate(spec: &PrepareSpec) -> Result<(PathBuf, Option<Owner>), PrepareError> {
    if check_size(spec.size, spec.page_size).is_err() {
        return Err(invalid(
            "size",
            format!(
                "{} is not a positive multiple of the {} page size ({} bytes)",
                spec.size,
                spec.page_size,
                spec.page_size.bytes()
            ),
        ));
    }
    if spec.prefault.threads == Some(0) {
        return Err(invalid("threads", "must be at least 1"));
    }
    if let Some(node) = spec.prefault.node {
        let topology = Topology::detect().map_err(|e| invalid("node", e.to_string()))?;
        topology
            .node(node)
            .map_err(|e| invalid("node", e.to_string()))?;
    }
    if !pool::page_sizes().contains(&spec.page_size) {
        return Err(invalid(
            "page-size",
            format!("this kernel has no {} hugepage pool", spec.page_size),
        ));
    }
    let owner = match &spec.owner {
        Some(user) => Some(Owner::lookup(user).map_err(|e| invalid("owner", e.to_string()))?),
        None => None,
    };
    Ok((resolve_path(spec)?, owner))
}

/// Creates the file `spec` describes and fills it; on any failure (including cancellation)
/// the file is removed, so its pages go back to the pool. A request the pool cannot satisfy
/// fails before the file is created.
pub fn prepare(
    spec: &PrepareSpec,
    progress: Option<&dyn Fn(u64)>,
) -> Result<Prepared, PrepareError> {
    let (path, owner) = validate(spec)?;
    let needed = spec.size / spec.page_size.bytes();
    let free = pool::available(spec.prefault.node, spec.page_size)?;
    if needed > free {
        return Err(PrefaultError::Insufficient {
            scope: Scope::from_node(spec.prefault.node),
            page_size: spec.page_size,
            needed,
            free,
            path,
        }
        .into());
    }
    let file = BackingFile::create(&path, spec.size, spec.page_size, owner)?;
    match prefault(&file, 0..spec.size, &spec.prefault, progress) {
        Ok(report) => Ok(Prepared { file, report }),
        Err(e) => {
            if let Err(rm) = file.remove() {
                tracing::warn!("removing {} after a failed prefault: {rm}", path.display());
            }
            Err(e.into())
        }
    }
}

/// Grows `file` to `new_size` and faults only the new tail (the old pages keep their
/// contents; the tail reads as zeros). On failure the file is shrunk back, which frees the
/// tail's pages.
pub fn grow(
    file: &mut BackingFile,
    new_size: u64,
    opts: &PrefaultOptions,
    progress: Option<&dyn Fn(u64)>,
) -> Result<PrefaultReport, PrefaultError> {
    let old = file.size();
    if new_size <= old {
        return Err(PrefaultError::Range {
            path: file.path().to_path_buf(),
            start: old,
            end: new_size,
            file_size: old,
            page_size: file.page_size(),
        });
    }
    file.set_len(new_size)?;
    let result = prefault(file, old..new_size, opts, progress);
    if result.is_err() {
        if let Err(e) = file.set_len(old) {
            tracing::warn!(
                "shrinking {} back to {old} bytes: {e}",
                file.path().display()
            );
        }
    }
    result
}
