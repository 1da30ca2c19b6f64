//! `ferry bench dirty-log` on the kvm backend: the shape of the kernel's
//! `dirty_log_perf_test`, for each KVM dirty-tracking mode.
//!
//! Like the selftest, vCPUs stop at an iteration barrier (the guest's pass
//! limit, a spin in guest memory with no exit), so each iteration's pass starts
//! with every page re-protected and the harvest never races the guest:
//!
//! ```text
//!  populate (pass 1) ─ steady pass, logging off (pass 2) ─ enable logging
//!  ─ { pass under logging ─ get + clear (or harvest + reset) } × iterations ─ disable
//! ```

use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::{KvmVm, Program, Role};
use ferry_memstress::VmConfig;
use ferry_memstress::{read_progress, set_pass_limit};
use ferry_report::{Plot, Report, Series, Table};
use ferry_vm::{DirtyLog, DirtyPages, Vm};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Results of one dirty-tracking mode.
#[derive(Debug, Serialize)]
pub struct ModeResult {
    /// The dirty-tracking mode (bitmap, clear, ring).
    pub mode: String,
    /// The guest's first pass over its memory, in ms.
    pub populate_ms: f64,
    /// A pass with logging off, in ms: the baseline.
    pub steady_pass_ms: f64,
    /// Turning dirty logging on, in ms.
    pub enable_ms: f64,
    /// Each logged pass, in ms.
    pub iteration_ms: Vec<f64>,
    /// Each harvest's get (the log, the ring walk), in ms.
    pub get_ms: Vec<f64>,
    /// Each harvest's clear (re-protection), in ms.
    pub clear_ms: Vec<f64>,
    /// Pages each harvest found.
    pub pages_harvested: Vec<u64>,
    /// Turning dirty logging off, in ms.
    pub disable_ms: f64,
    /// Mean logged pass time per written page per vCPU, in µs.
    pub us_per_written_page: f64,
    /// Same for the steady pass with logging off.
    pub steady_us_per_written_page: f64,
    /// Stamps the guest found wrong (0 unless a page was lost).
    pub guest_mismatches: u64,
}

