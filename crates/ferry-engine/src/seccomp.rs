//! What a VMM under seccomp must allow the engine: the threads it starts
//! and the syscalls it makes, by kind of migration. Firecracker and Cloud
//! Hypervisor run each thread under a filter of its own; this is the list
//! for the thread that calls [`crate::migrate`], [`crate::receive`] or
//! [`crate::local`]'s functions, which every thread the engine starts
//! inherits (a filter passes to threads created after it).
//!
//! The list covers the engine's own code and the Rust standard library
//! and glibc beneath it. What the VMM's hooks do when the engine calls them
//! ([`ferry_vm::Vm::pause`], `save_vcpus`, the factory that builds the
//! destination VM) is the VMM's to add: KVM ioctls, say.
//!
//! `crates/ferry-engine/tests/seccomp.rs` proves the list: each kind of
//! migration runs in a child process under a filter built from it with
//! rust-vmm's `seccompiler`, which kills on any other syscall, and a
//! filter missing one listed syscall sees the migration killed.
//! `docs/embedding.md` prints the same list.
//!
//! x86_64 only, as the engine's VMs are: the numbers are that ABI's.

#![cfg(target_arch = "x86_64")]

/// A kind of migration, for what it needs beyond the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigrationKind {
    /// Precopy over TCP (or UNIX sockets, or fds the caller holds).
    Precopy,
    /// Postcopy or hybrid: the destination pages in through userfaultfd.
    Postcopy,
    /// Same-host upgrade: memory's fds handed over a UNIX socket.
    Local,
    /// Either network kind over mutual TLS.
    Tls,
}

impl MigrationKind {
    /// Every kind.
    pub const ALL: [MigrationKind; 4] = [
        MigrationKind::Precopy,
        MigrationKind::Postcopy,
        MigrationKind::Local,
        MigrationKind::Tls,
    ];

    /// Its name in the docs.
    pub fn name(self) -> &'static str {
        match self {
            MigrationKind::Precopy => "precopy",
            MigrationKind::Postcopy => "postcopy",
            MigrationKind::Local => "local",
            MigrationKind::Tls => "tls",
        }
    }
}

/// One syscall the engine makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Syscall {
    /// Its name, as `man 2` and strace spell it.
    pub name: &'static str,
    /// Its number on x86_64.
    pub number: i64,
    /// What the engine makes it for.
    pub why: &'static str,
}

/// `sys!(SYS_name, "why")`: the syscall `name`, numbered by libc.
macro_rules! sys {
    ($nr:ident, $why:expr) => {
        Syscall {
            name: stringify!($nr).split_at(4).1,
            number: libc::$nr,
            why: $why,
        }
    };
}

/// Every kind: starting, naming and ending threads, memory, waiting, time.
const THREADS_AND_MEMORY: &[Syscall] = &[
    sys!(SYS_clone3, "start the engine's threads"),
    sys!(
        SYS_clone,
        "start threads where clone3 is refused (glibc falls back)"
    ),
    sys!(SYS_set_robust_list, "a new thread's start (glibc)"),
    sys!(SYS_rseq, "a new thread's start (glibc)"),
    sys!(SYS_rt_sigprocmask, "a new thread's start and end (glibc)"),
    sys!(
        SYS_sigaltstack,
        "a thread's stack-overflow guard (Rust std)"
    ),
    sys!(
        SYS_sched_getaffinity,
        "a thread's start (glibc); how many digest threads to run"
    ),
    sys!(
        SYS_prctl,
        "PR_SET_NAME: naming each thread (send-1, recv-1, ...)"
    ),
    sys!(SYS_gettid, "a thread's id (Rust std)"),
    sys!(SYS_exit, "a thread's end"),
    sys!(
        SYS_mmap,
        "thread stacks, page buffers, allocations; mapping a handed memfd (local)"
    ),
    sys!(SYS_munmap, "freeing them"),
    sys!(SYS_mremap, "growing large buffers"),
    sys!(SYS_mprotect, "thread stack guards, allocator arenas"),
    sys!(
        SYS_madvise,
        "MADV_DONTNEED: freeing a thread's stack and allocator memory"
    ),
    sys!(SYS_brk, "allocations on the caller's thread"),
    sys!(SYS_futex, "locks, channels, joins"),
    sys!(SYS_sched_yield, "spinning briefly on a lock"),
    sys!(SYS_clock_nanosleep, "paced sends, heartbeats, retry waits"),
    sys!(SYS_nanosleep, "sleeps (older glibc)"),
    sys!(SYS_clock_gettime, "time, where the vDSO does not answer"),
    sys!(
        SYS_getrandom,
        "a thread's first HashMap's keys (Rust std); TLS handshakes (rustls)"
    ),
    sys!(SYS_close, "closing sockets and fds"),
    sys!(
        SYS_fcntl,
        "F_GETFD, F_DUPFD_CLOEXEC: cloning sockets for reader and writer"
    ),
    sys!(
        SYS_openat,
        "/sys/devices/system/cpu/online: how many digest threads to run; \
         /proc/TID/comm: the name of a thread that waited for pages in postcopy; \
         /proc/self/smaps: whether guest RAM may be on huge pages (placement auto)"
    ),
    sys!(SYS_read, "reading them"),
    sys!(SYS_write, "writing to sockets; log lines"),
];

