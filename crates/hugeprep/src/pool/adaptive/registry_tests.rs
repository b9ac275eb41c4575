use super::*;
use std::collections::BTreeMap;

const OP: Starter<'static> = Starter::Operator;

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

/// A look as the driver makes it: the due plans first, then the look.
fn look(r: &mut Registry, key: Key, inputs: &Inputs) -> Option<u64> {
    r.replan_due(inputs.now_s);
    r.look(key, inputs, &[])
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
        look(&mut r, (Some(0), PageSize::Size2M), &inputs(MONDAY)),
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
    assert_eq!(look(&mut r, key, &inputs(MONDAY + 9.0 * 3600.0)), Some(0));
    // Starts on node 0 count for the target of every node; 1G starts for none.
    let at = MONDAY + 9.0 * 3600.0 + 60.0;
    assert!(r.started(0, PageSize::Size2M, OP, at, 4 * G, 1e9));
    assert!(r.started(0, PageSize::Size2M, OP, at + 600.0, 3 * G + (1 << 20), 1e9));
    assert!(!r.started(0, PageSize::Size1G, OP, at, 4 * G, 1e9));
    // Within the hour the plan (made with nothing seen) stands aside: the day's peak need,
    // one 4 GiB file (it serves the 3 GiB start too).
    let bytes = look(&mut r, key, &inputs(at + 700.0)).unwrap();
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
    let bytes = look(&mut r, key, &inputs(at + 3700.0)).unwrap();
    assert!(
        bytes > 0 && bytes <= 64 * G && bytes % (2 << 20) == 0,
        "{bytes}"
    );
    assert!(r.report()[0].why.as_ref().unwrap().planned > 0);
    assert_eq!(r.report()[0].starts, 2);
}

#[test]
fn known_demand_is_a_file_of_each_due_vms_size() {
    let mut targets = vec![adaptive(Some(0), PageSize::Size2M, 9900, 64 * G)];
    let mut r = Registry::default();
    r.sync(&targets);
    let key = (Some(0), PageSize::Size2M);
    // Nothing seen yet: only the two VMs Placement says are coming, 4 GiB and 2 GiB.
    r.replan_due(MONDAY);
    assert_eq!(r.look(key, &inputs(MONDAY), &[4 * G, 2 * G]), Some(6 * G));
    assert_eq!(r.report()[0].why.as_ref().unwrap().pending, 6 * G);
    r.apply(&mut targets);
    let files: Vec<(u64, u32)> = targets[0]
        .flavors
        .iter()
        .map(|f| (f.size, f.count))
        .collect();
    assert_eq!(files, [(4 * G, 1), (2 * G, 1)]);
}

