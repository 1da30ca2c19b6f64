//! The control socket of `ferry run --control PATH`: one JSON object per line,
//! one reply per request. It speaks two dialects, told apart per line:
//! ferry's own (`{"cmd": ...}`, [`lines`]) and QMP's (`{"execute": ...}`,
//! [`qmp`]), so tools written for QEMU's monitor can drive it too.
//! `ferry ctl` is its command-line client.
//!
//! ```text
//!  {"cmd":"status"}                                  -> progress and rates per vCPU
//!  {"cmd":"set","downtime_ms":100,"bandwidth_mib_s":512,"max_rounds":10,
//!   "converge":"quota","quota_interval_ms":50}      -> tunables, live, also mid-migration
//!  {"cmd":"throttle","percent":50}                   -> vCPUs sleep 50% of each 10 ms
//!  {"cmd":"migrate","to":"10.0.0.2:7070"}            -> the migration summary (blocks)
//!      optional: connections, stall_timeout_s, compress, verify_before_resume, tls_dir,
//!      delta_cache_mib, converge, max_downtime_ms, give_up_after_s, mode,
//!      postcopy_after_rounds, on_stall, recover_timeout_s, harvest_within_rounds
//!  {"cmd":"snapshot","path":"/var/vm.snap"}          -> the snapshot's summary (blocks);
//!      optional: stop (leave the guest paused), max_downtime_ms, max_rounds
//!  {"cmd":"resume"}                                  -> resumes a postcopy whose automatic
//!      recovery ran out of time (the source stays paused until then);
//!      optional: to (another address of the same destination)
//!  {"cmd":"cont"}                                    -> resumes a copy held paused after
//!      a lost Commit (see `Outcome::Held`): only once the other copy is known not to run
//!  {"cmd":"cancel"}                                  -> cancels a migration in precopy
//!  {"cmd":"stop"}                                    -> stops the VM and `ferry run`
//!  {"execute":"query-migrate"} ...                   -> QMP: see the qmp module
//! ```
//!
//! Outcome, set, cancel and the QMP queries are answered on the connection's
//! own thread, so they work while a migration is running. Migrate and stop go
//! to the thread that owns the VM; so does throttle, except during a
//! migration, when the engine applies it at its next batch (and records it in
//! the summary's throttle_timeline and operator_changes). A policy switch
//! (`converge` in `set`) lifts the old policy's throttle and engages the new
//! one at once; without a running migration it becomes the next one's
//! default.

pub mod client;
mod json_stream;
mod lines;
mod params;
mod qmp;

use ferry_control::Parsed;
use ferry_engine::choices::ConvergeMode;
use ferry_engine::custody::{CopyState, Custody};
use ferry_engine::monitor::{EventSink, Monitor};
use ferry_engine::Tunables;
use ferry_vm::GuestRam;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A connection's write half, shared by its replies and its events so that
/// lines never interleave.
pub type Writer = Arc<Mutex<UnixStream>>;

/// How long a subscriber may take to accept one event before it is dropped.
const EVENT_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Writes one line (ending in a newline) whole.
pub fn write_line(w: &Writer, line: &str) -> std::io::Result<()> {
    w.send(line)
}

/// Has `monitor` send its events to `conn` too, which gives up on an event
/// it cannot write within [`EVENT_WRITE_TIMEOUT`].
pub fn subscribe(monitor: &Monitor, conn: &Writer) {
    if let Ok(c) = conn.lock() {
        let _ = c.set_write_timeout(Some(EVENT_WRITE_TIMEOUT));
    }
    monitor.subscribe(Arc::clone(conn) as Arc<dyn EventSink>);
}

/// What the VM's thread must do, with where to send the reply.
pub enum VmCommand {
    Migrate {
        to: String,
        /// The engine's options, on the VM's own tunables.
        opts: ferry_engine::PrecopyOptions,
        tls: Option<ferry_engine::TlsConfig>,
        reply: Sender<Value>,
    },
    /// Saves the VM to a file while it runs (`{"cmd":"snapshot"}`, or
    /// QMP's `migrate` to a `file:` URI).
    Snapshot {
        request: ferry_control::SnapshotRequest,
        reply: Sender<Value>,
    },
    Throttle {
        percent: u8,
        reply: Sender<Value>,
    },
    Resume {
        to: Option<String>,
        reply: Sender<Value>,
    },
    Stop {
        reply: Sender<Value>,
    },
    /// Resumes a copy held paused after a lost Commit, or paused by
    /// `stop` (QMP's `cont`).
    Cont {
        reply: Sender<Value>,
    },
    /// Pauses the guest; the VMM runs on (QMP's `stop`).
    Pause {
        reply: Sender<Value>,
    },
}

