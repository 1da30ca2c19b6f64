//! Two hosts on one machine (`ferry demo --netns`): the source and the
//! destination each run in a network namespace of their own, joined by a
//! veth pair that `tc` shapes to a link's rate (tbf) and delay (netem).
//!
//! ```text
//!   ferry-src-PID                          ferry-dst-PID
//!   ┌──────────────────────┐   veth pair   ┌──────────────────────┐
//!   │ demo (source VM)     │ ───────────── │ ferry receive        │
//!   │ veth-src 10.231.0.1  │  tbf [netem]  │ veth-dst 10.231.0.2  │
//!   └──────────────────────┘  both ways    └──────────────────────┘
//! ```
//!
//! The addresses are private to the pair's namespaces, so nothing outside
//! them is ever targeted, and runs side by side never meet. The pair is
//! deleted when the demo ends, however it ends; a pair whose process was
//! killed with SIGKILL is swept by the next run.

mod bridge;

pub use bridge::NetnsBridge;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

/// The source's address, inside its namespace.
pub const SOURCE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 1);
/// The destination's address, inside its namespace.
pub const DEST_ADDR: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 2);
/// Prefix of the namespaces' names; the owning pid follows.
const PREFIX: &str = "ferry-";

/// Errors of the namespace pair.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A command that sets the pair up failed.
    #[error("`{command}` failed: {stderr} (--netns needs root and iproute2's ip and tc)")]
    Command { command: String, stderr: String },
    /// The kernel cannot delay packets.
    #[error("--link-delay-ms needs the kernel's netem qdisc (CONFIG_NET_SCH_NETEM), which this kernel lacks; leave the delay out")]
    NoNetem,
    /// Entering a namespace failed.
    #[error("cannot enter network namespace {name}")]
    Enter {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

/// How the veth link is shaped, in both directions.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkShape {
    /// Bytes per second (tbf); `None`: as fast as veth goes.
    pub rate_bytes_per_sec: Option<u64>,
    /// One-way delay (netem); `None`: none.
    pub delay: Option<Duration>,
}

/// A source and a destination namespace joined by a shaped veth pair;
/// deleted on drop.
pub struct NetnsPair {
    source: String,
    dest: String,
}

impl NetnsPair {
    /// Creates the pair for this process, shaped as `shape`.
    pub fn create(shape: LinkShape) -> Result<Self, NetnsError> {
        sweep_stale();
        let pid = std::process::id();
        let pair = NetnsPair {
            source: format!("{PREFIX}src-{pid}"),
            dest: format!("{PREFIX}dst-{pid}"),
        };
        // From here, a failure drops `pair`, which deletes what was made.
        run("ip", &["netns", "add", &pair.source])?;
        run("ip", &["netns", "add", &pair.dest])?;
        run(
            "ip",
            &[
                "link",
                "add",
                "veth-src",
                "netns",
                &pair.source,
                "type",
                "veth",
                "peer",
                "name",
                "veth-dst",
                "netns",
                &pair.dest,
            ],
        )?;
        for (ns, dev, addr) in [
            (&pair.source, "veth-src", SOURCE_ADDR),
            (&pair.dest, "veth-dst", DEST_ADDR),
        ] {
            run(
                "ip",
                &["-n", ns, "addr", "add", &format!("{addr}/30"), "dev", dev],
            )?;
            run("ip", &["-n", ns, "link", "set", dev, "up"])?;
            run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
            shape_link(ns, dev, shape)?;
        }
        Ok(pair)
    }

    /// Moves the calling thread, and every thread it starts from now on,
    /// into the source namespace.
    pub fn enter_source(&self) -> Result<(), NetnsError> {
        let ns = open(&self.source)?;
        // SAFETY: setns on a valid, open namespace fd changes only this thread.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(NetnsError::Enter {
                name: self.source.clone(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Makes `cmd`'s process start in the destination namespace.
    pub fn run_in_dest(&self, cmd: &mut Command) -> Result<(), NetnsError> {
        start_in(&self.dest, cmd)
    }
}

/// Makes `cmd`'s process start in namespace `name`.
fn start_in(name: &str, cmd: &mut Command) -> Result<(), NetnsError> {
    let ns = open(name)?;
    // The closure runs in the forked child, before exec.
    // SAFETY: it only calls setns, which is async-signal-safe, on `ns`, which the closure owns and so keeps open until then.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        // The veth pair goes with its namespaces.
        for ns in [&self.source, &self.dest] {
            let _ = run("ip", &["netns", "del", ns]);
        }
    }
}

/// Opens a named namespace's file.
fn open(name: &str) -> Result<std::fs::File, NetnsError> {
    std::fs::File::open(format!("/run/netns/{name}")).map_err(|source| NetnsError::Enter {
        name: name.to_string(),
        source,
    })
}

/// tbf for the rate, under netem for the delay when there is one.
fn shape_link(ns: &str, dev: &str, shape: LinkShape) -> Result<(), NetnsError> {
    let mut parent = vec!["root"];
    if let Some(delay) = shape.delay {
        let ms = format!("{}ms", delay.as_secs_f64() * 1e3);
        run(
            "tc",
            &[
                "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", &ms,
            ],
        )
        .map_err(|e| match e {
            NetnsError::Command { stderr, .. } if stderr.contains("qdisc kind is unknown") => {
                NetnsError::NoNetem
            }
            e => e,
        })?;
        parent = vec!["parent", "1:"];
    }
    let Some(rate) = shape.rate_bytes_per_sec else {
        return Ok(());
    };
    // A packet larger than the bucket is dropped, and veth passes 64 KiB GSO
    // packets: hold 20 ms of traffic, at least 256 KiB.
    let burst = (rate / 50).max(256 << 10);
    let mut args = vec!["-n", ns, "qdisc", "add", "dev", dev];
    args.extend(parent);
    let (rate, burst) = (format!("{}bit", rate * 8), burst.to_string());
    args.extend(["tbf", "rate", &rate, "burst", &burst, "latency", "100ms"]);
    run("tc", &args)
}

/// Deletes pairs left by ferry processes that no longer exist.
fn sweep_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let pid = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(_, pid)| pid.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = run("ip", &["netns", "del", name]);
            }
        }
    }
}

/// Runs `program args`, turning a failure into an error naming it.
fn run(program: &str, args: &[&str]) -> Result<(), NetnsError> {
    let command = format!("{program} {}", args.join(" "));
    match Command::new(program).args(args).output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(NetnsError::Command {
            command,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }),
        Err(e) => Err(NetnsError::Command {
            command,
            stderr: e.to_string(),
        }),
    }
}
