use super::*;

const G: u64 = 1 << 30;
/// Monday 2024-01-01 00:00 UTC.
const MONDAY: f64 = 1_704_067_200.0;

fn adaptive(node: Option<u32>, ps: PageSize, goal_bp: u32, ceiling: u64) -> Target {
    Target {
        page_size: ps,
        node,
        warm: 0,
        sizes: Vec::new(),
        flavors: Vec::new(),
        adaptive: Some(AdaptiveGoal { goal_bp, ceiling }),
    }
}

fn inputs(now_s: f64) -> Inputs {
    Inputs {
        now_s,
        pending: 0,
        refill_rate: 1e9,
        free_share: u64::MAX,
    }
}

#[test]
fn nothing_seen_keeps_nothing_warm() {
    let mut r = Registry::default();
    let mut targets = vec![adaptive(Some(0), PageSize::Size2M, 9900, 64 * G)];
    r.sync(&targets);
    assert_eq!(
        r.look((Some(0), PageSize::Size2M), &inputs(MONDAY)),
        Some(0)
    );
    r.apply(&mut targets);
    assert_eq!(targets[0].warm, 0);
    assert!(targets[0].sizes.is_empty());
    let report = r.report();
    assert_eq!(report.len(), 1);
    assert_eq!(report[0].goal_percent, 99.0);
    assert!(report[0].why.is_some());
}

#[test]
fn starts_raise_the_target_to_the_days_peak_need_then_the_plan() {
    let mut r = Registry::default();
    let mut targets = vec![
        adaptive(None, PageSize::Size2M, 9900, 64 * G),
        // A static target is no forecast's business.
        Target {
            adaptive: None,
            warm: 4 * G,
            sizes: vec![4 * G],
            ..adaptive(None, PageSize::Size1G, 9900, G)
        },
    ];
    r.sync(&targets);
    let key = (None, PageSize::Size2M);
    assert_eq!(r.look(key, &inputs(MONDAY + 9.0 * 3600.0)), Some(0));
    // Starts on node 0 count for the target of every node; 1G starts for none.
    let at = MONDAY + 9.0 * 3600.0 + 60.0;
    assert!(r.started(0, PageSize::Size2M, at, 4 * G, 1e9));
    assert!(r.started(0, PageSize::Size2M, at + 600.0, 3 * G + (1 << 20), 1e9));
    assert!(!r.started(0, PageSize::Size1G, at, 4 * G, 1e9));
    // Within the hour the plan (made with nothing seen) stands aside: the day's peak need,
    // one 4 GiB file (it serves the 3 GiB start too).
    let bytes = r.look(key, &inputs(at + 700.0)).unwrap();
    assert_eq!(bytes, 4 * G);
    let why = r.report()[0].why.clone().unwrap();
    assert!(why.recent_raised, "{why:?}");
    assert_eq!(why.bucket, "weekday 09h");
    r.apply(&mut targets);
    assert_eq!(targets[0].warm, 4 * G);
    let flavors: Vec<(u64, u32)> = targets[0]
        .flavors
        .iter()
        .map(|f| (f.size, f.count))
        .collect();
    assert_eq!(flavors, vec![(4 * G, 1)]);
    assert_eq!(targets[1].warm, 4 * G, "static target untouched");
    // An hour on, the plan is made from the starts seen: a target for 09h, whole pages.
    let bytes = r.look(key, &inputs(at + 3700.0)).unwrap();
    assert!(
        bytes > 0 && bytes <= 64 * G && bytes % (2 << 20) == 0,
        "{bytes}"
    );
    assert!(r.report()[0].why.as_ref().unwrap().planned > 0);
    assert_eq!(r.report()[0].starts, 2);
}

#[test]
fn the_ceiling_and_the_free_share_cut_it() {
    let mut r = Registry::default();
    let targets = vec![adaptive(Some(0), PageSize::Size2M, 10_000, 2 * G)];
    r.sync(&targets);
    let key = (Some(0), PageSize::Size2M);
    // Three 1 GiB starts at once: three files wanted, two under the ceiling.
    for i in 0..3 {
        r.started(0, PageSize::Size2M, MONDAY + f64::from(i) * 1e-3, G, 1e9);
    }
    assert_eq!(r.look(key, &inputs(MONDAY + 1.0)), Some(2 * G));
    assert_eq!(
        r.report()[0].why.as_ref().unwrap().capped_by,
        Some("ceiling")
    );
    let tight = Inputs {
        free_share: G + 1,
        ..inputs(MONDAY + 2.0)
    };
    // Cut to the free share in whole files.
    assert_eq!(r.look(key, &tight), Some(G));
    assert_eq!(
        r.report()[0].why.as_ref().unwrap().capped_by,
        Some("free memory")
    );
}

#[test]
fn a_node_target_wins_and_goals_follow_a_reload() {
    let mut r = Registry::default();
    let mut targets = vec![
        adaptive(None, PageSize::Size2M, 9900, 8 * G),
        adaptive(Some(1), PageSize::Size2M, 9900, 8 * G),
    ];
    r.sync(&targets);
    assert_eq!(
        r.key_for(1, PageSize::Size2M),
        Some((Some(1), PageSize::Size2M))
    );
    assert_eq!(
        r.key_for(0, PageSize::Size2M),
        Some((None, PageSize::Size2M))
    );
    r.started(1, PageSize::Size2M, MONDAY, G, 1e9);
    assert_eq!(r.report()[1].starts, 1);
    // A new goal keeps what was seen; a target dropped is forgotten.
    targets[1].adaptive = Some(AdaptiveGoal {
        goal_bp: 9500,
        ceiling: 8 * G,
    });
    targets.remove(0);
    r.sync(&targets);
    assert_eq!(r.keys(), vec![(Some(1), PageSize::Size2M)]);
    assert_eq!(r.report()[0].starts, 1);
    assert_eq!(r.report()[0].goal_percent, 95.0);
    assert_eq!(r.key_for(0, PageSize::Size2M), None);
}