#[test]
fn the_ceiling_and_the_free_share_cut_it() {
    let mut r = Registry::default();
    let targets = vec![adaptive(Some(0), PageSize::Size2M, 10_000, 2 * G)];
    r.sync(&targets);
    let key = (Some(0), PageSize::Size2M);
    // Three 1 GiB starts at once: three files wanted, two under the ceiling.
    for i in 0..3 {
        r.started(
            0,
            PageSize::Size2M,
            OP,
            MONDAY + f64::from(i) * 1e-3,
            G,
            1e9,
        );
    }
    assert_eq!(look(&mut r, key, &inputs(MONDAY + 1.0)), Some(2 * G));
    assert_eq!(
        r.report()[0].why.as_ref().unwrap().capped_by,
        Some("ceiling")
    );
    let tight = Inputs {
        free_share: G + 1,
        ..inputs(MONDAY + 2.0)
    };
    // Cut to the free share in whole files.
    assert_eq!(look(&mut r, key, &tight), Some(G));
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
    r.started(1, PageSize::Size2M, OP, MONDAY, G, 1e9);
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

/// Feeds a week of honest starts (2 GiB every 10 minutes of the working hours) from the
/// operator, and a lessee's bursts of `burst` starts of `bytes` one second apart, every
/// `every_s` seconds of every hour, made as `who`; then plans and looks at Monday 10h of
/// the next week.
fn week_with(lessee: Option<(Starter<'_>, u64, u32, f64)>) -> (u64, AdaptiveStatus) {
    let mut r = Registry::default();
    r.sync(&[adaptive(Some(0), PageSize::Size2M, 9900, 64 * G)]);
    let key = (Some(0), PageSize::Size2M);
    let mut t = MONDAY;
    while t < MONDAY + 7.0 * 86_400.0 {
        let hour = ((t - MONDAY) / 3600.0) as u64 % 24;
        if (8..18).contains(&hour) && (t as u64) % 600 == 0 {
            r.started(0, PageSize::Size2M, OP, t, 2 * G, 1e9);
        }
        if let Some((who, bytes, burst, every_s)) = lessee {
            if (t - MONDAY) % every_s == 0.0 {
                for k in 0..burst {
                    r.started(0, PageSize::Size2M, who, t + f64::from(k), bytes, 1e9);
                }
            }
        }
        t += 60.0;
    }
    let next_monday_10h = MONDAY + 7.0 * 86_400.0 + 10.0 * 3600.0;
    let bytes = look(&mut r, key, &inputs(next_monday_10h)).unwrap();
    (bytes, r.report().remove(0))
}

#[test]
fn one_tenants_churn_moves_the_target_by_one_lease_an_hour_only() {
    let tenant = Starter::Tenant("uid:1000", 1);
    let (honest, _) = week_with(None);
    assert_eq!(honest, 2 * G);
    // Churn: five 16 GiB leases a second apart, every minute; counted whole, their needs
    // stack up to the ceiling in every hour of the week.
    let (whole, _) = week_with(Some((OP, 16 * G, 5, 60.0)));
    // (In whole files under the ceiling: three of 16 GiB and the honest 2 GiB ones.)
    assert!(
        whole >= 48 * G,
        "the operator's own churn counts whole: {whole}"
    );
    let (churned, st) = week_with(Some((tenant, 16 * G, 5, 60.0)));
    assert_eq!(st.starts_not_counted, 7 * 24 * 299, "{st:?}");
    // One lease of its own an hour, on top of an honest start at the same moment at most.
    assert!(churned <= 18 * G, "churn stacked past one lease: {st:?}");
    // Many small spaced leases: counted whole they would be most of every hour's samples.
    let (small, st) = week_with(Some((tenant, 2 << 20, 1, 120.0)));
    assert_eq!(st.starts_not_counted, 7 * 24 * 29, "{st:?}");
    assert!(small >= honest, "small leases lowered the target: {st:?}");
}

/// Two registries fed a day of starts, one planning in place, the other on a copy taken at
/// `at_s` while `during` more starts are counted: they look the same afterwards.
#[test]
fn a_plan_made_on_a_copy_keeps_the_starts_counted_meanwhile() {
    let targets = [adaptive(Some(0), PageSize::Size2M, 9900, 64 * G)];
    let key = (Some(0), PageSize::Size2M);
    let (mut here, mut copy) = (Registry::default(), Registry::default());
    here.sync(&targets);
    copy.sync(&targets);
    let starts: Vec<(f64, u64)> = (0..200u64)
        .map(|i| (MONDAY + i as f64 * 431.0, (1 + i % 7) * G))
        .collect();
    let at_s = starts[150].0;
    for &(t, b) in &starts[..150] {
        here.started(0, PageSize::Size2M, OP, t, b, 1e8);
        copy.started(0, PageSize::Size2M, OP, t, b, 1e8);
    }
    here.replan_due(at_s);
    let mut replans = copy.take_due(at_s);
    assert_eq!(replans.len(), 1);
    assert!(copy.take_due(at_s + 1.0).is_empty(), "one plan at a time");
    for &(t, b) in &starts[150..] {
        here.started(0, PageSize::Size2M, OP, t, b, 1e8);
        copy.started(0, PageSize::Size2M, OP, t, b, 1e8);
    }
    let mut replan = replans.remove(0);
    replan.make();
    assert!(copy.install(replan));
    let now = inputs(starts[199].0 + 60.0);
    assert_eq!(here.look(key, &now, &[]), copy.look(key, &now, &[]));
    assert_eq!(here.report(), copy.report());
    assert!(copy.report()[0].why.as_ref().unwrap().planned > 0);
}

#[test]
fn a_plan_for_an_old_goal_is_dropped_and_made_again() {
    let mut targets = vec![adaptive(Some(0), PageSize::Size2M, 9900, 64 * G)];
    let mut r = Registry::default();
    r.sync(&targets);
    r.started(0, PageSize::Size2M, OP, MONDAY, 4 * G, 1e9);
    let mut replans = r.take_due(MONDAY + 1.0);
    targets[0].adaptive = Some(AdaptiveGoal {
        goal_bp: 9000,
        ceiling: 64 * G,
    });
    r.sync(&targets);
    let mut replan = replans.remove(0);
    replan.make();
    assert!(!r.install(replan), "made for the old goal");
    assert_eq!(r.take_due(MONDAY + 2.0).len(), 1, "due again");
}

#[test]
fn what_was_seen_is_restored_into_targets_that_have_counted_nothing() {
    let targets = [adaptive(Some(0), PageSize::Size2M, 9900, 64 * G)];
    let key = (Some(0), PageSize::Size2M);
    let mut before = Registry::default();
    before.sync(&targets);
    before.started(0, PageSize::Size2M, OP, MONDAY, 6 * G, 1e9);
    let saved: BTreeMap<Key, SavedForecast> = before.saved().into_iter().collect();
    let mut after = Registry::default();
    after.sync(&targets);
    let outcomes = after.restore(saved.clone(), MONDAY + 60.0);
    assert_eq!(outcomes, vec![(key, Some(Ok(())))]);
    let now = inputs(MONDAY + 120.0);
    assert_eq!(
        look(&mut after, key, &now),
        Some(6 * G),
        "the day's peak kept"
    );
    // A target that counted a start keeps its own; a place with no target is left out.
    let mut busy = Registry::default();
    busy.sync(&targets);
    busy.started(0, PageSize::Size2M, OP, MONDAY, G, 1e9);
    let mut more = saved.clone();
    more.insert((Some(3), PageSize::Size2M), saved[&key].clone());
    let outcomes = busy.restore(more, MONDAY + 60.0);
    assert_eq!(
        outcomes,
        vec![(key, None), ((Some(3), PageSize::Size2M), None)]
    );
    // A forecast out of bounds is refused by field.
    let mut bad = saved;
    bad.get_mut(&key).unwrap().weeks.clear();
    let mut fresh = Registry::default();
    fresh.sync(&targets);
    let outcomes = fresh.restore(bad, MONDAY);
    assert_eq!(
        outcomes[0].1.as_ref().unwrap().as_ref().unwrap_err().field,
        "weeks"
    );
}
