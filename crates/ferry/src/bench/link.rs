//! `ferry bench link`: how close the first pass of a migration comes to the
//! raw link, measured in one run.
//!
//! ```text
//!   raw loopback TCP, N connections: N threads send 4 MiB buffers, N discard them
//!   first pass of an idle guest: `ferry demo --idle --rate-limit 1024` in a fresh
//!     process per cell (the guest reads and checks its pages at 1 GiB/s per vCPU)
//!     (fresh source, fresh destination: first-touch costs included, as users see them)
//!   raw loopback TCP, placed: the same, each receiver placing what it reads
//!     with UFFDIO_COPY: the ceiling of any destination that does not zero first
//!   ratio = first-pass GiB/s of guest memory ÷ raw loopback GiB/s with the same N
//!   vs_placed_floor = first-pass GiB/s ÷ raw loopback placed, with the same N
//!   with and without mutual TLS (`demo --tls`: a throwaway CA per cell)
//! ```
//!
//! Compression is reported only on `--fill text` or `random` pages: a
//! memstress page left at zero is one 8-byte stamp, which any compressor
//! shrinks 500×. The capped cells compare compression with none under a
//! bandwidth cap, where the link is the bottleneck by construction.

use crate::error::CmdError;
use clap::Args;
use ferry_harness::stats::median;
use ferry_report::{Plot, Report, Series, Table};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `ferry bench link`.
#[derive(Args, Debug)]
pub struct LinkArgs {
    /// Backend of the migrated guest.
    #[arg(long, default_value = "auto", value_parser = crate::args::BACKENDS)]
    pub backend: String,
    /// Guest memory (2 vCPUs, half each).
    #[arg(long, default_value = "1G", value_parser = crate::args::parse_size)]
    pub mem: u64,
    /// Data connection counts to compare.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub connections: Vec<usize>,
    /// Seconds of each raw loopback measurement.
    #[arg(long = "raw-secs", default_value_t = 2.0)]
    pub raw_secs: f64,
    /// Runs of the placed floor and of the plain first pass (text pages, no
    /// compression), alternating, per connection count: each is reported
    /// as the median of its runs, with every run in the JSON (this host's
    /// floor alone has moved severalfold from one run to the next).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// Bandwidth cap in MiB/s for the compression-under-a-cap cells (0 skips them).
    #[arg(long = "cap-mib-s", default_value_t = 128)]
    pub cap_mib_s: u64,
    /// Print one JSON object (loopback_gib_s, first_pass_gib_s, ratio) as the
    /// last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON, the charts and report.html, the page that
    /// holds them all.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// One measured cell.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    /// "raw TCP" or "first pass".
    pub what: String,
    /// Data connections.
    pub connections: usize,
    /// Page fill (first pass only).
    pub fill: String,
    /// Compression setting.
    pub compress: String,
    /// Bandwidth cap in MiB/s (0: none).
    pub cap_mib_s: u64,
    /// Mutual TLS on every connection.
    pub tls: bool,
    /// GiB/s: of bytes for raw TCP, of guest memory for a first pass.
    pub gib_s: f64,
    /// Wire bytes per guest byte (first pass; 1.0 raw).
    pub wire_ratio: f64,
    /// This cell over raw TCP with the same connections, same run.
    pub vs_raw: f64,
    /// The migration verified (digest match, no guest mismatch).
    pub verified: bool,
    /// GiB/s of every run when the cell ran more than once (`--repeat`);
    /// `gib_s` is then their median.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runs_gib_s: Vec<f64>,
}

impl Cell {
    /// A raw TCP cell (`what`): `gib_s` over `n` connections, against `raw`
    /// GiB/s of raw TCP from the same run; `runs` when it ran more than once.
    fn raw_tcp(what: &str, n: usize, gib_s: f64, raw: f64, runs: Vec<f64>) -> Self {
        Cell {
            what: what.into(),
            connections: n,
            fill: "-".into(),
            compress: "-".into(),
            cap_mib_s: 0,
            tls: false,
            gib_s,
            wire_ratio: 1.0,
            vs_raw: gib_s / raw,
            verified: true,
            runs_gib_s: runs,
        }
    }
}

