//! A running VM, served: its progress lines, its control and QMP sockets,
//! and the migrations they ask for, until it moves away or is stopped.
//! `ferry run` serves the VM it boots; `ferry receive` the one that
//! arrived (also a same-host upgrade's).

mod job;
mod snapshot;

use crate::control::{self, VmCommand};
use crate::error::CmdError;
use crate::rates;
use ferry_engine::custody::{ContError, CopyState};
use ferry_memstress::read_progress;
use job::{Job, LastJob};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a running VM is served.
pub struct Serve {
    /// Between progress lines.
    pub interval: Duration,
    /// Stop after this many seconds.
    pub duration: Option<f64>,
    /// The control socket to serve.
    pub control: Option<PathBuf>,
    /// The QMP socket to serve (greeting and negotiation, as QEMU's).
    pub qmp: Option<PathBuf>,
    /// Keep the monitor up after the VM moved away, until `quit` (QEMU's
    /// `postmigrate`).
    pub stay_after_migration: bool,
}

/// Runs a started VM on: prints its progress, serves its control socket,
/// and migrates it when asked. Returns when the VM moved away (success),
/// was stopped, or `duration` ran out; the exit code says whether the
/// guest's own checks found a mismatch.
pub fn serve_vm(vm: &mut dyn ferry_vm::Vm, a: &Serve) -> Result<ExitCode, CmdError> {
    let (ctl, commands) = control::Shared::new(CopyState::Running, vm.ram().size())
        .map_err(|e| CmdError::Failed(format!("cannot start the monitor's event thread: {e}")))?;
    // Before the sockets are announced: a signal may follow at once.
    stop_on_signal(&ctl);
    ctl.serve_sockets(a.control.as_deref(), a.qmp.as_deref())
        .map_err(|e| CmdError::Failed(ferry_vm::error_chain(&e)))?;
    serve_vm_on(vm, a, ctl, commands)
}