/// Precopy, postcopy and TLS: the connections, and userfaultfd, through
/// which the destination places the pages it has never touched.
const NETWORK: &[Syscall] = &[
    sys!(SYS_socket, "dialling a connection"),
    sys!(SYS_connect, "dialling a connection"),
    sys!(SYS_accept4, "taking a connection"),
    sys!(
        SYS_bind,
        "ferry_engine::listen, where the engine makes the listener"
    ),
    sys!(
        SYS_listen,
        "ferry_engine::listen, where the engine makes the listener"
    ),
    sys!(SYS_setsockopt, "TCP_NODELAY, timeouts, buffer sizes"),
    sys!(SYS_getsockopt, "SO_ERROR after a connect"),
    sys!(SYS_getsockname, "the local address, for the summary"),
    sys!(
        SYS_getpeername,
        "the peer's address, for errors and the summary"
    ),
    sys!(SYS_sendto, "sending frames"),
    sys!(SYS_recvfrom, "receiving frames"),
    sys!(
        SYS_poll,
        "waiting for a connection, a frame, or a userfaultfd event with a timeout"
    ),
    sys!(
        SYS_shutdown,
        "closing a connection both ways at the end or on failure"
    ),
    sys!(
        SYS_ioctl,
        "only the requests `ioctls` lists: FIONBIO, TIOCOUTQ and userfaultfd's"
    ),
    sys!(
        SYS_userfaultfd,
        "a userfaultfd where /dev/userfaultfd is absent"
    ),
    sys!(
        SYS_getpid,
        "checking a userfaultfd's owner (userfaultfd crate)"
    ),
];

/// Same-host: one UNIX socket, the memory's fds over it.
const LOCAL: &[Syscall] = &[
    sys!(SYS_socket, "the UNIX socket"),
    sys!(SYS_connect, "the source connects"),
    sys!(SYS_accept4, "the destination takes it"),
    sys!(SYS_bind, "listen_local"),
    sys!(SYS_listen, "listen_local"),
    sys!(SYS_unlink, "listen_local removes a stale socket file"),
    sys!(
        SYS_statx,
        "listen_local: whether a stale socket file is there"
    ),
    sys!(SYS_setsockopt, "read and write timeouts"),
    sys!(SYS_sendmsg, "messages, with the fds as SCM_RIGHTS"),
    sys!(SYS_recvmsg, "messages, with the fds as SCM_RIGHTS"),
    sys!(SYS_sendto, "messages without fds"),
    sys!(SYS_recvfrom, "messages without fds"),
    sys!(
        SYS_lseek,
        "SEEK_DATA and SEEK_HOLE: hashing only the pages a memfd holds"
    ),
    sys!(SYS_fstatfs, "whether a handed file is on hugetlbfs"),
];

/// TLS, besides the network kinds' list.
const TLS: &[Syscall] = &[sys!(SYS_writev, "TLS records")];

/// The syscalls a migration of `kind` makes, each once, in name order.
pub fn syscalls(kind: MigrationKind) -> Vec<Syscall> {
    let extra: &[&[Syscall]] = match kind {
        MigrationKind::Precopy | MigrationKind::Postcopy => &[NETWORK],
        MigrationKind::Local => &[LOCAL],
        MigrationKind::Tls => &[NETWORK, TLS],
    };
    let mut all: Vec<Syscall> = THREADS_AND_MEMORY.to_vec();
    for list in extra {
        for s in *list {
            if !all.iter().any(|a| a.number == s.number) {
                all.push(*s);
            }
        }
    }
    all.sort_by_key(|s| s.name);
    all
}

