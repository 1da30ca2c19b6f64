//! What this host's KVM offers, for a VMM and for its tests.

use kvm_ioctls::Kvm;

/// Whether /dev/kvm can be opened here.
pub fn kvm_available() -> bool {
    Kvm::new().is_ok()
}

/// For a test that needs /dev/kvm: whether it can run here. Where it
/// cannot, prints `SKIP <test>: /dev/kvm is not available on this machine`,
/// the line CI's log shows, and the test returns instead of failing.
pub fn require_kvm(test: &str) -> bool {
    let ok = kvm_available();
    if !ok {
        println!("SKIP {test}: /dev/kvm is not available on this machine");
    }
    ok
}
