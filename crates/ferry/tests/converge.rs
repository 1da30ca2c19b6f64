//! Convergence between two ferry processes: a guest that dirties faster
//! than the link converges under `auto`, `quota` and `dirty-limit` (both
//! backends), a reader keeps its progress under the per-vCPU policies, every
//! migration is proven as always, and a policy a backend cannot serve is
//! refused before anything starts.

mod common;
use common::*;

/// `ferry demo` of an uncapped 2 x 8 MiB guest over a 64 MiB/s link with a
/// 20 ms downtime target: it cannot converge without help.
fn busy_demo(backend: &str, converge: &str) -> std::process::Output {
    Ferry::demo()
        .on(backend)
        .mem("8M")
        .args(&[
            "--unthrottled",
            "--converge",
            converge,
            "--bandwidth",
            "64",
            "--downtime-ms",
            "20",
            "--warmup",
            "0.3",
        ])
        .run()
}

#[test]
fn auto_converge_throttles_a_guest_faster_than_the_link_on_both_backends() {
    for backend in backends("auto-converge") {
        let out = busy_demo(backend, "auto");
        assert_no_panic(&out);
        let j = last_json(&out);
        assert_verified(&j, &format!("{backend} auto"));
        assert_eq!(j["converge"], "auto", "{backend}: {j}");
        let steps = j["throttle_timeline"].as_array().map_or(0, |a| a.len());
        assert!(steps > 0, "{backend}: never throttled: {j}");
        assert_eq!(j["throttle_timeline"][0]["percent"], 20, "{backend}: {j}");
    }
}

#[test]
fn the_quota_policy_converges_a_busy_soft_guest() {
    let out = busy_demo("soft", "quota");
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, "soft quota");
    assert_eq!(j["converge"], "quota", "{j}");
    assert_eq!(j["converged"], true, "the round cap forced the stop: {j}");
    let timeline = j["throttle_timeline"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!timeline.is_empty(), "the quota never engaged: {j}");
    for step in &timeline {
        assert_eq!(step["percent"], 0, "quota never time-throttles: {j}");
        assert!(step["quota_bytes"].as_u64().unwrap_or(0) >= 4096, "{j}");
    }
    // The quota held the guest to the end: it ran free before the pause,
    // wherever the prediction left the link a page's time (64 MiB/s: 61
    // us) under the 20 ms target. (Its pages count only where first
    // dirtied since the last harvest: this writer's 8 MiB often all are.)
    let slack_ms = 20.0 - j["predicted_downtime_ms"].as_f64().unwrap_or(20.0);
    if slack_ms > 0.07 {
        assert!(j["settle_ms"].as_f64().unwrap_or(0.0) > 0.0, "{j}");
    }
}

#[test]
fn quota_on_kvm_without_the_dirty_ring_is_refused_before_anything_starts() {
    if !require_kvm("quota refusal on kvm") {
        return;
    }
    let out = Ferry::new("demo")
        .on("kvm")
        .args(&["--dirty-tracking", "bitmap", "--converge", "quota"])
        .run();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--converge quota: the quota policy needs a per-vCPU dirty meter")
            && err.contains("--dirty-tracking ring"),
        "{err}"
    );
    assert!(!err.contains("warming up"), "a guest booted: {err}");
}

#[test]
fn the_quota_spares_a_reader_vcpu_and_the_summary_shows_each_vcpus_share() {
    let out = Ferry::demo()
        .on("soft")
        .mem("8M")
        .args(&[
            "--unthrottled",
            "--readers",
            "1",
            "--converge",
            "quota",
            "--bandwidth",
            "64",
            "--downtime-ms",
            "20",
            "--warmup",
            "0.3",
        ])
        .run();
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, "soft quota with a reader");
    let shares = j["vcpu_shares"].as_array().cloned().unwrap_or_default();
    assert_eq!(shares.len(), 2, "{j}");
    for s in &shares {
        let runtime = s["runtime_pct"].as_f64().unwrap_or(-1.0);
        assert!((0.0..=100.0).contains(&runtime), "{j}");
        assert!(s["progress_pct"].as_f64().unwrap_or(-1.0) >= 0.0, "{j}");
    }
    // vCPU 1 only reads: it dirties nothing, so its quota never runs out.
    assert_eq!(shares[1]["runtime_pct"], 100.0, "the reader slept: {j}");
}

