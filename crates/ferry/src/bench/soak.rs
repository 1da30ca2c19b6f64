//! `ferry bench soak`: a write-heavy guest ping-pongs between two ends,
//! A → B → A → ..., each hop verified by its digest and the guest's stamps.
//!
//! ```text
//!   hop 0 source: ferry run --control S0            (end A)
//!   hop i: ferry receive --control S(i+1)           (end B, then A, ...)
//!          {"cmd":"migrate","to":...} on S(i)       -> the hop's summary
//!          the source process ends once its VM moved; the destination now
//!          runs the guest and is the next hop's source
//! ```
//!
//! Every end is a fresh process, as a ping-pong between two hosts starts a
//! fresh VMM at each arrival, and every one dies with this one. A hop that
//! fails leaves its source running (a failed precopy must): the next hop
//! starts from it again. The soak stops early only if the guest is lost.

use crate::child::die_with_parent;
use crate::error::CmdError;
use clap::Args;
use ferry_harness::child::{listen_address, wait_for};
use ferry_report::{Plot, Report, Series, Table};
use serde::Serialize;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `ferry bench soak`.
#[derive(Args, Debug)]
pub struct SoakArgs {
    /// Hops to make (A→B is one, B→A the next).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub count: u32,
    /// Backend of both ends.
    #[arg(long, default_value = "auto", value_parser = crate::args::BACKENDS)]
    pub backend: String,
    /// vCPUs of the guest.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub vcpus: u32,
    /// Guest memory per vCPU (e.g. 64M).
    #[arg(long = "mem-per-vcpu", default_value = "64M", value_parser = crate::args::parse_size)]
    pub mem_per_vcpu: u64,
    /// Each vCPU's write rate in MiB/s (default: as fast as it can: write-heavy).
    #[arg(long = "rate-limit")]
    pub rate_limit: Option<u64>,
    /// Modes to cycle through, one per hop (precopy, postcopy, hybrid).
    #[arg(long, value_delimiter = ',', default_value = "precopy")]
    pub modes: Vec<String>,
    /// Convergence policy of every hop.
    #[arg(long, default_value = "quota", value_parser = ["none", "auto", "quota", "dirty-limit"])]
    pub converge: String,
    /// Data connections per hop.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Seconds a hop may take before it counts as failed.
    #[arg(long = "hop-timeout", default_value_t = 180)]
    pub hop_timeout_s: u64,
    /// Print one JSON object (`hops` verified, `failed`) as the last line.
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON, the charts and report.html, the page that
    /// holds them all.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// One hop.
#[derive(Clone, Debug, Serialize)]
pub struct Hop {
    /// 1-based.
    pub hop: u32,
    /// "A→B" or "B→A".
    pub route: String,
    /// precopy, postcopy or hybrid.
    pub mode: String,
    /// Digest matched, no guest mismatch, status completed.
    pub verified: bool,
    pub total_ms: f64,
    pub downtime_ms: f64,
    pub rounds: u64,
    pub bytes_sent: u64,
    pub guest_mismatches: u64,
    /// Why it failed.
    pub error: Option<String>,
}

/// The soak's results.
#[derive(Clone, Debug, Serialize)]
pub struct Soak {
    pub backend: String,
    pub vcpus: u32,
    pub mem_per_vcpu: u64,
    pub hops: Vec<Hop>,
    /// Hops that verified.
    pub verified: u32,
    /// Hops that did not.
    pub failed: u32,
    /// The guest's own mismatch count when the last end stopped it.
    pub final_exit_ok: bool,
}

/// A `ferry run` or `ferry receive` end holding the guest, with its socket.
struct End {
    child: Child,
    socket: PathBuf,
    name: char,
}

impl End {
    /// Stops it and waits; whether it exited cleanly (no guest mismatch).
    fn stop(mut self) -> bool {
        let _ = ask(
            &self.socket,
            &json!({"cmd": "stop"}),
            Duration::from_secs(30),
        );
        let ok = wait_for(&mut self.child, Duration::from_secs(30)).is_some_and(|s| s.success());
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
        ok
    }
}

/// One request on a control socket, with a deadline for the reply.
fn ask(socket: &Path, request: &Value, limit: Duration) -> Result<Value, String> {
    let mut conn = UnixStream::connect(socket)
        .map_err(|e| format!("cannot reach {}: {e}", socket.display()))?;
    conn.set_read_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    writeln!(conn, "{request}").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(conn)
        .read_line(&mut line)
        .map_err(|e| format!("no reply within {} s: {e}", limit.as_secs()))?;
    serde_json::from_str(&line).map_err(|e| format!("reply is not JSON ({e}): {line:?}"))
}

/// Waits until `socket` answers (the end is up), or its process ended.
fn await_socket(child: &mut Child, socket: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while UnixStream::connect(socket).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("it exited ({status}) before serving its socket"));
        }
        if Instant::now() >= deadline {
            return Err("its control socket never appeared".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn backend_args(a: &SoakArgs) -> Vec<String> {
    let mut args = vec!["--backend".to_string(), a.backend.clone()];
    // The per-vCPU policies meter each vCPU with the dirty ring on kvm.
    if a.backend == "kvm" {
        args.extend(["--dirty-tracking".into(), "ring".into()]);
    }
    args
}

fn socket_path(n: u32) -> PathBuf {
    std::env::temp_dir().join(format!("ferry-soak-{}-{n}.sock", std::process::id()))
}

/// Boots the guest at end A.
fn first_end(a: &SoakArgs) -> Result<End, CmdError> {
    let socket = socket_path(0);
    let mut cmd = Command::new(std::env::current_exe().map_err(io)?);
    cmd.arg("run")
        .args(backend_args(a))
        .args(["--vcpus", &a.vcpus.to_string()])
        .args(["--mem-per-vcpu", &format!("{}K", a.mem_per_vcpu >> 10)])
        .arg("--control")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(r) = a.rate_limit {
        cmd.args(["--rate-limit", &r.to_string()]);
    }
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(io)?;
    if let Err(e) = await_socket(&mut child, &socket) {
        let _ = child.kill();
        return Err(CmdError::Failed(format!(
            "the first end did not start: {e}"
        )));
    }
    Ok(End {
        child,
        socket,
        name: 'A',
    })
}

/// Starts an empty end waiting for the guest; returns it and its address.
fn next_end(a: &SoakArgs, n: u32, name: char) -> Result<(End, String), CmdError> {
    let socket = socket_path(n);
    let mut cmd = Command::new(std::env::current_exe().map_err(io)?);
    cmd.args(["receive", "--listen", "127.0.0.1:0", "--run-after", "0.5"])
        .args(backend_args(a))
        .arg("--control")
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(io)?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let mut out = BufReader::new(out);
        let _ = out.read_line(&mut line);
        // It prints the guest's progress on: drain it, or its next line
        // would meet a closed pipe.
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    }
    let Some(addr) = listen_address(&line) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(CmdError::Failed(format!(
            "ferry receive did not start: {line:?}"
        )));
    };
    let addr = addr.to_string();
    Ok((
        End {
            child,
            socket,
            name,
        },
        addr,
    ))
}