/// Errors of the control socket.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket could not be created.
    #[error("cannot listen on control socket {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The socket could not be reached.
    #[error("cannot reach control socket {path} (is `ferry run --control` running?)")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Talking on the socket failed.
    #[error("control socket I/O")]
    Io(#[from] std::io::Error),
    /// The reply was not JSON.
    #[error("control socket reply is not JSON: {0}")]
    Reply(String),
}

/// What connection threads share.
#[derive(Clone)]
pub struct Shared {
    /// The guest whose progress `status` reads: set once it exists (a
    /// destination's monitor is up while its VM is still arriving).
    pub guest: Arc<OnceLock<Guest>>,
    pub tunables: Arc<Tunables>,
    pub commands: Sender<VmCommand>,
    /// Requests being answered: `ferry run` waits for these before it exits,
    /// so the reply to the migrate or stop that ends it is written whole.
    pub answering: Arc<AtomicUsize>,
    /// The migration under way or last finished, and its events.
    pub monitor: Arc<Monitor>,
    /// The convergence policy set without a migration running: the next
    /// migration's default. `None`: the backend's default.
    pub next_converge: Arc<Mutex<Option<ConvergeMode>>>,
    /// Who may run this copy: held after a lost Commit, left by a failed
    /// postcopy, or moved away (then only queries and `quit` are answered).
    pub custody: Arc<ferry_engine::custody::Custody>,
    /// QMP's `postcopy-ram` capability: a migration that names no mode
    /// runs as a hybrid that switches only when asked.
    pub postcopy_ram: Arc<AtomicBool>,
    /// The frames a lazy restore of this VM saw its guest touch first, in
    /// order (empty for a VM not restored lazily): its snapshots' working
    /// sets start with them.
    pub first_touches: Arc<Mutex<Vec<u64>>>,
}

/// The guest a monitor serves.
pub struct Guest {
    pub ram: Arc<GuestRam>,
    pub vcpus: u32,
}

impl Shared {
    /// What a monitor's connections share before the VM is served: the
    /// copy in `state` (a destination's: [`CopyState::Arriving`]), with a
    /// monitor for `total_bytes` of guest memory (0: not known yet).
    /// Fails if the monitor's event thread cannot be started.
    pub fn new(
        state: CopyState,
        total_bytes: u64,
    ) -> std::io::Result<(Shared, Receiver<VmCommand>)> {
        let (commands, rx) = std::sync::mpsc::channel();
        let shared = Shared {
            guest: Arc::default(),
            tunables: Tunables::shared(),
            commands,
            answering: Arc::default(),
            monitor: Monitor::start(total_bytes)?,
            next_converge: Arc::default(),
            custody: Arc::new(Custody::new(state)),
            postcopy_ram: Arc::default(),
            first_touches: Arc::default(),
        };
        Ok((shared, rx))
    }

    /// The guest has arrived (or booted): `status` reads it from now on.
    pub fn set_guest(&self, vm: &dyn ferry_vm::Vm) {
        let _ = self.guest.set(Guest {
            ram: vm.ram().clone(),
            vcpus: vm.vcpus(),
        });
    }

    /// The migration bringing the VM here failed with `why`: the monitor's
    /// clients hear it (`failed`) before this process exits.
    pub fn arrival_failed(&self, why: String) {
        self.monitor.finish_incoming(
            ferry_engine::Outcome::Failed,
            0,
            (0.0, 0.0),
            Some(why),
            Value::Null,
        );
        self.monitor.drain();
    }

    /// The VM arrived in `vm`: `status` reads it from now on, and the copy
    /// runs, is paused as it was at the source, or is held (`held`: why).
    pub fn arrived(&self, vm: &dyn ferry_vm::Vm, paused: bool, held: Option<String>) {
        self.set_guest(vm);
        self.custody.arrived(paused, held);
    }

    /// Serves the `control` and `qmp` sockets (either may be absent),
    /// saying where.
    pub fn serve_sockets(
        &self,
        control: Option<&Path>,
        qmp: Option<&Path>,
    ) -> Result<(), ControlError> {
        for (path, dialect, what) in [
            (control, Dialect::Both, "control socket"),
            (qmp, Dialect::Qmp, "QMP socket"),
        ] {
            if let Some(path) = path {
                serve(path, self.clone(), dialect)?;
                eprintln!("ferry: {what} at {}", path.display());
            }
        }
        Ok(())
    }

    fn next(&self) -> std::sync::MutexGuard<'_, Option<ConvergeMode>> {
        self.next_converge.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The policy the next migration takes, unless it names one.
    pub fn next_converge(&self) -> Option<ConvergeMode> {
        *self.next()
    }

