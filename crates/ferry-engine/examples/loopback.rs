//! Migrates a test VM between two threads over TCP loopback and prints the
//! summary: a quick throughput and downtime check of the engine alone, with no
//! backend. `cargo run --release -p ferry-engine --example loopback -- [MiB] [run]`
//! [connections] (`run` starts the test guest's writer; without it the guest
//! is idle).

#[path = "../tests/common/mod.rs"]
mod common;

use ferry_engine::{migrate, NoProgress};
use ferry_vm::Vm;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1024);
    let run = args.get(2).is_some_and(|a| a == "run");
    let connections = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(1);
    let mut config = common::config();
    config.data_bytes = mib << 20;
    let (to, dest) = common::spawn_receiver(common::quick_receive());
    let mut src = common::TestVm::new(&config).expect("source VM");
    if run {
        src.start().expect("start");
        std::thread::sleep(Duration::from_millis(200));
    }
    let opts = {
        let mut o = common::probed();
        o.connections = connections;
        o
    };
    let summary = migrate(&mut src, &to, &opts, &NoProgress);
    let dsum = dest.join().expect("destination thread").map(|(_, s)| s);
    match summary {
        Ok(s) => {
            let full = &s.memory.rounds[0];
            println!(
                "full pass: {} pages ({} zero) in {:.1} ms = {:.2} GiB/s of guest memory",
                full.pages,
                full.zero_pages,
                full.ms,
                (full.pages * 4096) as f64 / (full.ms / 1e3) / (1u64 << 30) as f64
            );
            println!(
                "downtime {:.2} ms (destination resume {:.3} ms), digest {:.1} ms, total {:.1} ms, rounds {}",
                s.downtime_ms,
                s.switchover.dest_resume_ms,
                s.switchover.digest_ms,
                s.total_ms,
                s.memory.rounds.len()
            );
            println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
        }
        Err(e) => println!("source: {}", e.chain()),
    }
    match dsum {
        Ok(d) => println!(
            "destination: {}",
            serde_json::to_string(&d).unwrap_or_default()
        ),
        Err(e) => println!("destination: {}", e.chain()),
    }
}