fn io(e: std::io::Error) -> CmdError {
    CmdError::Failed(format!("cannot start a ferry process: {e}"))
}

/// One hop from `from` to a fresh end; returns the hop and, if the guest
/// moved, the new end.
fn hop(a: &SoakArgs, n: u32, from: &End) -> Result<(Hop, Option<End>), CmdError> {
    let name = if from.name == 'A' { 'B' } else { 'A' };
    let mode = a.modes[(n as usize - 1) % a.modes.len()].clone();
    let (mut to, addr) = next_end(a, n, name)?;
    let request = json!({
        "cmd": "migrate",
        "to": addr,
        "mode": mode,
        "converge": a.converge,
        "connections": a.connections,
    });
    let reply = ask(&from.socket, &request, Duration::from_secs(a.hop_timeout_s));
    let summary = reply.as_ref().ok();
    let field = |k: &str| summary.and_then(|s| s[k].as_f64()).unwrap_or(0.0);
    let verified = summary.is_some_and(|s| {
        s["status"] == "completed" && s["digest_match"] == true && s["guest_mismatches"] == 0
    });
    let error = match &reply {
        Err(e) => Some(e.clone()),
        Ok(s) if !verified => Some(
            s["error"]
                .as_str()
                .map_or_else(|| format!("not verified: {s}"), String::from),
        ),
        Ok(_) => None,
    };
    let result = Hop {
        hop: n,
        route: format!("{}→{}", from.name, name),
        mode,
        verified,
        total_ms: field("total_ms"),
        downtime_ms: field("downtime_ms"),
        rounds: field("rounds") as u64,
        bytes_sent: field("bytes_sent") as u64,
        guest_mismatches: field("guest_mismatches") as u64,
        error,
    };
    let moved = summary.is_some_and(|s| s["status"] == "completed");
    if !moved {
        // The source keeps the guest; this end never got it.
        let _ = to.child.kill();
        let _ = to.child.wait();
        let _ = std::fs::remove_file(&to.socket);
        return Ok((result, None));
    }
    if let Err(e) = await_socket(&mut to.child, &to.socket) {
        return Err(CmdError::Failed(format!(
            "hop {n}: the guest moved but its new end is gone: {e}"
        )));
    }
    Ok((result, Some(to)))
}