/// `ferry demo` on kvm with the dirty ring: a writer and a reader of 16 MiB
/// each, uncapped, over a 16 MiB/s link, under `policy`. Checks what both
/// per-vCPU policies promise (verified, the policy ran, the reader never
/// slept) and returns the summary.
fn ring_demo_with_a_reader(policy: &str) -> serde_json::Value {
    let out = Ferry::demo()
        .on("kvm")
        .mem("16M")
        .args(&[
            "--dirty-tracking",
            "ring",
            "--converge",
            policy,
            "--readers",
            "1",
            "--bandwidth",
            "16",
            "--warmup",
            "0.3",
        ])
        .run();
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, &format!("kvm {policy} with a reader"));
    assert_eq!(j["converge"], policy, "{j}");
    assert_eq!(
        j["vcpu_shares"][1]["runtime_pct"], 100.0,
        "the reader slept: {j}"
    );
    j
}

#[test]
fn on_kvm_each_vcpus_dirty_ring_meters_the_quota_and_a_reader_is_never_slowed() {
    if !require_kvm("quota on kvm") {
        return;
    }
    let j = ring_demo_with_a_reader("quota");
    let steps = j["throttle_timeline"].as_array().map_or(0, |t| t.len());
    assert!(steps > 0, "the quota never engaged: {j}");
}

#[test]
fn on_kvm_dirty_limit_converges_a_writer_faster_than_the_link_and_spares_a_reader() {
    if !require_kvm("dirty-limit on kvm") {
        return;
    }
    let j = ring_demo_with_a_reader("dirty-limit");
    assert_eq!(j["converged"], true, "the round cap forced the stop: {j}");
    let limits: Vec<u64> = j["throttle_timeline"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|s| s["limit_bytes_per_sec"].as_u64())
                .collect()
        })
        .unwrap_or_default();
    assert!(!limits.is_empty(), "the limit never engaged: {j}");
}

#[test]
fn on_soft_dirty_limit_converges_a_writer_faster_than_the_link_and_spares_a_reader() {
    // Like QEMU's, the limit is a time throttle capped at 99%: it bounds a
    // writer to 1% of its unthrottled speed, and the soft writer dirties
    // gigabytes a second. A 512 MiB/s writer over a 256 MiB/s link is within
    // its reach (an uncapped one over a slow link is not; the quota is).
    let out = Ferry::demo()
        .on("soft")
        .guest("64M", 512)
        .args(&[
            "--converge",
            "dirty-limit",
            "--readers",
            "1",
            "--bandwidth",
            "256",
            "--downtime-ms",
            "20",
            "--warmup",
            "0.3",
        ])
        .run();
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, "soft dirty-limit with a reader");
    assert_eq!(j["converged"], true, "the round cap forced the stop: {j}");
    let limited = j["throttle_timeline"]
        .as_array()
        .is_some_and(|t| t.iter().any(|s| s["limit_bytes_per_sec"].is_u64()));
    assert!(limited, "the limit never engaged: {j}");
    assert_eq!(
        j["vcpu_shares"][1]["runtime_pct"], 100.0,
        "the reader slept: {j}"
    );
}

/// The reader's (vCPU 1's) progress, in percent of its rate before the
/// migration, in a demo of an uncapped writer and a reader over a slow link
/// under `policy`.
fn reader_progress(backend: &str, policy: &str) -> f64 {
    let mut args = vec![
        "demo",
        "--json",
        "--backend",
        backend,
        "--converge",
        policy,
        "--readers",
        "1",
        "--bandwidth",
        "16",
        "--mem-per-vcpu",
        "16M",
        "--warmup",
        "0.5",
        // `none` never converges: a few rounds measure it.
        "--max-rounds",
        "4",
    ];
    if backend == "kvm" {
        args.extend(["--dirty-tracking", "ring"]);
    }
    let out = run(&args);
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, &format!("{backend} {policy} with a reader"));
    j["vcpu_shares"][1]["progress_pct"]
        .as_f64()
        .unwrap_or_else(|| panic!("no reader share: {j}"))
}

