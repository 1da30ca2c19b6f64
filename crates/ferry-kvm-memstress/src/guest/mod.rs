//! The memstress guest for real vCPUs: x86-64 code that ferry generates, and the
//! boot state that runs it at CPL3.
//!
//! Why CPL3: on this project's hosts KVM is `kvm_pvm` (shadow paging, nested), and
//! guest code at CPL0 is run instruction by instruction by KVM's emulator, far
//! slower (docs/svm-host.md, "What differs from kvm_pvm"). At CPL3 (long mode,
//! ring-3 segments, U bit at every paging level) it runs natively, and the same
//! setup is valid on ordinary VMX/SVM hosts. See `shared/notes/kvm-host-probe.md`.
//!
//! * [`code`]: the memstress loop, assembled with iced-x86.
//! * [`boot`]: identity page tables, GDT/TSS, and the initial registers.

pub mod boot;
pub mod code;
