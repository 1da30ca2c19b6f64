//! Every policy drains small fleets through the simulator: every VM moves,
//! each platform's caps hold, hosts never overfill, placement constraints
//! hold, and no drain beats the network's bound.

use ferry_fleet::sim::{Policy, Start, View};
use ferry_fleet::{
    generate, lower_bound, policies, run, Admission, Caps, Fleet, FleetError, Network, Planner,
};

mod common;
use common::*;

#[test]
fn every_policy_moves_every_vm_off_the_drained_hosts_and_none_beats_the_bound() {
    let fleet = two_racks();
    let bound = lower_bound(&fleet);
    // Rack 0's uplink: 3 GB/s / 3 = 1 GB/s for 20 GiB.
    assert!((bound - 20.0 * GIB as f64 / 1e9).abs() < 1e-6, "{bound}");
    for mut p in policies() {
        let o = run(&fleet, p.as_mut(), 1).unwrap();
        assert_eq!(o.migrations, 8, "{}", o.policy);
        assert_eq!(o.failed, 0, "{}: {o:?}", o.policy);
        for v in &o.vms {
            let to: usize = v.to[1..].parse().unwrap();
            assert!(to >= 3, "{}: {} went to a drained host", o.policy, v.vm);
        }
        assert!(
            o.makespan_s >= bound * 0.999,
            "{}: {} < {bound}",
            o.policy,
            o.makespan_s
        );
    }
}

#[test]
fn the_platforms_caps_hold() {
    let fleet = two_racks();
    for (mut a, cluster, per_host) in [
        (Admission::kubevirt(), 5, 2),
        (Admission::hco(), 5, 1),
        (Admission::nova(), usize::MAX, 1),
    ] {
        let o = run(&fleet, &mut a, 1).unwrap();
        assert!(o.peak_concurrency <= cluster.min(3 * per_host), "{o:?}");
        // Out of one host, at any moment.
        for v in &o.vms {
            let t = (v.start_s + v.end_s) / 2.0;
            let at_once = o
                .vms
                .iter()
                .filter(|w| w.from == v.from && w.start_s <= t && t < w.end_s)
                .count();
            assert!(
                at_once <= per_host,
                "{}: {at_once} out of {}",
                o.policy,
                v.from
            );
        }
    }
}

#[test]
fn the_planner_beats_one_at_a_time_per_host_where_loads_differ() {
    // One drained host holds most of the memory: sent one at a time per
    // host, the others finish early and the uplink idles while it sends.
    let mut fleet = two_racks();
    for v in fleet.vms.iter_mut().take(6) {
        v.host = 0;
    }
    let mut planner = Planner::new();
    let p = run(&fleet, &mut planner, 1).unwrap();
    let n = run(&fleet, &mut Admission::nova(), 1).unwrap();
    assert!(
        p.makespan_s <= n.makespan_s,
        "planner {} nova {}",
        p.makespan_s,
        n.makespan_s
    );
}

#[test]
fn a_destination_never_overfills_and_constraints_hold() {
    let mut fleet = two_racks();
    // Room for exactly the drained memory (20 GiB) over the three hosts.
    for h in fleet.hosts.iter_mut().skip(3) {
        h.memory_bytes = 8 * GIB;
    }
    fleet.vms[0].pinned = Some(vec![5]);
    fleet.vms[1].forbidden = vec![3, 4];
    fleet.vms[2].anti_affinity = Some("db".into());
    fleet.vms[3].anti_affinity = Some("db".into());
    for mut p in policies() {
        let o = run(&fleet, p.as_mut(), 1).unwrap();
        let to = |name: &str| o.vms.iter().find(|v| v.vm == name).unwrap().to.clone();
        assert_eq!(to("vm0"), "h5", "{}", o.policy);
        assert_eq!(to("vm1"), "h5", "{}", o.policy);
        assert_ne!(to("vm2"), to("vm3"), "{}", o.policy);
        for h in ["h3", "h4", "h5"] {
            let gib: u64 = o
                .vms
                .iter()
                .filter(|v| v.to == h)
                .map(|v| {
                    fleet
                        .vms
                        .iter()
                        .find(|w| w.name == v.vm)
                        .unwrap()
                        .memory_bytes
                        / GIB
                })
                .sum();
            assert!(gib <= 8, "{}: {gib} GiB on {h}", o.policy);
        }
    }
}

#[test]
fn a_vm_with_nowhere_to_go_is_named_before_anything_hangs() {
    let mut fleet = two_racks();
    fleet.vms[7].memory_bytes = 1 << 50;
    for mut p in policies() {
        match run(&fleet, p.as_mut(), 1) {
            Err(FleetError::NoRoom(why)) => assert!(why.contains("vm7"), "{why}"),
            other => panic!("{}: {other:?}", p.name()),
        }
    }
}

#[test]
fn bad_fleets_are_refused_with_what_is_wrong() {
    let mut fleet = two_racks();
    fleet.vms[0].host = 9;
    let err = run(&fleet, &mut Planner::new(), 1).unwrap_err();
    assert!(err.to_string().contains("vm0 is on host 9"), "{err}");
    let mut fleet = two_racks();
    fleet.hosts[2].nic_bytes_per_sec = 0.0;
    let err = run(&fleet, &mut Planner::new(), 1).unwrap_err();
    assert!(err.to_string().contains("NIC rate"), "{err}");
}