/// Runs the soak.
pub fn run(a: &SoakArgs) -> Result<Report<Soak>, CmdError> {
    if a.modes.is_empty() {
        return Err(CmdError::Usage("--modes needs at least one mode".into()));
    }
    for m in &a.modes {
        m.parse::<ferry_engine::Mode>()
            .map_err(|e| CmdError::Usage(e.to_string()))?;
    }
    let mut end = first_end(a)?;
    let mut hops = Vec::new();
    for n in 1..=a.count {
        let (h, moved) = hop(a, n, &end)?;
        eprintln!(
            "hop {:>4} {}: {} {} ({:.1} s, downtime {:.0} ms){}",
            h.hop,
            h.route,
            h.mode,
            if h.verified { "verified" } else { "FAILED" },
            h.total_ms / 1e3,
            h.downtime_ms,
            h.error
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
        hops.push(h);
        if let Some(next) = moved {
            // The old end stops by itself once its VM moved.
            let mut old = std::mem::replace(&mut end, next);
            if wait_for(&mut old.child, Duration::from_secs(30)).is_none() {
                let _ = old.child.kill();
                let _ = old.child.wait();
                return Err(CmdError::Failed(format!(
                    "hop {n}: the old end did not exit after its VM moved"
                )));
            }
        }
    }
    let final_exit_ok = end.stop();
    Ok(report(a, hops, final_exit_ok))
}

fn report(a: &SoakArgs, hops: Vec<Hop>, final_exit_ok: bool) -> Report<Soak> {
    let verified = hops.iter().filter(|h| h.verified).count() as u32;
    let failed = hops.len() as u32 - verified;
    let mut table = Table::new(
        format!(
            "soak: a write-heavy guest ({} vCPUs x {} MiB, {}) ping-pongs A↔B, {} hops, converge {}",
            a.vcpus,
            a.mem_per_vcpu >> 20,
            a.backend,
            hops.len(),
            a.converge
        ),
        &[
            "hop", "route", "mode", "total s", "downtime ms", "rounds", "sent MiB", "verified",
        ],
    );
    for h in &hops {
        table.row(vec![
            h.hop.to_string(),
            h.route.clone(),
            h.mode.clone(),
            format!("{:.2}", h.total_ms / 1e3),
            format!("{:.1}", h.downtime_ms),
            h.rounds.to_string(),
            format!("{:.0}", h.bytes_sent as f64 / (1 << 20) as f64),
            if h.verified {
                "yes".into()
            } else {
                "NO".into()
            },
        ]);
    }
    let mut downtimes: Vec<f64> = hops
        .iter()
        .filter(|h| h.verified)
        .map(|h| h.downtime_ms)
        .collect();
    downtimes.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        downtimes
            .get(((downtimes.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    table.note(format!(
        "{verified} of {} hops verified (digest match, 0 guest mismatches), {failed} failed; \
         downtime median {:.1} ms, p95 {:.1} ms, max {:.1} ms; the last end's guest {}",
        hops.len(),
        pct(0.5),
        pct(0.95),
        pct(1.0),
        if final_exit_ok {
            "stopped clean"
        } else {
            "did NOT stop clean"
        }
    ));
    let series = |label: &str, f: fn(&Hop) -> f64| Series {
        label: label.into(),
        points: hops.iter().map(|h| (f64::from(h.hop), f(h))).collect(),
    };
    let plot = Plot {
        title: format!("soak on {}: each hop's downtime and total time", a.backend),
        x_label: "hop".into(),
        y_label: "ms".into(),
        log_y: true,
        references: Vec::new(),
        series: vec![
            series("downtime ms", |h| h.downtime_ms.max(0.01)),
            series("total ms", |h| h.total_ms.max(0.01)),
        ],
    };
    Report {
        name: format!("soak-{}", a.backend),
        tables: vec![table],
        results: Soak {
            backend: a.backend.clone(),
            vcpus: a.vcpus,
            mem_per_vcpu: a.mem_per_vcpu,
            hops,
            verified,
            failed,
            final_exit_ok,
        },
        charts: vec![plot.into()],
    }
}

/// The `--json` line: `hops` (verified) and `failed`.
pub fn summary_json(s: &Soak) -> Value {
    json!({
        "backend": s.backend,
        "hops": s.verified,
        "failed": s.failed,
        "last_end_clean": s.final_exit_ok,
        "attempted": s.hops.len(),
        "downtime_ms": s.hops.iter().map(|h| h.downtime_ms).collect::<Vec<_>>(),
    })
}

/// `ferry bench soak`: runs it, prints its tables and writes its files
/// ([`super::output`]), and with `--json` ends with its summary line;
/// fails unless every hop verified and the last end exited cleanly.
pub fn run_and_print(a: &SoakArgs) -> Result<ExitCode, CmdError> {
    let report = run(a)?;
    super::output::emit(&report, &a.out)?;
    let s = &report.results;
    if a.json {
        println!("{}", summary_json(s));
    }
    Ok(if s.failed == 0 && s.final_exit_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