/// [`serve_vm`] with its monitor's sockets up already: a destination's,
/// which served them while the VM arrived (its custody says how it did).
pub fn serve_vm_on(
    vm: &mut dyn ferry_vm::Vm,
    a: &Serve,
    ctl: control::Shared,
    commands: std::sync::mpsc::Receiver<VmCommand>,
) -> Result<ExitCode, CmdError> {
    let vcpus = vm.vcpus();
    let started = Instant::now();
    let mut before = read_progress(vm.ram(), vcpus).map_err(|e| CmdError::Failed(e.to_string()))?;
    let mut at = Instant::now();
    let tunables = Arc::clone(&ctl.tunables);
    ctl.set_guest(vm);
    stop_on_signal(&ctl);
    if let CopyState::Held { why } = ctl.custody.state() {
        say_held(&why);
    }
    // The last migration: where a resume of its failed postcopy goes.
    let mut last: Option<LastJob> = None;
    // Where the VM went, once it moved and the monitor stays up.
    let mut moved_to: Option<String> = None;
    loop {
        let next = commands.recv_timeout(a.interval);
        if let Some(to) = &moved_to {
            match next {
                Ok(VmCommand::Stop { reply }) => {
                    let _ = reply.send(serde_json::json!({"ok": true}));
                    control::wait_answered(&ctl.answering);
                    return Ok(ExitCode::SUCCESS);
                }
                Ok(other) => refuse_moved(other, to),
                Err(_) => {}
            }
            continue;
        }
        match next {
            Ok(VmCommand::Throttle { percent, reply }) => {
                let throttled = match vm.time_throttle() {
                    Some(t) => t.set_time_throttle(percent.min(99)),
                    None => Err(ferry_vm::VmError::undeclared(vm.vmm_id(), "time throttle")),
                };
                let answer = match throttled {
                    Ok(()) => serde_json::json!({"ok": true, "throttle_percent": percent.min(99)}),
                    Err(e) => {
                        serde_json::json!({"ok": false, "error": ferry_vm::error_chain(&e)})
                    }
                };
                let _ = reply.send(answer);
                continue;
            }
            Ok(VmCommand::Stop { reply }) => {
                let _ = reply.send(serde_json::json!({"ok": true}));
                control::wait_answered(&ctl.answering);
                break;
            }
            Ok(VmCommand::Snapshot { request, reply }) => {
                snapshot::run(vm, request, reply, &ctl);
                // The guest's progress from here, not across the pause.
                before =
                    read_progress(vm.ram(), vcpus).map_err(|e| CmdError::Failed(e.to_string()))?;
                at = Instant::now();
                continue;
            }
            Ok(VmCommand::Resume { to, reply }) => {
                let Some((was_to, opts, tls)) = last.clone() else {
                    let error = ferry_engine::custody::CustodyError::NothingToResume;
                    let _ =
                        reply.send(serde_json::json!({"ok": false, "error": error.to_string()}));
                    continue;
                };
                let job = Job {
                    to: to.unwrap_or(was_to),
                    opts,
                    tls,
                    since: None,
                    resume: true,
                };
                if job.run(vm, &tunables, &mut last, reply, &ctl) {
                    if !a.stay_after_migration {
                        return Ok(ExitCode::SUCCESS);
                    }
                    say(format_args!(
                        "the monitor stays up (postmigrate) until quit or a signal"
                    ));
                    moved_to = Some(String::from("the destination"));
                }
            }
            Ok(VmCommand::Pause { reply }) => {
                let done = ctl.custody.stop(|| vm.pause());
                let _ = reply.send(custody_reply(
                    done,
                    "paused by stop: cont resumes the guest",
                ));
                continue;
            }
            Ok(VmCommand::Cont { reply }) => {
                let done = ctl.custody.cont(|| vm.start());
                let _ = reply.send(custody_reply(
                    done,
                    "resumed by cont: this copy of the guest runs",
                ));
                continue;
            }
            Ok(VmCommand::Migrate {
                to,
                opts,
                tls,
                reply,
            }) => {
                if let Err(e) = ctl.custody.may_migrate() {
                    let error = e.to_string();
                    ctl.monitor.refuse(&error);
                    let _ = reply.send(serde_json::json!({ "ok": false, "error": error }));
                } else {
                    let dest = to.clone();
                    let job = Job {
                        to,
                        opts,
                        tls,
                        since: Some((before.clone(), at)),
                        resume: false,
                    };
                    if job.run(vm, &tunables, &mut last, reply, &ctl) {
                        if !a.stay_after_migration {
                            return Ok(ExitCode::SUCCESS);
                        }
                        say(format_args!(
                            "the monitor stays up (postmigrate) until quit or a signal"
                        ));
                        moved_to = Some(dest);
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {}
        }
        vm.check_health()?;
        if ctl.custody.is_held() || ctl.custody.is_paused() {
            // Paused: no progress to report until `cont`.
            before = read_progress(vm.ram(), vcpus).map_err(|e| CmdError::Failed(e.to_string()))?;
            at = Instant::now();
            continue;
        }
        let now = read_progress(vm.ram(), vcpus).map_err(|e| CmdError::Failed(e.to_string()))?;
        let r = rates::rates(&before, &now, at.elapsed());
        let mismatches: u64 = now.iter().map(|p| p.mismatches).sum();
        say(format_args!(
            "[{:7.1}s] {} | mismatches {}",
            started.elapsed().as_secs_f64(),
            rates::describe(&r),
            mismatches
        ));
        before = now;
        at = Instant::now();
        if a.duration
            .is_some_and(|d| started.elapsed().as_secs_f64() >= d)
        {
            break;
        }
    }
    for path in [&a.control, &a.qmp].into_iter().flatten() {
        let _ = std::fs::remove_file(path);
    }
    vm.pause()?;
    let end = read_progress(vm.ram(), vcpus).map_err(|e| CmdError::Failed(e.to_string()))?;
    let mismatches: u64 = end.iter().map(|p| p.mismatches).sum();
    say(format_args!(
        "stopped after {:.1}s: {} passes, {} guest mismatches",
        started.elapsed().as_secs_f64(),
        end.iter().map(|p| p.passes).sum::<u64>(),
        mismatches
    ));
    Ok(if mismatches == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

/// SIGINT or SIGTERM from now on: cancel a migration under way, then stop
/// as the `stop` command does.
fn stop_on_signal(ctl: &control::Shared) {
    let (stop_tx, stop_tunables) = (ctl.commands.clone(), Arc::clone(&ctl.tunables));
    crate::signals::on_stop(move || {
        stop_tunables.cancel();
        let (reply, _) = std::sync::mpsc::channel();
        let _ = stop_tx.send(VmCommand::Stop { reply });
    });
}

/// The reply to a `stop` or `cont` the custody ran (or refused); `said`
/// goes to the progress lines when it changed the VM.
fn custody_reply(
    done: Result<bool, ContError<ferry_vm::VmError>>,
    said: &str,
) -> serde_json::Value {
    match done {
        Ok(changed) => {
            if changed {
                say(format_args!("{said}"));
            }
            serde_json::json!({"ok": true})
        }
        Err(ContError::Refused(e)) => serde_json::json!({"ok": false, "error": e.to_string()}),
        Err(ContError::Start(e)) => {
            serde_json::json!({"ok": false, "error": ferry_vm::error_chain(&e)})
        }
    }
}

/// Says that the VM is held (paused, verified, its fate the operator's)
/// and what to do.
fn say_held(why: &str) {
    eprintln!(
        "ferry: HELD: {why}. This copy of the guest stays paused with verified memory. \
         Once sure the other copy does not run, resume this one with \
         `ferry ctl SOCKET cont` (or {{\"cmd\":\"cont\"}}); `stop` discards it."
    );
}

/// Prints a progress line. A closed stdout (a parent that stopped reading)
/// must not end the process that runs the guest: the line is dropped.
fn say(line: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// Answers a command that needs the VM, which has moved away.
fn refuse_moved(command: VmCommand, to: &str) {
    // The monitor keeps describing the migration that moved the VM.
    let error = format!("the VM has moved to {to}: this monitor only answers queries and quit");
    let reply = match command {
        VmCommand::Migrate { reply, .. }
        | VmCommand::Snapshot { reply, .. }
        | VmCommand::Throttle { reply, .. }
        | VmCommand::Resume { reply, .. }
        | VmCommand::Cont { reply }
        | VmCommand::Pause { reply }
        | VmCommand::Stop { reply } => reply,
    };
    let _ = reply.send(serde_json::json!({ "ok": false, "error": error }));
}