/// Results of the whole experiment.
#[derive(Debug, Serialize)]
pub struct DirtyLogResults {
    /// vCPUs of the guest.
    pub vcpus: u32,
    /// Memory each vCPU writes.
    pub bytes_per_vcpu: u64,
    /// Share of accesses that write, in percent.
    pub write_percent: u8,
    /// Logged passes per mode.
    pub iterations: u32,
    /// The guest RAM's backing.
    pub backing: String,
    /// One result per dirty-tracking mode.
    pub modes: Vec<ModeResult>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs the guest until every vCPU has completed `pass`, and returns how long
/// that took. Fails if a vCPU dies or nothing moves for a minute.
fn run_to_pass(vm: &KvmVm, pass: u64) -> Result<Duration, String> {
    let vcpus = vm.config().workload.vcpus;
    set_pass_limit(vm.ram(), vcpus, pass).map_err(|e| e.to_string())?;
    let start = Instant::now();
    loop {
        vm.check_health().map_err(|e| e.to_string())?;
        let p = read_progress(vm.ram(), vcpus).map_err(|e| e.to_string())?;
        if p.iter().all(|v| v.passes >= pass) {
            return Ok(start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("guest stuck before pass {pass}: {p:?}"));
        }
        // Sleep, don't spin: on a 2-core host a spinning poller steals a
        // vCPU's core and inflates every pass time.
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Runs one mode with `program` as the guest (memstress, or the probe's bare
/// write loop for calibration).
pub fn run_mode(
    config: &VmConfig,
    mode: DirtyTracking,
    iterations: u32,
    program: Program,
) -> Result<ModeResult, String> {
    if program == Program::WriteList {
        return Err("the write-list program makes no passes for the benchmark to time".into());
    }
    let mut vm = KvmVm::with_program(config.clone(), mode, Role::Source, program)
        .map_err(|e| e.to_string())?;
    let w = &config.workload;
    set_pass_limit(vm.ram(), w.vcpus, 1).map_err(|e| e.to_string())?;
    vm.start().map_err(|e| e.to_string())?;
    let populate = run_to_pass(&vm, 1)?;
    let steady = run_to_pass(&vm, 2)?;

    let t = Instant::now();
    vm.start_dirty_log().map_err(|e| e.to_string())?;
    let enable = t.elapsed();

    let mut result = ModeResult {
        mode: match program {
            Program::Memstress => mode.name().to_string(),
            Program::RawWrites => format!("probe loop, {}", mode.name()),
            Program::WriteList => format!("write list, {}", mode.name()),
        },
        populate_ms: ms(populate),
        steady_pass_ms: ms(steady),
        enable_ms: ms(enable),
        iteration_ms: vec![],
        get_ms: vec![],
        clear_ms: vec![],
        pages_harvested: vec![],
        disable_ms: 0.0,
        us_per_written_page: 0.0,
        steady_us_per_written_page: 0.0,
        guest_mismatches: 0,
    };
    let mut dirty = DirtyPages::new(vm.ram().pages());
    for i in 0..u64::from(iterations) {
        let pass = run_to_pass(&vm, 3 + i)?;
        dirty.clear();
        let stats = vm.harvest_dirty(&mut dirty).map_err(|e| e.to_string())?;
        result.iteration_ms.push(ms(pass));
        result.get_ms.push(stats.get_ns as f64 / 1e6);
        result.clear_ms.push(stats.clear_ns as f64 / 1e6);
        result.pages_harvested.push(stats.pages);
    }
    let t = Instant::now();
    vm.stop_dirty_log().map_err(|e| e.to_string())?;
    result.disable_ms = ms(t.elapsed());
    vm.pause().map_err(|e| e.to_string())?;
    let progress = read_progress(vm.ram(), w.vcpus).map_err(|e| e.to_string())?;
    result.guest_mismatches = progress.iter().map(|p| p.mismatches).sum();

    let written_per_vcpu = match program {
        Program::Memstress => {
            (w.accesses_per_pass() as f64 * f64::from(w.write_percent) / 100.0).max(1.0)
        }
        // The write-list program is refused above.
        Program::RawWrites | Program::WriteList => w.pages_per_vcpu() as f64,
    };
    let mean_iter =
        result.iteration_ms.iter().sum::<f64>() / result.iteration_ms.len().max(1) as f64;
    result.us_per_written_page = mean_iter * 1e3 / written_per_vcpu;
    result.steady_us_per_written_page = result.steady_pass_ms * 1e3 / written_per_vcpu;
    Ok(result)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Builds the report from the results of every mode.
pub fn report(results: DirtyLogResults) -> Report<DirtyLogResults> {
    let mut table = Table::new(
        format!(
            "dirty-log (kvm): {} vCPUs x {} MiB, {}% writes, {} iterations, {} backing",
            results.vcpus,
            results.bytes_per_vcpu >> 20,
            results.write_percent,
            results.iterations,
            results.backing
        ),
        &[
            "mode",
            "populate ms",
            "enable ms",
            "pass off ms",
            "pass logged ms",
            "us/page off",
            "us/page logged",
            "get ms",
            "clear ms",
            "disable ms",
            "mismatches",
        ],
    );
    for m in &results.modes {
        table.row(vec![
            m.mode.clone(),
            format!("{:.1}", m.populate_ms),
            format!("{:.2}", m.enable_ms),
            format!("{:.1}", m.steady_pass_ms),
            format!("{:.1}", mean(&m.iteration_ms)),
            format!("{:.3}", m.steady_us_per_written_page),
            format!("{:.3}", m.us_per_written_page),
            format!("{:.3}", mean(&m.get_ms)),
            format!("{:.3}", mean(&m.clear_ms)),
            format!("{:.2}", m.disable_ms),
            m.guest_mismatches.to_string(),
        ]);
    }
    table.note("pass off = one pass with dirty logging off; pass logged = mean pass after each re-protect.");
    table.note("us/page = pass time / pages written per vCPU (vCPUs run in parallel).");
    table.note("probe loop = the host probe's bare guest (one u64 per page, nothing else): the raw cost of a write-protection fault here, today.");
    if let Some(raw) = results
        .modes
        .iter()
        .find(|m| m.mode.starts_with("probe loop"))
    {
        for m in results
            .modes
            .iter()
            .filter(|m| !m.mode.starts_with("probe loop"))
        {
            table.note(format!(
                "{}: memstress us/page logged vs the {}: {} (same run)",
                m.mode,
                raw.mode,
                ferry_report::ratio(m.us_per_written_page, raw.us_per_written_page)
            ));
        }
    }
    for m in &results.modes {
        table.note(format!(
            "{}: logged/off pass-time ratio {} (same run)",
            m.mode,
            ferry_report::ratio(mean(&m.iteration_ms), m.steady_pass_ms)
        ));
    }
    let series = results
        .modes
        .iter()
        .map(|m| Series {
            label: m.mode.clone(),
            points: m
                .iteration_ms
                .iter()
                .enumerate()
                .map(|(i, &t)| ((i + 1) as f64, t))
                .collect(),
        })
        .collect();
    Report {
        name: "dirty-log-kvm".into(),
        tables: vec![table],
        results,
        charts: vec![Plot {
            title: "kvm dirty-memory pass time per iteration".into(),
            x_label: "iteration".into(),
            y_label: "pass time (ms)".into(),
            log_y: false,
            references: Vec::new(),
            series,
        }
        .into()],
    }
}
