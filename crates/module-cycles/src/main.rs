//! `module-cycles DIR…`: the check of `tests/workspace.rs` for the packages
//! named, for a developer untangling a cycle. Exits 1 if any package has a
//! cycle or a file no tree reaches.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut failed = false;
    for dir in std::env::args().skip(1) {
        match module_cycles::check_package(dir.as_ref()) {
            Ok(report) => {
                println!(
                    "{dir}: {} modules, {} paths into the crate, {} cycles",
                    report.modules,
                    report.resolved,
                    report.cycles.len()
                );
                for cycle in &report.cycles {
                    print!("{cycle}");
                }
                for file in &report.unreached {
                    println!("  no module tree reaches {}", file.display());
                }
                failed |= !report.cycles.is_empty() || !report.unreached.is_empty();
            }
            Err(e) => {
                eprintln!("{dir}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
