//! Several hosts on one machine (`ferry drain --netns`): each host is a
//! network namespace whose NIC is one end of a veth pair; the other ends
//! meet on a bridge in a namespace of their own, the switch. `tc` shapes
//! every NIC both ways: tbf on the host's end (what it sends) and on the
//! switch's end (what it receives), so each host sends and receives at most
//! its NIC's rate, as on a non-blocking switch.
//!
//! ```text
//!   ferry-h1-PID  eth0 10.232.0.1 ──tbf── p1 ┐
//!   ferry-h2-PID  eth0 10.232.0.2 ──tbf── p2 ├─ br0  (ferry-sw-PID)
//!   ...                                      ┘
//! ```
//!
//! As with the pair, the addresses live only inside these namespaces, the
//! namespaces carry this process's pid, and they are deleted on drop (or
//! swept by the next run if this one was killed).

use super::{run, shape_link, start_in, sweep_stale, LinkShape, NetnsError, PREFIX};
use std::net::Ipv4Addr;
use std::process::Command;

/// The most hosts a bridge takes (addresses 10.232.0.1 up).
pub const MAX_HOSTS: usize = 250;

/// Hosts on one shaped bridge; deleted on drop.
pub struct NetnsBridge {
    switch: String,
    hosts: Vec<String>,
}

impl NetnsBridge {
    /// Creates `hosts` hosts for this process, each NIC shaped as `nic`.
    pub fn create(hosts: usize, nic: LinkShape) -> Result<Self, NetnsError> {
        assert!((1..=MAX_HOSTS).contains(&hosts), "1 to {MAX_HOSTS} hosts");
        sweep_stale();
        let pid = std::process::id();
        let mut bridge = NetnsBridge {
            switch: format!("{PREFIX}sw-{pid}"),
            hosts: Vec::new(),
        };
        // From here, a failure drops `bridge`, which deletes what was made.
        run("ip", &["netns", "add", &bridge.switch])?;
        let sw = bridge.switch.clone();
        run("ip", &["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        run("ip", &["-n", &sw, "link", "set", "br0", "up"])?;
        for h in 0..hosts {
            let ns = format!("{PREFIX}h{}-{pid}", h + 1);
            run("ip", &["netns", "add", &ns])?;
            bridge.hosts.push(ns.clone());
            let port = format!("p{}", h + 1);
            run(
                "ip",
                &[
                    "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port,
                    "netns", &sw,
                ],
            )?;
            run(
                "ip",
                &["-n", &sw, "link", "set", &port, "master", "br0", "up"],
            )?;
            let addr = format!("{}/24", Self::addr(h));
            run("ip", &["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            run("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
            run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
            shape_link(&ns, "eth0", nic)?;
            shape_link(&sw, &port, nic)?;
        }
        Ok(bridge)
    }

    /// Host `h`'s address (0-based).
    pub fn addr(h: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 232, 0, h as u8 + 1)
    }

    /// Makes `cmd`'s process start in host `h`'s namespace.
    pub fn run_in(&self, h: usize, cmd: &mut Command) -> Result<(), NetnsError> {
        start_in(&self.hosts[h], cmd)
    }
}

impl Drop for NetnsBridge {
    fn drop(&mut self) {
        // Each veth pair goes with its host's namespace.
        for ns in self.hosts.iter().chain(std::iter::once(&self.switch)) {
            let _ = run("ip", &["netns", "del", ns]);
        }
    }
}
