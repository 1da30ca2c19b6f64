//! `ferry snapshot SOCKET FILE`: saves a running VM to a file while it
//! runs, through its control socket (`{"cmd":"snapshot"}`), and says how
//! it went. The VM's process writes the file; this one asks and watches.

use crate::control::{self, ControlError};
use crate::error::CmdError;
use clap::Args;
use ferry_engine::choices::ConvergeMode;
use ferry_engine::snapshot::ProofAt;
use ferry_report::Table;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of `ferry snapshot`.
#[derive(Args, Debug)]
#[command(after_help = "\
The guest runs while its memory is written, in rounds that rewrite in place
what it dirtied, then pauses for the last pages, its vCPUs and devices. The
file is written beside FILE and renamed over it only once complete: a failed
or cancelled snapshot leaves FILE as it was, and the guest running.

Examples:
  ferry run --control /tmp/vm.sock &
  ferry snapshot /tmp/vm.sock /var/tmp/vm.snap
  ferry snapshot /tmp/vm.sock /var/tmp/vm-2.snap --parent /var/tmp/vm.snap
  ferry snapshot --merge /var/tmp/vm-2.snap /var/tmp/vm-full.snap
  ferry restore /var/tmp/vm.snap --control /tmp/vm2.sock

QMP's way, as QEMU spells it (the guest is left paused, as QEMU leaves it):
  ferry ctl /tmp/vm.sock migrate uri=file:/var/tmp/vm.snap --follow")]
pub struct SnapshotArgs {
    /// The VM's control socket (`--control` of `ferry run`, `ferry receive`
    /// or `ferry restore`); with --merge, the diff snapshot to flatten.
    #[arg(value_name = "SOCKET")]
    pub socket: PathBuf,
    /// The file to write (its directory must exist).
    pub file: PathBuf,
    /// Write a diff against this earlier snapshot of the same VM: only the
    /// pages that differ from it. The diff names it by path and digest, and
    /// a restore follows the chain (a relative path is taken from the
    /// diff's directory).
    #[arg(long, value_name = "PARENT", conflicts_with = "merge")]
    pub parent: Option<PathBuf>,
    /// Flatten the diff snapshot SOCKET names (and its chain of parents)
    /// into one full snapshot FILE, each page checked as it is copied.
    /// Needs no VM.
    #[arg(long, conflicts_with_all = ["stop", "downtime_ms", "max_rounds", "converge"])]
    pub merge: bool,
    /// Leave the guest paused once it is saved (its state is then the
    /// file's, as before a host reboot); `ferry ctl SOCKET cont` runs it.
    #[arg(long)]
    pub stop: bool,
    /// The longest pause to aim for, in ms (default: the VM's downtime
    /// target, 300 ms unless set).
    #[arg(long = "downtime-ms", value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub downtime_ms: Option<u64>,
    /// The most live rounds before the pause, however much is dirty
    /// (default: the VM's round cap).
    #[arg(long = "max-rounds", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_rounds: Option<u32>,
    /// The convergence policy while the live rounds write, as `ferry
    /// migrate --converge` (none, auto, quota, dirty-limit): it slows a
    /// guest that dirties memory faster than the file takes it (a slow
    /// disk, or the VM's bandwidth cap), so that the pause stays near the
    /// downtime target. Default: the VM's next migration's, else the best
    /// the VM serves.
    #[arg(long, value_parser = clap::value_parser!(ConvergeMode))]
    pub converge: Option<ConvergeMode>,
    /// Print the summary as one JSON line last.
    #[arg(long)]
    pub json: bool,
}

