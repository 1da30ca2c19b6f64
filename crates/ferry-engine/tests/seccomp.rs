//! The engine's syscall list, proven: each mode's migration (precopy,
//! postcopy, same-host, TLS) runs with every thread of a child process
//! under a seccomp filter built from [`ferry_engine::seccomp`] with
//! rust-vmm's `seccompiler`, and any other syscall kills the child
//! (`SIGSYS`). `ioctl` is allowed only with the requests
//! [`ferry_engine::seccomp::ioctls`] lists. The filter goes on after the
//! source VM is built and before the engine makes its listener, with
//! TSYNC, so the engine's threads (spawned later) inherit it, and so do
//! the test VM's own threads.
//!
//! Other tests take one syscall or ioctl request the engine needs off the
//! list and see the child killed: the filter is live, not a formality.
//!
//! The child is this test binary run again with `FERRY_SECCOMP_MODE` set,
//! so that a kill fails one test cleanly instead of the whole run.

mod common;

use common::{create_test_vm, probed, quick_receive, TestConfig, TestProbe, TestVm};
use ferry_engine::local::{await_local, listen_local, migrate_local, receive_local, LocalOptions};
use ferry_engine::seccomp::{self, MigrationKind};
use ferry_engine::transport::tls::{pki, TlsConfig};
use ferry_engine::vmm::StreamHeader;
use ferry_engine::{
    await_migration, listen, migrate, receive, Dial, Listen, Mode, NoProgress, TcpDialer,
};
use ferry_vm::{Backing, GuestRam, Vm};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::Arc;

const MODE_VAR: &str = "FERRY_SECCOMP_MODE";
const DROP_VAR: &str = "FERRY_SECCOMP_DROP";
const DISCOVER_VAR: &str = "FERRY_SECCOMP_DISCOVER";
const CHILD: &str = "seccomp_child";
const PASSED: &str = "seccomp child: migrated under the filter";

/// What the test VM's own threads and its `Vm` hooks need, and what the
/// test harness needs to end the child: the VMM's share of a filter,
/// which a real VMM writes for its own code.
const TEST_VMM_SYSCALLS: &[i64] = &[
    libc::SYS_futex,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_sched_yield,
    libc::SYS_write,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_munmap,
    libc::SYS_madvise,
    libc::SYS_close,
    libc::SYS_unlink,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sigaltstack,
];

fn kind_of(name: &str) -> MigrationKind {
    match name {
        "precopy" => MigrationKind::Precopy,
        "postcopy" => MigrationKind::Postcopy,
        "local" => MigrationKind::Local,
        "tls" => MigrationKind::Tls,
        other => panic!("{MODE_VAR}={other}: not a migration kind"),
    }
}

/// The filter: the engine's list for `kind` and the test VMM's, less
/// `drop` (a syscall's or an ioctl request's name); `ioctl` only with the
/// requests listed; anything else kills the process.
fn filter(kind: MigrationKind, drop: Option<&str>) -> BpfProgram {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for s in seccomp::syscalls(kind) {
        if Some(s.name) != drop {
            rules.insert(s.number, vec![]);
        }
    }
    if let Some(ioctl) = rules.get_mut(&libc::SYS_ioctl) {
        for i in seccomp::ioctls(kind) {
            if Some(i.name) == drop {
                continue;
            }
            let request =
                SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, i.request)
                    .expect("a condition");
            ioctl.push(SeccompRule::new(vec![request]).expect("a rule"));
        }
    }
    for &nr in TEST_VMM_SYSCALLS {
        rules.entry(nr).or_default();
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        std::env::consts::ARCH
            .try_into()
            .expect("a seccomp architecture"),
    )
    .expect("a valid filter");
    filter.try_into().expect("compiles to BPF")
}