/// One ioctl request the engine makes: a value `ioctl`'s second argument
/// may take under a filter (Firecracker filters each thread's ioctls by
/// request the same way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ioctl {
    /// Its name, as the kernel's headers spell it.
    pub name: &'static str,
    /// Its request number.
    pub request: u64,
    /// What the engine makes it for.
    pub why: &'static str,
}

/// The ioctl requests a migration of `kind` makes, in name order: the
/// network's two socket requests and userfaultfd's (a destination pages
/// in through userfaultfd in every network mode: precopy places its pages
/// with it where the VM asks). A same-host upgrade makes none.
pub fn ioctls(kind: MigrationKind) -> Vec<Ioctl> {
    if kind == MigrationKind::Local {
        return Vec::new();
    }
    let socket = [
        Ioctl {
            name: "FIONBIO",
            request: libc::FIONBIO,
            why: "a non-blocking accept, so that a wait for a connection has a deadline",
        },
        Ioctl {
            name: "TIOCOUTQ",
            request: libc::TIOCOUTQ,
            why: "what the kernel has not yet sent on a connection",
        },
    ];
    let uffd = ferry_vm::uffd::IOCTL_REQUESTS
        .iter()
        .map(|&(name, request, why)| Ioctl { name, request, why });
    let mut all: Vec<Ioctl> = socket.into_iter().chain(uffd).collect();
    all.sort_by_key(|i| i.name);
    all
}

/// A thread the engine starts.
#[derive(Clone, Copy, Debug)]
pub struct EngineThread {
    /// Its name (`N` counts from 1, or from 0 for uffd handlers).
    pub name: &'static str,
    /// Which end starts it.
    pub side: &'static str,
    /// Which kinds of migration start it.
    pub kinds: &'static [MigrationKind],
    /// What it does.
    pub work: &'static str,
}

const NET: &[MigrationKind] = &[
    MigrationKind::Precopy,
    MigrationKind::Postcopy,
    MigrationKind::Tls,
];
const PAGING: &[MigrationKind] = &[MigrationKind::Postcopy];
const SAME_HOST: &[MigrationKind] = &[MigrationKind::Local];

/// Every thread the engine starts. The same-host upgrade starts one, on
/// the source, for the length of the handshake; the rest of it runs on the
/// caller's thread.
pub const THREADS: &[EngineThread] = &[
    EngineThread {
        name: "ctl-reader",
        side: "both",
        kinds: NET,
        work: "reads the main channel",
    },
    EngineThread {
        name: "ctl-heartbeat",
        side: "both",
        kinds: NET,
        work: "sends heartbeats, so that a silent peer is noticed",
    },
    EngineThread {
        name: "send-N",
        side: "source",
        kinds: NET,
        work: "one per data connection: compresses and sends page batches",
    },
    EngineThread {
        name: "recv-N",
        side: "destination",
        kinds: NET,
        work: "one per data connection: reads and checks page batches",
    },
    EngineThread {
        name: "place-N",
        side: "destination",
        kinds: NET,
        work: "one per data connection: places pages into guest memory",
    },
    EngineThread {
        name: "digest-N",
        side: "both",
        kinds: NET,
        work: "hash guest memory for the digest at the switchover, one per core, for its length",
    },
    EngineThread {
        name: "give-up",
        side: "source",
        kinds: NET,
        work: "cancels the migration at its deadline (only with one set)",
    },
    EngineThread {
        name: "page-server",
        side: "source",
        kinds: PAGING,
        work: "answers the destination's page requests on the priority connection",
    },
    EngineThread {
        name: "uffd-handler-N",
        side: "destination",
        kinds: PAGING,
        work: "reads userfaultfd faults and asks for their pages",
    },
    EngineThread {
        name: "prio-reader",
        side: "destination",
        kinds: PAGING,
        work: "reads the answers on the priority connection and places them",
    },
    EngineThread {
        name: "local-hash",
        side: "source",
        kinds: SAME_HOST,
        work: "hashes guest memory while the destination builds its VM, until it accepts",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_lists_each_syscall_once_with_its_reason() {
        for kind in MigrationKind::ALL {
            let list = syscalls(kind);
            for (i, s) in list.iter().enumerate() {
                assert!(!s.why.is_empty(), "{}", s.name);
                assert!(list[i + 1..].iter().all(|o| o.number != s.number));
            }
        }
        let local = syscalls(MigrationKind::Local);
        assert!(local.iter().any(|s| s.name == "sendmsg"));
        assert!(!local.iter().any(|s| s.name == "ioctl"));
    }
}
