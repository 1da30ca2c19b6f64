//! minivmm is built from the KVM pieces any VMM reuses, not from ferry's own
//! VM: its normal dependencies reach neither memstress nor ferry's VMs.

use std::process::Command;

#[test]
fn minivmm_depends_on_no_piece_of_ferrys_own_vms() {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "-p", "minivmm", "-e", "normal", "--prefix", "none"])
        .args(["--offline", "--format", "{p}"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        tree.lines().any(|l| l.starts_with("ferry-kvm ")),
        "the tree lists ferry-kvm:\n{tree}"
    );
    for own in ["ferry-memstress", "ferry-kvm-memstress", "ferry-soft"] {
        assert!(
            !tree.lines().any(|l| l.starts_with(&format!("{own} "))),
            "minivmm pulls in {own}:\n{tree}"
        );
    }
}
