//! Deletions the host refused: what the core holds and journals afterwards.

use super::{lease_warm, phase, rec, release, warm, M2};
use crate::pool::core::{Action, Core, Phase};
use crate::pool::record::FileState;

/// Regression (found by the driver simulation once pool-file unlinks could fail, seed 1):
/// a released file whose scrub was to cut it (a size in demand) and whose proof then
/// failed took the kernel's path; its truncate worked and its unlink did not. It stayed
/// dirty at the cut size in the core while the journal said the size before.
#[test]
fn a_scrub_given_up_whose_file_cannot_be_deleted_is_journaled_as_the_core_holds_it() {
    let mut c = Core::with_files(vec![rec(1, 3 * M2, FileState::Dirty)], 100);
    c.begin_scrub(1, 2 * M2).unwrap();
    c.begin_delete(1).unwrap();
    // Truncated: nothing on the mount.
    let fix = c.delete_failed(1, Some(0)).unwrap();
    assert_eq!(fix, Some(Action::Journal(rec(1, 2 * M2, FileState::Dirty))));
    assert_eq!(phase(&c, 1), Some(Phase::Dirty));
}

/// Regression (found by the driver simulation once pool-file unlinks could fail, seed 28):
/// a released file whose proof failed was truncated by the kernel's path and not unlinked;
/// it stayed dirty with its last lease, the next round's proof passed, and the scrub of a
/// file of nothing journaled it warm at size 0. Truncated, it keeps no lease to prove.
#[test]
fn a_released_file_truncated_but_not_unlinked_is_never_proven_again() {
    let mut c = warm(1);
    let l = lease_warm(&mut c, 1, "vm");
    release(&mut c, l);
    assert!(c.get(1).unwrap().released().is_some());
    c.begin_delete(1).unwrap();
    c.delete_failed(1, Some(0)).unwrap();
    assert_eq!(phase(&c, 1), Some(Phase::Dirty));
    assert!(c.get(1).unwrap().released().is_none(), "history dropped");
}
