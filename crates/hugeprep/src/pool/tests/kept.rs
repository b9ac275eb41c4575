//! Tests of the kept files: the keeper's turns of principals, kept names.

use super::*;

fn pinned(principal: &str, proven: Instant) -> KeptFile {
    KeptFile {
        at: KeptAt {
            page_size: PageSize::Size2M,
            name: format!("kept-{principal}"),
        },
        principal: Some(principal.into()),
        page_size: PageSize::Size2M,
        node: 0,
        bytes: 0,
        id: 0,
        lease: 0,
        since: proven,
        pinned: true,
        proven,
    }
}

#[test]
fn the_keeper_proves_pinned_files_by_turns_of_principals() {
    let t = Instant::now();
    // A tenant's 20 files, all unread for longer than the honest one's.
    let mut files: Vec<KeptFile> = (0..20)
        .map(|i| pinned("uid:65534", t + Duration::from_millis(i)))
        .collect();
    files.push(pinned("uid:65533", t + Duration::from_secs(1)));
    let mut unpinned = pinned("uid:65533", t);
    unpinned.pinned = false;
    files.push(unpinned);
    let turn = proof_turns(&files, PROOFS_PER_TURN);
    assert_eq!(turn.len(), PROOFS_PER_TURN);
    // The honest one's file is read in the first round, second after the tenant's oldest.
    assert_eq!(turn[..2], [0, 20]);
    // Then the tenant's, longest unread first; never an unpinned file.
    assert_eq!(turn[2..], [1, 2, 3, 4, 5, 6]);
}

#[test]
fn a_kept_name_holds_its_id_node_and_principal() {
    for p in [None, Some("uid:64055"), Some("token:nova cert:CN=a-b")] {
        let name = kept_name(7, 1, p);
        assert!(name.len() < 255, "{name}");
        assert_eq!(
            parse_kept_name(&name),
            Some((7, 1, p.map(str::to_owned))),
            "{name}"
        );
    }
    let long = "x".repeat(NAMED_PRINCIPAL + 1);
    assert_eq!(
        parse_kept_name(&kept_name(7, 0, Some(&long))),
        Some((7, 0, None))
    );
    for bad in [
        "p7",
        "kept-",
        "kept-7",
        "kept-x-n0",
        "kept-7-n0-abc",
        "kept-7-n0-zz",
    ] {
        assert_eq!(parse_kept_name(bad), None, "{bad}");
    }
}