/// The median of three `reader_progress` runs.
fn median_reader_progress(backend: &str, policy: &str) -> f64 {
    let mut runs: Vec<f64> = (0..3).map(|_| reader_progress(backend, policy)).collect();
    runs.sort_by(f64::total_cmp);
    runs[1]
}

#[test]
#[ignore = "a rate comparison: noisy while other tests share the 2 cores; run alone with --ignored"]
fn under_quota_a_reader_keeps_at_least_90_percent_of_its_unthrottled_progress_on_kvm() {
    // On kvm the guest's own counters give a steady rate (on soft, a
    // reader's rate swings widely between identical runs on a 2-core host,
    // too much to compare; there the reader's runtime is checked).
    if !require_kvm("a reader's progress under quota on kvm") {
        return;
    }
    // Unthrottled: the same migration with no policy, the writer running
    // free, so both share the host the same way.
    let free = median_reader_progress("kvm", "none");
    let quota = median_reader_progress("kvm", "quota");
    assert!(
        quota >= 0.9 * free,
        "the reader made {quota:.1}% progress under quota, {free:.1}% unthrottled"
    );
}

#[test]
fn under_auto_the_reader_slows_down_with_the_writer_on_both_backends() {
    for backend in backends("auto with a reader") {
        let out = Ferry::demo()
            .on(backend)
            .mem("16M")
            .args(&[
                "--converge",
                "auto",
                "--readers",
                "1",
                "--bandwidth",
                "16",
                "--warmup",
                "0.3",
                "--max-rounds",
                "8",
            ])
            .run();
        assert_no_panic(&out);
        let j = last_json(&out);
        assert_verified(&j, &format!("{backend} auto with a reader"));
        for v in 0..2 {
            let runtime = j["vcpu_shares"][v]["runtime_pct"].as_f64().unwrap_or(100.0);
            assert!(runtime < 100.0, "{backend}: auto never slept vCPU {v}: {j}");
        }
    }
}

#[test]
fn the_quota_engages_within_the_full_pass_from_each_vcpus_dirty_count() {
    for backend in backends("the quota's first interval") {
        // The full pass of 32 MiB over 16 MiB/s lasts about 2 s: many
        // 100 ms policy intervals. The guest's first pass over its memory
        // in it takes as long (16 MiB/s of writes, twice the quota's
        // threshold), so that every interval meters new pages: an uncapped
        // writer on a loaded host can dirty all 32 MiB in one late first
        // interval, and then (the log not being reset within the pass)
        // nothing more for the meter to see until the round ends.
        let out = Ferry::demo()
            .on(backend)
            .guest("32M", 16)
            .args(&[
                "--dirty-tracking",
                "ring",
                "--converge",
                "quota",
                "--bandwidth",
                "16",
                "--vcpus",
                "1",
                "--warmup",
                "0.3",
            ])
            .run();
        assert_no_panic(&out);
        let j = last_json(&out);
        assert_verified(&j, &format!("{backend} quota"));
        let first = &j["throttle_timeline"][0];
        assert!(first["quota_bytes"].as_u64().is_some(), "{backend}: {j}");
        assert_eq!(
            first["round"], 0,
            "{backend}: engaged after the full pass: {j}"
        );
    }
}

/// Regression: under auto-converge the throttler kicks vCPUs often, and a
/// kick that landed while a vCPU thread reset its full dirty ring left
/// pages unprotected, so later writes to them were never sent (3 of 3
/// digests disagreed before the fix). A 1024-entry ring fills often.
#[test]
fn auto_converge_on_a_small_dirty_ring_loses_no_page() {
    if !require_kvm("auto-converge on the dirty ring") {
        return;
    }
    let out = Ferry::demo()
        .on("kvm")
        .mem("8M")
        .args(&[
            "--dirty-tracking",
            "ring",
            "--ring-entries",
            "1024",
            "--unthrottled",
            "--converge",
            "auto",
            "--bandwidth",
            "64",
            "--downtime-ms",
            "20",
            "--warmup",
            "0.3",
        ])
        .run();
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, "kvm auto on the ring");
}