#[test]
fn a_seed_draws_one_fleet_and_drains_its_first_rack() {
    let (a, b) = (generate::fat_tree(128, 7), generate::fat_tree(128, 7));
    assert_eq!(a, b);
    assert_ne!(a, generate::fat_tree(128, 8));
    assert!((20..=40).contains(&a.drain.len()));
    assert!(a.drain.iter().all(|&h| a.hosts[h].rack == 0));
    assert!(a
        .hosts
        .iter()
        .enumerate()
        .all(|(i, h)| h.rack != 0 || a.drain.contains(&i)));
    for v in &a.vms {
        assert!(
            [2, 4, 8, 16, 32, 64].contains(&(v.memory_bytes / GIB)),
            "{v:?}"
        );
        let rate = v.dirty_rate() / MIB;
        assert!((1.0..=400.0).contains(&rate), "{rate}");
    }
}

/// A policy that starts nothing: the simulator says so rather than spin.
struct Idle;

impl Policy for Idle {
    fn name(&self) -> String {
        "idle".into()
    }
    fn admit(&mut self, _: &View, _: &[Option<usize>]) -> Vec<Start> {
        Vec::new()
    }
}

#[test]
fn a_policy_that_starts_nothing_is_reported_not_waited_on() {
    let err = run(&two_racks(), &mut Idle, 1).unwrap_err();
    assert!(
        err.to_string()
            .contains("idle: nothing runs and 8 VM(s) wait"),
        "{err}"
    );
}

#[test]
fn the_planner_keeps_to_the_fleets_own_caps() {
    let mut fleet = two_racks();
    fleet.caps = Caps {
        per_cluster: Some(2),
        outbound_per_host: Some(1),
        inbound_per_host: Some(1),
    };
    let o = run(&fleet, &mut Planner::new(), 1).unwrap();
    assert_eq!(o.migrations, 8);
    assert!(o.peak_concurrency <= 2, "{o:?}");
    for v in &o.vms {
        let t = (v.start_s + v.end_s) / 2.0;
        let during = |w: &&ferry_fleet::VmOutcome| w.start_s <= t && t < w.end_s;
        assert!(
            o.vms
                .iter()
                .filter(during)
                .filter(|w| w.from == v.from)
                .count()
                <= 1,
            "{o:?}"
        );
        assert!(
            o.vms.iter().filter(during).filter(|w| w.to == v.to).count() <= 1,
            "{o:?}"
        );
    }
    fleet.caps.per_cluster = Some(0);
    let err = run(&fleet, &mut Planner::new(), 1).unwrap_err();
    assert!(
        err.to_string().contains("caps.per_cluster must be above 0"),
        "{err}"
    );
}

/// One host drained of two 1 GiB VMs over 1 GB/s NICs: one idle, one
/// whose two vCPUs dirty 2 GiB/s in all, faster than the link: it cannot
/// converge without a throttle.
fn a_busy_vm_beside_an_idle_one() -> Fleet {
    Fleet {
        hosts: (0..3).map(|i| host(i, 0, 64)).collect(),
        network: Network::Flat,
        vms: vec![vm(0, 0, 1, 0.0), vm(1, 0, 1, 2048.0)],
        drain: vec![0],
        caps: Default::default(),
    }
}

#[test]
fn kubevirts_own_defaults_cancel_a_vm_that_cannot_converge_and_it_stays() {
    let fleet = a_busy_vm_beside_an_idle_one();
    let mut p = ferry_fleet::policy_named("kubevirt-default").unwrap();
    let o = run(&fleet, p.as_mut(), 1).unwrap();
    assert_eq!(o.migrations, 2, "{o:?}");
    assert_eq!(o.failed, 1, "{o:?}");
    let busy = o.vms.iter().find(|v| v.vm == "vm1").unwrap();
    assert!(busy.gave_up && !busy.converged, "{busy:?}");
    // 150 s per GiB, from its start (its setup included).
    let took = busy.end_s - busy.start_s;
    assert!((150.0..151.0).contains(&took), "{busy:?}");
    let idle = o.vms.iter().find(|v| v.vm == "vm0").unwrap();
    assert!(!idle.gave_up && idle.converged, "{idle:?}");
    // Under ferry's default convergence the same schedule moves both.
    let mut k = ferry_fleet::policy_named("kubevirt").unwrap();
    let o = run(&fleet, k.as_mut(), 1).unwrap();
    assert_eq!(o.failed, 0, "{o:?}");
}

#[test]
fn the_planner_tries_one_and_two_migrations_a_link_and_keeps_the_quicker() {
    for fleet in [a_busy_vm_beside_an_idle_one(), two_racks()] {
        let auto = run(&fleet, &mut Planner::new(), 1).unwrap();
        let one = run(&fleet, &mut Planner::per_link(1), 1).unwrap();
        let two = run(&fleet, &mut Planner::per_link(2), 1).unwrap();
        let best = one.makespan_s.min(two.makespan_s);
        assert!(
            (auto.makespan_s - best).abs() < 1e-9,
            "{auto:?} {one:?} {two:?}"
        );
        assert!(one.peak_concurrency <= two.peak_concurrency);
    }
}
