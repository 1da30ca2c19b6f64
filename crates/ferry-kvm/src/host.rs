//! What this host's KVM offers, for a VMM and for its tests.

use kvm_ioctls::Kvm;

/// Whether this machine's KVM can run a VM: `/dev/kvm` opens, speaks
/// KVM's stable API (version 12) and creates a VM. A device that opens but
/// is not KVM (a `/dev/null` bound over it, a module without a device
/// behind it) is unusable, with the reason.
pub fn kvm_usable() -> Result<(), String> {
    let kvm = Kvm::new().map_err(|e| format!("cannot open /dev/kvm: {e}"))?;
    check_api(&kvm)?;
    kvm.create_vm()
        .map(drop)
        .map_err(|e| format!("/dev/kvm cannot create a VM: {e}"))
}

/// Whether an open `/dev/kvm` is KVM and speaks its stable API (12).
pub fn check_api(kvm: &Kvm) -> Result<(), String> {
    match kvm.get_api_version() {
        12 => Ok(()),
        v if v < 0 => Err("/dev/kvm does not answer KVM_GET_API_VERSION: it is not KVM".into()),
        v => Err(format!("/dev/kvm speaks KVM API version {v}, not 12")),
    }
}

/// Whether /dev/kvm is usable here ([`kvm_usable`]).
pub fn kvm_available() -> bool {
    kvm_usable().is_ok()
}

/// For a test that needs /dev/kvm: whether it can run here. Where it
/// cannot, prints `SKIP <test>: /dev/kvm is not available on this machine`,
/// the line CI's log shows, and the test returns instead of failing.
pub fn require_kvm(test: &str) -> bool {
    match kvm_usable() {
        Ok(()) => true,
        Err(why) => {
            ferry_vm::skip!("SKIP {test}: /dev/kvm is not usable on this machine ({why})");
            false
        }
    }
}