    /// Sets it.
    pub fn set_next_converge(&self, mode: ConvergeMode) {
        *self.next() = Some(mode);
    }

    /// Back to the backend's default.
    pub fn clear_next_converge(&self) {
        *self.next() = None;
    }
}

/// Waits (at most 5 s) until no reply is being written.
pub fn wait_answered(answering: &AtomicUsize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while answering.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Which requests a socket serves.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// `--control`: ferry's JSON lines and QMP's requests, no greeting.
    Both,
    /// `--qmp`: QMP alone, as QEMU's monitor: a greeting first, and no
    /// command but `qmp_capabilities` until it was sent.
    Qmp,
}

/// Listens on `path` and serves each connection on its own thread.
pub fn serve(path: &Path, shared: Shared, dialect: Dialect) -> Result<(), ControlError> {
    // A stale socket file from a killed run would make bind fail.
    if path.exists() && UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
    let listener = UnixListener::bind(path).map_err(|source| ControlError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let shared = shared.clone();
                let _ = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || serve_connection(conn, &shared, dialect));
            }
        })
        .map_err(ControlError::Io)?;
    Ok(())
}

fn serve_connection(conn: UnixStream, shared: &Shared, dialect: Dialect) {
    let out: Writer = match conn.try_clone() {
        Ok(c) => Arc::new(Mutex::new(c)),
        Err(_) => return,
    };
    if dialect == Dialect::Qmp {
        return serve_qmp(conn, shared, &out);
    }
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        if line.trim().is_empty() {
            continue;
        }
        shared.answering.fetch_add(1, Ordering::AcqRel);
        let reply = answer(&line, shared, &out);
        let written = write_line(&out, &format!("{reply}\n"));
        shared.answering.fetch_sub(1, Ordering::AcqRel);
        if written.is_err() {
            return;
        }
    }
}

/// Serves a `--qmp` connection as QEMU's monitor does: a greeting, then
/// commands read as a JSON stream (see [`json_stream`]), each answered with
/// a reply ending in `\r\n`; only `qmp_capabilities` until it was sent.
fn serve_qmp(mut conn: UnixStream, shared: &Shared, out: &Writer) {
    let mut negotiating = true;
    if write_line(out, &format!("{}\r\n", qmp::greeting())).is_err() {
        return;
    }
    let mut splitter = json_stream::JsonSplitter::default();
    let mut buf = [0u8; 4096];
    loop {
        let n = match std::io::Read::read(&mut conn, &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut pieces = Vec::new();
        splitter.push(&buf[..n], &mut pieces);
        for piece in pieces {
            shared.answering.fetch_add(1, Ordering::AcqRel);
            let reply = match piece {
                json_stream::Piece::Object(text) => {
                    qmp::answer_strict(&text, &mut negotiating, shared, out)
                }
                json_stream::Piece::Junk(text) => json!({"error": {
                    "class": "GenericError",
                    "desc": format!("JSON parse error, invalid keyword '{text}'"),
                }}),
            };
            let written = write_line(out, &format!("{reply}\r\n"));
            shared.answering.fetch_sub(1, Ordering::AcqRel);
            if written.is_err() {
                return;
            }
        }
    }
}

/// Answers one line in either dialect.
fn answer(line: &str, shared: &Shared, out: &Writer) -> Value {
    match ferry_control::parse(line) {
        Ok(Parsed::Lines(req)) => lines::handle(req, shared),
        Ok(Parsed::Qmp { id, command }) => qmp::handle(id, command, shared, out),
        Err(e) => json!({"ok": false, "error": e}),
    }
}

pub(crate) fn forward(shared: &Shared, make: impl FnOnce(Sender<Value>) -> VmCommand) -> Value {
    // Nothing owns a VM to act on yet: refused, not queued behind the arrival.
    if shared.custody.is_arriving() {
        let error = ferry_engine::custody::CustodyError::Arriving.to_string();
        return json!({"ok": false, "error": format!(
            "{error}; to give up on it, stop this process (the source keeps its VM)"
        )});
    }
    let (tx, rx) = std::sync::mpsc::channel();
    if shared.commands.send(make(tx)).is_err() {
        return json!({"ok": false, "error": "the VM has stopped"});
    }
    rx.recv()
        .unwrap_or_else(|_| json!({"ok": false, "error": "the VM stopped before replying"}))
}

/// Sends one request to a control socket and returns the reply.
pub fn request(path: &Path, req: &Value) -> Result<Value, ControlError> {
    let mut conn = UnixStream::connect(path).map_err(|source| ControlError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    writeln!(conn, "{req}")?;
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|e| ControlError::Reply(format!("{e}: {line:?}")))
}
