//! The lifecycle a VMM expects around a migration: a destination that
//! waits for one only until its deadline, and a guest that arrives in the
//! state it left (paused stays paused).

mod common;

use common::{check, probed, quick_receive, running_source, spawn_receiver, wait_for_passes};
use ferry_engine::{migrate, Mode, NoProgress, Outcome};
use ferry_vm::Vm;

#[test]
fn awaiting_a_migration_gives_up_at_its_deadline() {
    let listener = ferry_engine::listen("127.0.0.1:0").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
    let err = ferry_engine::await_migration(&listener, Some(deadline))
        .err()
        .expect("nothing arrives");
    assert!(
        err.to_string()
            .starts_with("no connection from the source on 127.0.0.1:"),
        "{err}"
    );
}

/// A guest the VMM paused before the migration arrives paused: the
/// destination does not start it, says so, and the guest runs on from
/// where it was once the VMM resumes it there. A mode that may switch to
/// postcopy moves it by precopy (a paused guest dirties nothing, and
/// postcopy would run it on the destination).
#[test]
fn a_paused_guest_arrives_paused_and_runs_on_once_resumed() {
    for mode in [Mode::Precopy, Mode::Postcopy] {
        let (to, dest) = spawn_receiver(quick_receive());
        let mut src = running_source();
        src.pause().unwrap();
        let before = check(&src);
        let opts = {
            let mut o = probed();
            o.mode = mode;
            o
        };
        let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
        let (mut dvm, dsum) = dest.join().unwrap().unwrap();
        assert_eq!(summary.status, Outcome::Completed, "{mode}: {summary:?}");
        assert_eq!(summary.mode, Mode::Precopy, "{mode}");
        assert!(summary.postcopy.is_none());
        assert!(summary.digest_match && dsum.digest_match, "{mode}");
        assert!(
            dsum.paused,
            "{mode}: the destination says it kept the guest paused"
        );
        assert!(!dvm.is_running(), "{mode}: the guest was started");
        assert!(!src.is_running());
        // Nothing ran in between: the guest is where it was paused.
        assert_eq!(check(&*dvm), before, "{mode}");
        dvm.start().unwrap();
        wait_for_passes(&*dvm, before.progress + 1);
        assert_eq!(check(&*dvm).since(&before).errors, 0, "{mode}");
    }
}

#[test]
fn a_running_guest_arrives_running() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    migrate(&mut src, &to, &probed(), &NoProgress).unwrap();
    let (dvm, dsum) = dest.join().unwrap().unwrap();
    assert!(!dsum.paused && dvm.is_running());
}