/// All cells of a run.
#[derive(Debug, Serialize)]
pub struct LinkResults {
    /// Backend of the guest.
    pub backend: String,
    /// Guest memory in bytes.
    pub mem: u64,
    /// Every cell, in the order measured.
    pub cells: Vec<Cell>,
}

const RAW_BUF: usize = 4 << 20;

/// Raw loopback TCP over `n` connections for `secs`: GiB/s.
fn raw_tcp(n: usize, secs: f64) -> Result<f64, CmdError> {
    let fail = |e: std::io::Error| CmdError::Failed(format!("raw loopback TCP: {e}"));
    let listener = TcpListener::bind("127.0.0.1:0").map_err(fail)?;
    let addr = listener.local_addr().map_err(fail)?;
    // Connect every client first (the kernel queues them), then accept.
    let clients = (0..n)
        .map(|_| TcpStream::connect(addr))
        .collect::<Result<Vec<_>, _>>()
        .map_err(fail)?;
    let servers = (0..n)
        .map(|_| listener.accept().map(|(s, _)| s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(fail)?;
    let sinks: Vec<_> = servers
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; RAW_BUF];
                let mut total = 0u64;
                while let Ok(k) = s.read(&mut buf) {
                    if k == 0 {
                        break;
                    }
                    total += k as u64;
                }
                total
            })
        })
        .collect();
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let senders: Vec<_> = clients
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                let buf = vec![0x5au8; RAW_BUF];
                while Instant::now() < until {
                    if s.write_all(&buf).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    for s in senders {
        let _ = s.join();
    }
    let bytes: u64 = sinks.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    Ok(bytes as f64 / start.elapsed().as_secs_f64() / (1u64 << 30) as f64)
}

/// The floor of any destination that places pages without zeroing them:
/// raw loopback TCP over `n` connections moving `mem` bytes, each receiver
/// placing what it read into fresh guest RAM with `UFFDIO_COPY`, 1 MiB at a
/// time (a batch's size). No framing, checksum or digest: what is left of a
/// first pass once every check is taken away. GiB/s of bytes placed.
fn raw_tcp_placed(n: usize, mem: u64) -> Result<f64, CmdError> {
    use ferry_vm::uffd::Placer;
    use ferry_vm::{Backing, Gfn, GuestRam, PAGE_SIZE};
    const CHUNK: u64 = 1 << 20;
    let fail = |e: String| CmdError::Failed(format!("raw loopback TCP, placed: {e}"));
    let per = (mem / n as u64) / CHUNK * CHUNK;
    let ram = GuestRam::new(&[per * n as u64], Backing::Thp).map_err(|e| fail(e.to_string()))?;
    let placer = Placer::register(&ram).map_err(|e| fail(e.to_string()))?;
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| fail(e.to_string()))?;
    let addr = listener.local_addr().map_err(|e| fail(e.to_string()))?;
    let clients = (0..n)
        .map(|_| TcpStream::connect(addr))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    let servers = (0..n)
        .map(|_| listener.accept().map(|(s, _)| s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    let start = Instant::now();
    let placed = std::thread::scope(|scope| {
        let sinks: Vec<_> = servers
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                let placer = &placer;
                scope.spawn(move || -> Result<u64, String> {
                    let mut buf = vec![0u8; CHUNK as usize];
                    let first = i as u64 * per / PAGE_SIZE as u64;
                    let mut done = 0u64;
                    while done < per {
                        s.read_exact(&mut buf).map_err(|e| e.to_string())?;
                        let at = Gfn(first + done / PAGE_SIZE as u64);
                        placer.copy(at, &buf).map_err(|e| e.to_string())?;
                        done += CHUNK;
                    }
                    Ok(done)
                })
            })
            .collect();
        for mut s in clients {
            scope.spawn(move || {
                // Not zero: a page of text, as the guest's fill would be.
                let buf: Vec<u8> = (0..CHUNK)
                    .map(|i| b"ferry moves pages "[i as usize % 18])
                    .collect();
                let mut sent = 0;
                while sent < per && s.write_all(&buf).is_ok() {
                    sent += CHUNK;
                }
            });
        }
        sinks
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("receiver panicked".into())))
            .sum::<Result<u64, String>>()
    })
    .map_err(fail)?;
    Ok(placed as f64 / start.elapsed().as_secs_f64() / (1u64 << 30) as f64)
}

