//! The experiments at their default (full) sizes. Not part of the test suite:
//! run with `cargo test --release -p ferry-experiments --test seeds -- --ignored --nocapture <name>`
//! to print the tables (the CLI's `ferry bench` calls the same functions).

use ferry_experiments::soft::{write_protect, zap};

fn out_dir() -> std::path::PathBuf {
    std::env::temp_dir().join("ferry-soft-bench")
}

#[test]
#[ignore = "benchmark: prints numbers, run on demand"]
fn zap_default() {
    let r = zap::zap_experiment(&zap::ZapOpts::default()).unwrap();
    println!("{}", r.render());
    r.write(&out_dir()).unwrap();
}

#[test]
#[ignore = "benchmark: prints numbers, run on demand"]
fn write_protect_default() {
    let r = write_protect::write_protect_experiment(&write_protect::WriteProtectOpts::default())
        .unwrap();
    println!("{}", r.render());
    r.write(&out_dir()).unwrap();
}

#[test]
#[ignore = "benchmark: prints numbers, run on demand"]
fn dirty_log_default() {
    let env = |name: &str, default: u64| -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let opts = ferry_experiments::soft::dirty_log::DirtyLogOpts {
        exit_cost_ns: env("FERRY_EXIT_NS", ferry_soft::hw_cost::SEED_EXIT_COST_NS),
        tlbi_cost_ns: env("FERRY_TLBI_NS", ferry_soft::hw_cost::SEED_BROADCAST_TLBI_NS),
        ..Default::default()
    };
    let r = ferry_experiments::soft::dirty_log::dirty_log_experiment(&opts).unwrap();
    println!("{}", r.render());
    r.write(&out_dir()).unwrap();
}
