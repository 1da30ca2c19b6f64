//! The CPUID a Linux guest's vCPU sees: KVM's supported set, with what
//! firmware or a VMM must fill in itself.
//!
//! - leaf 1: the vCPU's APIC id, the package's logical processor count,
//!   and the hypervisor bit (without it Linux never looks for KVM's leaves,
//!   and so never uses kvmclock);
//! - leaf 0xB (and 0x1F): one thread per core, one core per vCPU, in one
//!   package;
//! - AMD's leaf 0x80000008: the core count; TOPOEXT off, so that Linux
//!   takes the topology from those leaves rather than from leaf 0x8000001E,
//!   which KVM leaves empty;
//! - leaf 0xD: no XSAVE component whose feature the CPU does not report
//!   (AVX, AVX-512). A host CPU may list one without the other (the SVM
//!   host's emulated EPYC lists AVX state without AVX), and Linux then
//!   warns at boot that the XSAVE sizes disagree.

use kvm_bindings::CpuId;

/// CPUID leaf 1 ECX: running under a hypervisor.
const HYPERVISOR: u32 = 1 << 31;
/// CPUID leaf 1 EDX: more than one logical processor per package.
const HTT: u32 = 1 << 28;
/// CPUID leaf 0x80000001 ECX: topology extensions (leaf 0x8000001E).
const TOPOEXT: u32 = 1 << 22;

/// CPUID leaf 1 ECX: AVX.
const AVX: u32 = 1 << 28;
/// CPUID leaf 7 EBX: AVX-512 Foundation.
const AVX512F: u32 = 1 << 16;
/// XSAVE components: AVX's upper halves; AVX-512's mask, upper and high
/// registers.
const XFEATURE_AVX: u32 = 1 << 2;
const XFEATURES_AVX512: u32 = 0b111 << 5;
/// The legacy area and the XSAVE header, before any component.
const XSAVE_BASE_BYTES: u32 = 512 + 64;

/// `supported` as vCPU `index` of `vcpus` sees it.
pub fn for_vcpu(supported: &CpuId, index: u32, vcpus: u32) -> CpuId {
    let mut cpuid = supported.clone();
    consistent_xsave(&mut cpuid);
    let bits = u32::BITS - (vcpus.max(1) - 1).leading_zeros();
    for e in cpuid.as_mut_slice() {
        match (e.function, e.index) {
            (1, _) => {
                e.ebx = (e.ebx & 0x0000_ffff) | (index << 24) | (vcpus << 16);
                e.ecx |= HYPERVISOR;
                if vcpus > 1 {
                    e.edx |= HTT;
                }
            }
            (0xb | 0x1f, 0) => {
                // SMT level: one thread per core.
                (e.eax, e.ebx, e.ecx, e.edx) = (0, 1, 1 << 8, index);
            }
            (0xb | 0x1f, 1) => {
                // Core level: the package's vCPUs.
                (e.eax, e.ebx, e.ecx, e.edx) = (bits, vcpus, 1 | 2 << 8, index);
            }
            (0xb | 0x1f, n) => {
                (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, n, index);
            }
            (0x8000_0001, _) => e.ecx &= !TOPOEXT,
            (0x8000_0008, _) => e.ecx = (e.ecx & !0xf0ff) | (bits << 12) | (vcpus - 1),
            _ => {}
        }
    }
    cpuid
}

/// Drops from leaf 0xD the XSAVE components of features the CPU does not
/// report, and sizes the area for the ones left.
fn consistent_xsave(cpuid: &mut CpuId) {
    let leaf = |c: &CpuId, f: u32, i: u32| {
        c.as_slice()
            .iter()
            .find(|e| e.function == f && e.index == i)
            .copied()
    };
    let has = |e: Option<kvm_bindings::kvm_cpuid_entry2>,
               reg: fn(&kvm_bindings::kvm_cpuid_entry2) -> u32,
               bit| { e.is_some_and(|e| reg(&e) & bit != 0) };
    let mut drop = 0;
    if !has(leaf(cpuid, 1, 0), |e| e.ecx, AVX) {
        drop |= XFEATURE_AVX;
    }
    if !has(leaf(cpuid, 7, 0), |e| e.ebx, AVX512F) {
        drop |= XFEATURES_AVX512;
    }
    let Some(d0) = leaf(cpuid, 0xd, 0) else {
        return;
    };
    if d0.eax & drop == 0 {
        return;
    }
    let kept = d0.eax & !drop;
    // The area ends where the last kept component ends (EBX: its offset,
    // EAX: its size, in its own subleaf).
    let end = (2..32)
        .filter(|i| kept & (1 << i) != 0)
        .filter_map(|i| leaf(cpuid, 0xd, i))
        .map(|e| e.ebx + e.eax)
        .fold(XSAVE_BASE_BYTES, u32::max);
    for e in cpuid.as_mut_slice() {
        match (e.function, e.index) {
            (0xd, 0) => {
                e.eax = kept;
                e.ebx = e.ebx.min(end);
                e.ecx = end;
            }
            (0xd, i) if (2..32).contains(&i) && drop & (1 << i) != 0 => {
                (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    #[test]
    fn each_vcpu_has_its_apic_id_and_the_hypervisor_bit() {
        let entry = |function, index| kvm_cpuid_entry2 {
            function,
            index,
            ..Default::default()
        };
        let supported = CpuId::from_entries(&[entry(1, 0), entry(0xb, 0), entry(0xb, 1)]).unwrap();
        let c = for_vcpu(&supported, 3, 4);
        let e = c.as_slice();
        assert_eq!(e[0].ebx >> 24, 3);
        assert_eq!((e[0].ebx >> 16) & 0xff, 4);
        assert_ne!(e[0].ecx & HYPERVISOR, 0);
        assert_eq!((e[1].edx, e[2].edx, e[2].ebx, e[2].eax), (3, 3, 4, 2));
    }

    #[test]
    fn avx_state_goes_when_the_cpu_reports_no_avx() {
        let entry = |function, index, eax, ebx, ecx| kvm_cpuid_entry2 {
            function,
            index,
            eax,
            ebx,
            ecx,
            ..Default::default()
        };
        // The SVM host's CPU: AVX state listed, AVX itself not.
        let host = [
            entry(1, 0, 0, 0, 0),
            entry(0xd, 0, 7, 0x240, 0x340),
            entry(0xd, 2, 0x100, 0x240, 0),
        ];
        let c = for_vcpu(&CpuId::from_entries(&host).unwrap(), 0, 1);
        let d0 = c.as_slice()[1];
        assert_eq!((d0.eax, d0.ebx, d0.ecx), (3, 0x240, 0x240));
        assert_eq!(c.as_slice()[2].eax, 0);
        // With AVX reported, leaf 0xD stays as it was.
        let mut with_avx = host;
        with_avx[0].ecx = AVX;
        let c = for_vcpu(&CpuId::from_entries(&with_avx).unwrap(), 0, 1);
        assert_eq!(c.as_slice()[1].ecx, 0x340);
    }
}
