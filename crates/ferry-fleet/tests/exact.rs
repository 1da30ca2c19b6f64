//! The planner against the best schedule found by trying every one, on
//! drains small enough for that: within 10% of it, and never better than
//! the network allows.

use ferry_fleet::exact::best_list_schedule;
use ferry_fleet::{generate, lower_bound, run, Planner};

#[test]
fn the_planner_comes_within_ten_percent_of_the_best_schedule_on_small_drains() {
    let mut worst: f64 = 1.0;
    for seed in 1..=6 {
        let fleet = generate::small(5, seed);
        let best = best_list_schedule(&fleet).unwrap();
        let planner = run(&fleet, &mut Planner::new(), 1).unwrap();
        assert_eq!(planner.failed, 0, "seed {seed}: {planner:?}");
        let ratio = planner.makespan_s / best.makespan_s;
        eprintln!(
            "seed {seed}: planner {:.2} s, best of {} schedules {:.2} s ({ratio:.3}), bound {:.2} s",
            planner.makespan_s,
            best.tried,
            best.makespan_s,
            lower_bound(&fleet)
        );
        // 5 VMs, 2 destinations each, 120 orders, 1 or 2 a link.
        assert_eq!(best.tried, 32 * 120 * 2, "seed {seed}");
        assert!(
            best.makespan_s >= lower_bound(&fleet) * 0.999,
            "seed {seed}"
        );
        assert!(
            ratio <= 1.10,
            "seed {seed}: planner {planner:?}, best {best:?}"
        );
        worst = worst.max(ratio);
    }
    eprintln!("worst planner / best: {worst:.3}");
}

#[test]
fn a_drain_too_large_to_search_is_refused() {
    let fleet = generate::small(ferry_fleet::exact::MAX_VMS + 1, 1);
    let e = best_list_schedule(&fleet).unwrap_err();
    assert!(e.to_string().contains("at most"), "{e}");
}