/// Runs `ferry snapshot`.
pub fn run(a: SnapshotArgs) -> Result<ExitCode, CmdError> {
    let file = std::path::absolute(&a.file)
        .map_err(|e| CmdError::Usage(format!("{}: {e}", a.file.display())))?;
    if file.is_dir() {
        return Err(CmdError::Usage(format!(
            "{} is a directory: name the file to write",
            file.display()
        )));
    }
    if a.merge {
        return merge(&a, &file);
    }
    let mut request = json!({"cmd": "snapshot", "path": file, "stop": a.stop});
    if let Some(parent) = &a.parent {
        let parent = std::path::absolute(parent)
            .map_err(|e| CmdError::Usage(format!("{}: {e}", parent.display())))?;
        request["parent"] = json!(parent);
    }
    if let Some(ms) = a.downtime_ms {
        request["max_downtime_ms"] = ms.into();
    }
    if let Some(r) = a.max_rounds {
        request["max_rounds"] = r.into();
    }
    if let Some(c) = a.converge {
        request["converge"] = c.to_string().into();
    }
    let done = Arc::new(AtomicBool::new(false));
    let watcher = watch(a.socket.clone(), Arc::clone(&done));
    let reply = control::request(&a.socket, &request);
    done.store(true, Ordering::Release);
    let _ = watcher.join();
    let reply = reply.map_err(|e| CmdError::Failed(ferry_vm::error_chain(&e)))?;
    if reply["ok"].as_bool() != Some(true) {
        let why = reply["error"].as_str().unwrap_or("no reason given");
        if a.json {
            println!(
                "{}",
                json!({"status": "failed", "file": file, "error": why})
            );
        }
        return Err(CmdError::Failed(format!("the snapshot failed: {why}")));
    }
    println!("{}", table(&reply).render());
    if a.json {
        let mut line = reply.clone();
        if let Some(o) = line.as_object_mut() {
            o.remove("ok");
            o.insert("status".into(), "completed".into());
        }
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--merge`: the chain ending in the diff `a.socket` names, flattened.
fn merge(a: &SnapshotArgs, out: &std::path::Path) -> Result<ExitCode, CmdError> {
    let m = ferry_engine::snapshot::merge(&a.socket, out).map_err(|e| {
        CmdError::Failed(format!("the merge failed: {}", ferry_vm::error_chain(&e)))
    })?;
    let mut t = Table::new("merged snapshot", &["", ""]);
    for (k, v) in [
        ("file", out.display().to_string()),
        ("files flattened", m.chain.to_string()),
        ("pages with data", m.data_pages.to_string()),
        ("on disk", format!("{} MiB", m.bytes >> 20)),
        ("took", format!("{:.0} ms", m.total_ms)),
    ] {
        t.row(vec![k.to_string(), v]);
    }
    println!("{}", t.render());
    if a.json {
        let mut j = serde_json::to_value(&m).unwrap_or_default();
        j["status"] = "completed".into();
        j["file"] = json!(out);
        println!("{j}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The working set's size, and what the VM's access log added to it.
fn working_set_words(s: &Value) -> String {
    let pages = s["working_set_pages"].as_u64().unwrap_or(0);
    match s["access_log"].as_bool() {
        Some(true) => format!(
            "{pages} pages ({} of them only read, from the VM's access log)",
            s["working_set_read_pages"].as_u64().unwrap_or(0)
        ),
        _ => format!("{pages} pages (without an access log)"),
    }
}

/// The summary as a table.
fn table(s: &Value) -> Table {
    let mut t = Table::new("snapshot", &["", ""]);
    let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
    let u = |k: &str| s[k].as_u64().unwrap_or(0);
    let rows = [
        ("file", s["file"].as_str().unwrap_or("").to_string()),
        ("total", format!("{:.0} ms", f("total_ms"))),
        (
            "the guest's pause",
            serde_json::from_value::<ProofAt>(s["proof"].clone())
                .unwrap_or(ProofAt::Pause)
                .pause_words(f("pause_ms"), f("digest_ms")),
        ),
        (
            "rounds",
            s["rounds"].as_array().map_or(0, Vec::len).to_string(),
        ),
        (
            "on disk",
            format!(
                "{} MiB ({} MiB with holes)",
                u("bytes") >> 20,
                u("file_bytes") >> 20
            ),
        ),
        ("convergence", convergence(s)),
        ("working set", working_set_words(s)),
        ("digest", format!("{:#018x}", u("digest"))),
        (
            "the guest",
            if s["stopped"].as_bool() == Some(true) {
                "paused (cont runs it)"
            } else {
                "runs on"
            }
            .to_string(),
        ),
    ];
    for (k, v) in rows {
        t.row(vec![k.to_string(), v]);
    }
    t
}

/// Prints the snapshot's progress from the VM's monitor (`query-migrate`
/// on a second connection) once a second, until `done`.
fn watch(socket: PathBuf, done: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut next = start + Duration::from_secs(1);
        while !done.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(100));
            if Instant::now() < next {
                continue;
            }
            next += Duration::from_secs(1);
            let q = match control::request(&socket, &json!({"execute": "query-migrate"})) {
                Ok(q) => q,
                Err(ControlError::Connect { .. }) => return,
                Err(_) => continue,
            };
            let r = &q["return"];
            if r["status"].is_null() {
                continue;
            }
            eprintln!(
                "ferry snapshot: {} s, {}, round {}, {} MiB written",
                start.elapsed().as_secs(),
                r["status"].as_str().unwrap_or("?"),
                r["ram"]["dirty-sync-count"].as_u64().unwrap_or(0),
                r["ram"]["transferred"].as_u64().unwrap_or(0) >> 20
            );
        }
    })
}

/// The policy the live rounds ran and what it did, in a few words.
fn convergence(s: &Value) -> String {
    let c = &s["convergence"];
    let policy = c["converge"].as_str().unwrap_or("none");
    let steps = c["throttle_timeline"].as_array().map_or(0, Vec::len);
    match steps {
        0 => format!("{policy}: never engaged"),
        n => format!(
            "{policy}: {n} changes; the guest ran free {:.0} ms before the pause",
            s["settle_ms"].as_f64().unwrap_or(0.0)
        ),
    }
}