/// One first-pass cell to measure.
struct FirstPass<'a> {
    what: &'a str,
    connections: usize,
    fill: &'a str,
    compress: &'a str,
    cap_mib_s: u64,
    /// The destination's `--placement`.
    placement: &'a str,
    /// `ferry demo --tls`.
    tls: bool,
}

impl FirstPass<'_> {
    /// Measures it and compares with `raw` GiB/s of raw TCP from the same run.
    fn measure(&self, a: &LinkArgs, raw: f64) -> Result<Cell, CmdError> {
        eprintln!(
            "ferry bench link: {}, {} connection(s), fill {}, compress {}, cap {} MiB/s, placement {}, tls {} ...",
            self.what, self.connections, self.fill, self.compress, self.cap_mib_s, self.placement, self.tls
        );
        let (gib_s, wire_ratio, verified) = first_pass(a, self)?;
        Ok(Cell {
            what: self.what.into(),
            connections: self.connections,
            fill: self.fill.into(),
            compress: self.compress.into(),
            cap_mib_s: self.cap_mib_s,
            tls: self.tls,
            gib_s,
            wire_ratio,
            vs_raw: gib_s / raw,
            verified,
            runs_gib_s: Vec::new(),
        })
    }
}

/// `ferry demo --idle` in a fresh process for one cell: (guest GiB/s, wire
/// bytes per guest byte, verified).
fn first_pass(a: &LinkArgs, c: &FirstPass<'_>) -> Result<(f64, f64, bool), CmdError> {
    let exe = std::env::current_exe()
        .map_err(|e| CmdError::Failed(format!("cannot find the ferry executable: {e}")))?;
    let half = (a.mem / 2).to_string();
    let mut cmd = Command::new(exe);
    crate::child::die_with_parent(&mut cmd);
    let out = cmd
        // 1 GiB/s per vCPU: the warm-up pass is quick, and the idle guest
        // (reading and checking only) leaves the cores to the migration.
        .args([
            "demo",
            "--json",
            "--idle",
            "--rate-limit",
            "1024",
            "--warmup",
            "0",
        ])
        .args([
            "--backend",
            &a.backend,
            "--vcpus",
            "2",
            "--mem-per-vcpu",
            &half,
        ])
        .args(["--connections", &c.connections.to_string()])
        .args(["--fill", c.fill, "--compress", c.compress])
        .args([
            "--bandwidth",
            &c.cap_mib_s.to_string(),
            "--run-after",
            "0.2",
        ])
        .args(["--placement", c.placement])
        .args(c.tls.then_some("--tls"))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| CmdError::Failed(format!("cannot run ferry demo: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let j: serde_json::Value = text
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| CmdError::Failed(format!("ferry demo printed no summary:\n{text}")))?;
    let full = &j["round_stats"][0];
    let (pages, wire, ms) = (
        full["pages"].as_f64().unwrap_or(0.0),
        full["bytes"].as_f64().unwrap_or(0.0),
        full["ms"].as_f64().unwrap_or(f64::INFINITY),
    );
    let guest_bytes = pages * 4096.0;
    let verified = j["digest_match"] == true && j["guest_mismatches"] == 0;
    Ok((
        guest_bytes / (ms / 1e3) / (1u64 << 30) as f64,
        wire / guest_bytes.max(1.0),
        verified,
    ))
}

/// Runs the experiment.
pub fn run(a: &LinkArgs) -> Result<Report<LinkResults>, CmdError> {
    let mut cells = Vec::new();
    for &n in &a.connections {
        eprintln!("ferry bench link: raw loopback TCP, {n} connection(s) ...");
        let raw = raw_tcp(n, a.raw_secs)?;
        cells.push(Cell::raw_tcp("raw TCP", n, raw, raw, Vec::new()));
        let cell = |what, fill, compress, placement| FirstPass {
            what,
            connections: n,
            fill,
            compress,
            cap_mib_s: 0,
            placement,
            tls: false,
        };
        let (floor, plain) =
            floor_and_plain(a, n, raw, &cell("first pass", "text", "none", "uffd"))?;
        cells.push(floor);
        // The destination's placement, compared in the same run: a plain
        // write after the kernel zeroed the page.
        cells.push(cell("first pass, write", "text", "none", "write").measure(a, raw)?);
        cells.push(cell("first pass", "zero", "none", "uffd").measure(a, raw)?);
        cells.push(plain);
        for compress in ["lz4", "zstd"] {
            cells.push(cell("first pass", "text", compress, "uffd").measure(a, raw)?);
        }
        let tls = FirstPass {
            tls: true,
            ..cell("first pass, TLS", "text", "none", "uffd")
        };
        cells.push(tls.measure(a, raw)?);
    }
    if a.cap_mib_s > 0 {
        // One connection per core: compression runs on the sender threads.
        let n = crate::args::parse_connections("auto").unwrap_or(1);
        let raw = cells
            .iter()
            .find(|c| c.what == "raw TCP" && c.connections == n)
            .or(cells.first())
            .map_or(1.0, |c| c.gib_s);
        for compress in ["none", "zstd", "auto"] {
            let capped = FirstPass {
                what: "first pass, capped",
                connections: n,
                fill: "text",
                compress,
                cap_mib_s: a.cap_mib_s,
                placement: "uffd",
                tls: false,
            };
            cells.push(capped.measure(a, raw)?);
        }
    }
    Ok(report(a, cells))
}

/// The placed floor over `n` connections and the plain first pass `plain`,
/// each run `--repeat` times, alternating: two cells of medians.
fn floor_and_plain(
    a: &LinkArgs,
    n: usize,
    raw: f64,
    plain: &FirstPass<'_>,
) -> Result<(Cell, Cell), CmdError> {
    let (mut floors, mut passes) = (Vec::new(), Vec::new());
    let mut last = None;
    for run in 1..=a.repeat {
        eprintln!(
            "ferry bench link: raw loopback TCP placed with UFFDIO_COPY, {n} connection(s), run {run} of {} ...",
            a.repeat
        );
        floors.push(raw_tcp_placed(n, a.mem)?);
        let cell = plain.measure(a, raw)?;
        passes.push(cell.gib_s);
        // One run that failed to verify marks the cell.
        if last.as_ref().is_none_or(|c: &Cell| c.verified) {
            last = Some(cell);
        }
    }
    let many = |runs: Vec<f64>| if runs.len() > 1 { runs } else { Vec::new() };
    let mut pass = last.expect("at least one run");
    pass.gib_s = median(&passes);
    pass.vs_raw = pass.gib_s / raw;
    pass.runs_gib_s = many(passes);
    let floor = Cell::raw_tcp("raw TCP, placed", n, median(&floors), raw, many(floors));
    Ok((floor, pass))
}

fn report(a: &LinkArgs, cells: Vec<Cell>) -> Report<LinkResults> {
    let mut table = Table::new(
        format!(
            "first pass of an idle {} GiB {} guest vs raw loopback TCP (same run)",
            a.mem as f64 / (1u64 << 30) as f64,
            a.backend
        ),
        &[
            "what",
            "conns",
            "fill",
            "compress",
            "cap MiB/s",
            "tls",
            "GiB/s",
            "wire/guest",
            "vs raw TCP",
            "verified",
        ],
    );
    for c in &cells {
        table.row(vec![
            c.what.clone(),
            c.connections.to_string(),
            c.fill.clone(),
            c.compress.clone(),
            if c.cap_mib_s == 0 {
                "-".into()
            } else {
                c.cap_mib_s.to_string()
            },
            if c.tls { "yes" } else { "-" }.into(),
            format!("{:.3}", c.gib_s),
            format!("{:.3}", c.wire_ratio),
            format!("{:.0}%", c.vs_raw * 100.0),
            if c.verified {
                "yes".into()
            } else {
                "NO".into()
            },
        ]);
    }
    table.note("GiB/s: raw TCP counts bytes; a first pass counts guest memory moved (zero pages included).");
    table.note("first pass: the destination places untouched pages with UFFDIO_COPY; \"first pass, write\" copies them in after the kernel zeroes them (the old way), same run.");
    table.note("raw TCP, placed: the same raw stream, each receiver placing what it reads into fresh guest RAM with UFFDIO_COPY (1 MiB at a time), with no framing, checksum or digest: the ceiling of a destination that does not zero pages first.");
    table.note("Each first pass runs `ferry demo --idle` in a fresh process pair: the destination's first touch of its memory is part of what is measured.");
    if a.repeat > 1 {
        table.note(format!(
            "raw TCP, placed and the first pass of text without compression: the median of {} runs each, alternating (every run in the JSON).",
            a.repeat
        ));
    }
    table.note("The capped cells use one connection per core (compression runs on the sender threads); vs raw TCP compares with raw TCP over as many connections. Against the cap itself, see GiB/s.");
    table.note(format!(
        "{} thread(s) of the host's {} core(s) per side: each connection has a sender and a receiver thread.",
        a.connections.iter().max().unwrap_or(&1),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    ));
    let mut series: Vec<Series> = Vec::new();
    for (label, pick) in [
        ("raw TCP", ("raw TCP", "-", "-")),
        ("raw TCP, placed", ("raw TCP, placed", "-", "-")),
        ("first pass, zero fill", ("first pass", "zero", "none")),
        ("first pass, text, none", ("first pass", "text", "none")),
        ("first pass, text, lz4", ("first pass", "text", "lz4")),
        ("first pass, text, zstd", ("first pass", "text", "zstd")),
        ("first pass, text, TLS", ("first pass, TLS", "text", "none")),
    ] {
        let points = cells
            .iter()
            .filter(|c| (c.what.as_str(), c.fill.as_str(), c.compress.as_str()) == pick)
            .map(|c| (c.connections as f64, c.gib_s))
            .collect();
        series.push(Series {
            label: label.into(),
            points,
        });
    }
    Report {
        name: "link".into(),
        tables: vec![table],
        results: LinkResults {
            backend: a.backend.clone(),
            mem: a.mem,
            cells,
        },
        charts: vec![Plot {
            title: "first pass vs raw loopback TCP".into(),
            x_label: "data connections".into(),
            y_label: "GiB/s".into(),
            log_y: false,
            references: Vec::new(),
            series,
        }
        .into()],
    }
}

/// The `--json` line: the raw loopback figure and the best plain first pass
/// (text pages, no compression, uncapped, verified: the repeated cells) with
/// the same connection count. Zero-filled or compressed pages would make
/// the headline depend on what the guest holds.
pub fn summary_json(r: &LinkResults) -> serde_json::Value {
    let best = r
        .cells
        .iter()
        .filter(|c| c.what == "first pass" && c.verified)
        .filter(|c| c.fill == "text" && c.compress == "none")
        .max_by(|a, b| a.vs_raw.total_cmp(&b.vs_raw));
    let same_conns = |what: &str| {
        best.and_then(|b| {
            r.cells
                .iter()
                .find(|c| c.what == what && c.connections == b.connections)
        })
    };
    let (raw, floor) = (same_conns("raw TCP"), same_conns("raw TCP, placed"));
    serde_json::json!({
        "loopback_gib_s": raw.map(|c| c.gib_s),
        "placed_floor_gib_s": floor.map(|c| c.gib_s),
        "first_pass_gib_s": best.map(|c| c.gib_s),
        "ratio": best.map(|c| c.vs_raw),
        // How close the first pass comes to the ceiling of any destination
        // that places with UFFDIO_COPY: what ferry's own work costs.
        "vs_placed_floor": best.zip(floor).map(|(b, f)| b.gib_s / f.gib_s),
        "best": best,
    })
}

/// `ferry bench link`: runs it, prints its tables and writes its files
/// ([`super::output`]), and with `--json` ends with its summary line.
pub fn run_and_print(a: &LinkArgs) -> Result<ExitCode, CmdError> {
    let report = run(a)?;
    let code = super::output::emit(&report, &a.out)?;
    if a.json {
        println!("{}", summary_json(&report.results));
    }
    Ok(code)
}