/// Runs this test binary's child test for `kind`, and returns how it ended
/// and what it printed.
fn run_child(kind: &str, drop: Option<&str>) -> (std::process::ExitStatus, String) {
    let mut cmd = Command::new(std::env::current_exe().expect("this test binary"));
    cmd.args([
        CHILD,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(MODE_VAR, kind);
    if let Some(d) = drop {
        cmd.env(DROP_VAR, d);
    }
    let out = cmd.output().expect("the child runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

fn assert_migrates_under_the_filter(kind: &str) {
    if kind == "postcopy" && !common::uffd_available("seccomp postcopy") {
        return;
    }
    let (status, text) = run_child(kind, None);
    assert!(
        status.success() && text.contains(PASSED),
        "{kind} under seccomp: {status:?} (signal {:?})\n{text}",
        status.signal()
    );
}

#[test]
fn a_precopy_migration_runs_under_the_documented_filter() {
    assert_migrates_under_the_filter("precopy");
}

#[test]
fn a_postcopy_migration_runs_under_the_documented_filter() {
    assert_migrates_under_the_filter("postcopy");
}

#[test]
fn a_same_host_migration_runs_under_the_documented_filter() {
    assert_migrates_under_the_filter("local");
}

#[test]
fn a_tls_migration_runs_under_the_documented_filter() {
    assert_migrates_under_the_filter("tls");
}

/// Runs the child for `kind` with `drop` off the list: it must die of
/// SIGSYS, so the filter is live where `drop` is made.
fn assert_killed_without(kind: &str, drop: &str) {
    let (status, text) = run_child(kind, Some(drop));
    assert_eq!(
        status.signal(),
        Some(libc::SIGSYS),
        "without {drop}, the {kind} child should die of SIGSYS: {status:?}\n{text}"
    );
    assert!(!text.contains(PASSED), "{text}");
}

#[test]
fn a_filter_missing_one_listed_syscall_kills_the_migration() {
    // `connect`: only the engine's dialer makes it, once the filter is on.
    assert_killed_without("precopy", "connect");
}

#[test]
fn the_listeners_are_made_under_the_filter() {
    // The filter goes on before `listen` and `listen_local`: what they
    // need is proven, not only listed.
    assert_killed_without("precopy", "listen");
    assert_killed_without("local", "bind");
}

#[test]
fn an_ioctl_request_not_listed_kills_the_migration() {
    // `ioctl` stays allowed, but not with FIONBIO (the destination's
    // non-blocking accept): the filter checks the request, not only the
    // syscall.
    assert_killed_without("precopy", "FIONBIO");
}

#[test]
fn docs_embedding_lists_every_thread_and_syscall() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/embedding.md");
    let doc = std::fs::read_to_string(path).expect("docs/embedding.md");
    let section = doc
        .split("## Seccomp: the engine's threads and syscalls")
        .nth(1)
        .expect("the seccomp section");
    for kind in MigrationKind::ALL {
        for s in seccomp::syscalls(kind) {
            let row = format!("| `{}` | {} |", s.name, s.why);
            assert!(section.contains(&row), "docs/embedding.md lacks: {row}");
        }
        for i in seccomp::ioctls(kind) {
            let row = format!("| `{}` | `{:#x}` | {} |", i.name, i.request, i.why);
            assert!(section.contains(&row), "docs/embedding.md lacks: {row}");
        }
    }
    for t in seccomp::THREADS {
        assert!(
            section.contains(&format!("| `{}` | {} |", t.name, t.side)),
            "docs/embedding.md lacks the thread {}",
            t.name
        );
    }
}

/// The child: builds both ends, turns the filter on, migrates, checks.
/// Only the tests above can run it: without their mode it fails rather
/// than pass having tested nothing.
#[test]
#[ignore = "run by the seccomp tests in a child process"]
fn seccomp_child() {
    let mode = std::env::var(MODE_VAR).unwrap_or_else(|_| {
        panic!("{MODE_VAR} is not set: the seccomp tests run this child, not cargo test --ignored")
    });
    let kind = kind_of(&mode);
    let drop = std::env::var(DROP_VAR).ok();
    let discover = std::env::var(DISCOVER_VAR).is_ok();
    let on = move || {
        if discover {
            // A marker for strace: what follows is under the filter.
            // SAFETY: getppid has no arguments and cannot fail.
            unsafe { libc::getppid() };
        } else {
            seccompiler::apply_filter_all_threads(&filter(kind, drop.as_deref()))
                .expect("the filter applies");
        }
    };
    match kind {
        MigrationKind::Local => local_child(on),
        _ => network_child(kind, on),
    }
    println!("{PASSED}");
}

fn network_child(kind: MigrationKind, filter_on: impl FnOnce()) {
    let certs = (kind == MigrationKind::Tls).then(|| {
        let dir = std::env::temp_dir().join(format!("ferry-seccomp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        pki::write_throwaway(&dir, &[]).unwrap();
        let c = TlsConfig::load(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        c
    });
    let mut src = common::running_source();
    let opts = {
        let mut o = probed();
        o.mode = if kind == MigrationKind::Postcopy {
            Mode::Postcopy
        } else {
            Mode::Precopy
        };
        o.connections = 2;
        o
    };
    // Before the listener: `listen` is the engine's, and its syscalls are
    // on the list.
    filter_on();
    let tcp = listen("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap().to_string();
    let (listener, dialer): (Box<dyn Listen + Send>, Box<dyn Dial>) = match &certs {
        Some(c) => (
            Box::new(c.listener(tcp)),
            Box::new(c.dialer(&addr).unwrap()),
        ),
        None => (Box::new(tcp), Box::new(TcpDialer(addr))),
    };
    let dest = std::thread::spawn(move || {
        let incoming = await_migration(&*listener, None)?;
        let mut create = create_test_vm;
        receive(incoming, &*listener, &mut create, &quick_receive())
    });
    let summary = migrate(&mut src, &*dialer, &opts, &NoProgress).unwrap();
    let (vm, dsum) = dest.join().unwrap().unwrap();
    assert!(summary.digest_match && dsum.digest_match, "{summary:?}");
    assert_eq!(summary.guest.guest_mismatches, Some(0));
    assert!(vm.is_running());
}

fn local_child(filter_on: impl FnOnce()) {
    let path = std::env::temp_dir().join(format!("ferry-seccomp-{}.sock", std::process::id()));
    let opts = {
        let mut o = LocalOptions::default();
        o.probe = Some(Arc::new(TestProbe));
        o
    };
    let mut src = TestVm::new(&TestConfig {
        backing: Backing::Memfd,
        ..common::config()
    })
    .unwrap();
    src.start().unwrap();
    common::wait_for_passes(&src, 1);
    // Before the listener: `listen_local` is the engine's.
    filter_on();
    let listener = listen_local(&path).unwrap();
    let dest_opts = opts.clone();
    let dest = std::thread::spawn(move || {
        let incoming = await_local(&listener, &dest_opts)?;
        let mut factory = |h: &StreamHeader, ram: GuestRam| {
            let config = TestVm::config_from(h, Backing::Memfd)?;
            Ok(Box::new(TestVm::on_ram(&config, ram)) as Box<dyn Vm>)
        };
        receive_local(incoming, &mut factory, &dest_opts)
    });
    let summary = migrate_local(&mut src, &path, &opts).unwrap();
    let (vm, dsum) = dest.join().unwrap().unwrap();
    assert!(summary.digest_match && dsum.digest_match, "{summary:?}");
    assert!(vm.is_running());
    let _ = std::fs::remove_file(&path);
}
