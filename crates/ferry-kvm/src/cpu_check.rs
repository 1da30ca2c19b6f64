//! Whether this host can give a guest the CPU it was given on another.
//!
//! A guest's CPUID is restored verbatim on the destination, so a guest told
//! it has AVX2 keeps believing it, and faults the first time it uses AVX2 on
//! a host without it. The source therefore names what the guest was given
//! ([`CpuProfile`]: the CPUID leaves set on its vCPUs and the MSRs its state
//! carries), and the destination compares it with what its own KVM gives a
//! guest ([`HostCpu`]: the CPUID of a fresh vCPU of its own, and the MSR
//! index lists) before any memory moves, refusing with the features it
//! lacks by name: `avx2 (leaf 7 ebx bit 5)`.
//!
//! Both sides read the CPUID back from a vCPU (`KVM_GET_CPUID2`) rather than
//! trusting `KVM_GET_SUPPORTED_CPUID`: on some hosts (this project's
//! `kvm_pvm`) a vCPU reports more than the supported list names, and a
//! restored guest keeps what its first host reported, so the two must be
//! compared in the same terms.
//!
//! Compared: the feature-flag registers of the leaves below, bit by bit (a
//! bit the guest has and the host does not is missing), and the XSAVE
//! components the guest may enable (leaf 0xd). Not compared: bits the guest
//! OS sets at run time (OSXSAVE, OSPKE, the local APIC's enable), and the
//! non-flag leaves (cache geometry, brand string, topology), which a guest
//! reads but does not fault on.
//!
//! [`HostCpu::without`] takes features away from the host's offer, as a
//! fleet's baseline CPU model does: a destination then refuses a guest that
//! has them, and the test of this check masks one out of the real
//! `KVM_GET_SUPPORTED_CPUID` result.

use kvm_bindings::{kvm_cpuid_entry2, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuFd};
use serde::{Deserialize, Serialize};

/// A CPUID register.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Reg {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

impl Reg {
    fn of(self, regs: &[u32; 4]) -> u32 {
        regs[self as usize]
    }

    fn name(self) -> &'static str {
        ["eax", "ebx", "ecx", "edx"][self as usize]
    }
}

/// The feature-flag registers compared, with the bits in them the guest OS
/// changes at run time (left out).
const FLAG_REGISTERS: &[(u32, u32, Reg, u32)] = &[
    // OSXSAVE (27) follows CR4; the hypervisor bit (31) is KVM's own.
    (1, 0, Reg::Ecx, 1 << 27 | 1 << 31),
    // The APIC bit (9) follows IA32_APIC_BASE's enable.
    (1, 0, Reg::Edx, 1 << 9),
    (7, 0, Reg::Ebx, 0),
    // OSPKE (4) follows CR4.PKE.
    (7, 0, Reg::Ecx, 1 << 4),
    (7, 0, Reg::Edx, 0),
    (7, 1, Reg::Eax, 0),
    (0xd, 0, Reg::Eax, 0),
    (0xd, 0, Reg::Edx, 0),
    (0xd, 1, Reg::Eax, 0),
    (0x8000_0001, 0, Reg::Ecx, 0),
    (0x8000_0001, 0, Reg::Edx, 0),
    (0x8000_0007, 0, Reg::Edx, 0),
    (0x8000_0008, 0, Reg::Ebx, 0),
];

/// Names of the features people look for, as Linux's /proc/cpuinfo spells
/// them. A bit not here is named by its place.
const NAMES: &[(u32, u32, Reg, u8, &str)] = &[
    (1, 0, Reg::Ecx, 0, "sse3"),
    (1, 0, Reg::Ecx, 1, "pclmulqdq"),
    (1, 0, Reg::Ecx, 9, "ssse3"),
    (1, 0, Reg::Ecx, 12, "fma"),
    (1, 0, Reg::Ecx, 13, "cx16"),
    (1, 0, Reg::Ecx, 19, "sse4_1"),
    (1, 0, Reg::Ecx, 20, "sse4_2"),
    (1, 0, Reg::Ecx, 21, "x2apic"),
    (1, 0, Reg::Ecx, 22, "movbe"),
    (1, 0, Reg::Ecx, 23, "popcnt"),
    (1, 0, Reg::Ecx, 25, "aes"),
    (1, 0, Reg::Ecx, 26, "xsave"),
    (1, 0, Reg::Ecx, 28, "avx"),
    (1, 0, Reg::Ecx, 29, "f16c"),
    (1, 0, Reg::Ecx, 30, "rdrand"),
    (1, 0, Reg::Edx, 0, "fpu"),
    (1, 0, Reg::Edx, 4, "tsc"),
    (1, 0, Reg::Edx, 5, "msr"),
    (1, 0, Reg::Edx, 8, "cx8"),
    (1, 0, Reg::Edx, 15, "cmov"),
    (1, 0, Reg::Edx, 19, "clflush"),
    (1, 0, Reg::Edx, 23, "mmx"),
    (1, 0, Reg::Edx, 24, "fxsr"),
    (1, 0, Reg::Edx, 25, "sse"),
    (1, 0, Reg::Edx, 26, "sse2"),
    (7, 0, Reg::Ebx, 0, "fsgsbase"),
    (7, 0, Reg::Ebx, 3, "bmi1"),
    (7, 0, Reg::Ebx, 4, "hle"),
    (7, 0, Reg::Ebx, 5, "avx2"),
    (7, 0, Reg::Ebx, 7, "smep"),
    (7, 0, Reg::Ebx, 8, "bmi2"),
    (7, 0, Reg::Ebx, 9, "erms"),
    (7, 0, Reg::Ebx, 10, "invpcid"),
    (7, 0, Reg::Ebx, 11, "rtm"),
    (7, 0, Reg::Ebx, 16, "avx512f"),
    (7, 0, Reg::Ebx, 17, "avx512dq"),
    (7, 0, Reg::Ebx, 18, "rdseed"),
    (7, 0, Reg::Ebx, 19, "adx"),
    (7, 0, Reg::Ebx, 20, "smap"),
    (7, 0, Reg::Ebx, 21, "avx512ifma"),
    (7, 0, Reg::Ebx, 23, "clflushopt"),
    (7, 0, Reg::Ebx, 24, "clwb"),
    (7, 0, Reg::Ebx, 28, "avx512cd"),
    (7, 0, Reg::Ebx, 29, "sha_ni"),
    (7, 0, Reg::Ebx, 30, "avx512bw"),
    (7, 0, Reg::Ebx, 31, "avx512vl"),
    (7, 0, Reg::Ecx, 1, "avx512vbmi"),
    (7, 0, Reg::Ecx, 2, "umip"),
    (7, 0, Reg::Ecx, 3, "pku"),
    (7, 0, Reg::Ecx, 6, "avx512_vbmi2"),
    (7, 0, Reg::Ecx, 8, "gfni"),
    (7, 0, Reg::Ecx, 9, "vaes"),
    (7, 0, Reg::Ecx, 10, "vpclmulqdq"),
    (7, 0, Reg::Ecx, 11, "avx512_vnni"),
    (7, 0, Reg::Ecx, 12, "avx512_bitalg"),
    (7, 0, Reg::Ecx, 14, "avx512_vpopcntdq"),
    (7, 0, Reg::Ecx, 22, "rdpid"),
    (7, 0, Reg::Edx, 4, "fsrm"),
    (7, 0, Reg::Edx, 8, "avx512_vp2intersect"),
    (7, 0, Reg::Edx, 10, "md_clear"),
    (7, 0, Reg::Edx, 14, "serialize"),
    (7, 0, Reg::Edx, 22, "amx_bf16"),
    (7, 0, Reg::Edx, 23, "avx512_fp16"),
    (7, 0, Reg::Edx, 24, "amx_tile"),
    (7, 0, Reg::Edx, 25, "amx_int8"),
    (7, 1, Reg::Eax, 4, "avx_vnni"),
    (7, 1, Reg::Eax, 5, "avx512_bf16"),
    (0xd, 0, Reg::Eax, 1, "xsave component sse"),
    (0xd, 0, Reg::Eax, 2, "xsave component avx"),
    (0xd, 0, Reg::Eax, 5, "xsave component avx512 opmask"),
    (0xd, 0, Reg::Eax, 6, "xsave component avx512 zmm_hi256"),
    (0xd, 0, Reg::Eax, 7, "xsave component avx512 hi16_zmm"),
    (0xd, 0, Reg::Eax, 9, "xsave component pkru"),
    (0xd, 0, Reg::Eax, 17, "xsave component amx tilecfg"),
    (0xd, 0, Reg::Eax, 18, "xsave component amx tiledata"),
    (0xd, 1, Reg::Eax, 0, "xsaveopt"),
    (0xd, 1, Reg::Eax, 1, "xsavec"),
    (0xd, 1, Reg::Eax, 2, "xgetbv1"),
    (0xd, 1, Reg::Eax, 3, "xsaves"),
    (0x8000_0001, 0, Reg::Ecx, 0, "lahf_lm"),
    (0x8000_0001, 0, Reg::Ecx, 5, "abm"),
    (0x8000_0001, 0, Reg::Ecx, 6, "sse4a"),
    (0x8000_0001, 0, Reg::Ecx, 8, "3dnowprefetch"),
    (0x8000_0001, 0, Reg::Edx, 11, "syscall"),
    (0x8000_0001, 0, Reg::Edx, 20, "nx"),
    (0x8000_0001, 0, Reg::Edx, 26, "pdpe1gb"),
    (0x8000_0001, 0, Reg::Edx, 27, "rdtscp"),
    (0x8000_0001, 0, Reg::Edx, 29, "lm"),
    (0x8000_0007, 0, Reg::Edx, 8, "constant_tsc"),
    (0x8000_0008, 0, Reg::Ebx, 9, "wbnoinvd"),
];

/// Errors of the check.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CpuCheckError {
    /// This host cannot give the guest what it was given.
    #[error("this host cannot give the guest the CPU it was given: it lacks {}", .0.join(", "))]
    Missing(Vec<String>),
    /// A feature named to take away is not one this check knows.
    #[error("unknown CPU feature '{0}' (known: {known})", known = known_names())]
    Unknown(String),
    /// A profile from the stream did not parse.
    #[error("the stream's CPU profile is not ferry-kvm's: {0}")]
    Profile(#[source] serde_json::Error),
    /// KVM would not say what it supports.
    #[error("{0} failed")]
    Ioctl(&'static str, #[source] vmm_sys_util::errno::Error),
}

fn known_names() -> String {
    NAMES
        .iter()
        .map(|n| n.4)
        .filter(|n| !n.contains(' '))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One CPUID leaf as a vCPU was given it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leaf {
    /// EAX on entry (the leaf).
    pub function: u32,
    /// ECX on entry (the subleaf), where it matters.
    pub index: u32,
    /// EAX, EBX, ECX, EDX.
    pub regs: [u32; 4],
}

impl From<&kvm_cpuid_entry2> for Leaf {
    fn from(e: &kvm_cpuid_entry2) -> Self {
        Leaf {
            function: e.function,
            index: e.index,
            regs: [e.eax, e.ebx, e.ecx, e.edx],
        }
    }
}

/// What a guest was given: its vCPUs' CPUID and the MSRs its state carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuProfile {
    /// The CPUID leaves set on its vCPUs (vCPU 0's; all are given the same).
    pub cpuid: Vec<Leaf>,
    /// The MSRs its vCPU state carries.
    pub msrs: Vec<u32>,
}

impl CpuProfile {
    /// The profile of a guest whose vCPUs were given `cpuid`, and whose state
    /// carries `msrs`.
    pub fn new(cpuid: &[kvm_cpuid_entry2], msrs: &[u32]) -> Self {
        CpuProfile {
            cpuid: cpuid.iter().map(Leaf::from).collect(),
            msrs: msrs.to_vec(),
        }
    }

    /// As a stream header carries it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// From a stream header.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, CpuCheckError> {
        serde_json::from_value(v.clone()).map_err(CpuCheckError::Profile)
    }
}

fn regs_of(leaves: &[Leaf], function: u32, index: u32) -> [u32; 4] {
    leaves
        .iter()
        .find(|l| (l.function, l.index) == (function, index))
        .map_or([0; 4], |l| l.regs)
}

fn name_of(function: u32, index: u32, reg: Reg, bit: u32) -> String {
    // Leaves as Intel's manual writes them: 7, 0xd, 0x80000001.
    let leaf = if function < 10 {
        function.to_string()
    } else {
        format!("{function:#x}")
    };
    let sub = if index == 0 {
        String::new()
    } else {
        format!(".{index}")
    };
    let place = format!("leaf {leaf}{sub} {} bit {bit}", reg.name());
    match NAMES
        .iter()
        .find(|n| (n.0, n.1, n.2, u32::from(n.3)) == (function, index, reg, bit))
    {
        Some(n) => format!("{} ({place})", n.4),
        None => place,
    }
}

/// What this host's KVM can give a guest.
#[derive(Clone, Debug)]
pub struct HostCpu {
    supported: Vec<Leaf>,
    msrs: Vec<u32>,
}

impl HostCpu {
    /// What this host gives a guest: the CPUID of `vcpu`, a vCPU of this
    /// host given `KVM_GET_SUPPORTED_CPUID` and not yet restored from a
    /// migration, and the MSRs of `KVM_GET_MSR_INDEX_LIST` and
    /// `KVM_GET_MSR_FEATURE_INDEX_LIST`.
    pub fn probe(kvm: &Kvm, vcpu: &VcpuFd) -> Result<Self, CpuCheckError> {
        let cpuid = vcpu
            .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| CpuCheckError::Ioctl("KVM_GET_CPUID2", e))?;
        let mut msrs = kvm
            .get_msr_index_list()
            .map_err(|e| CpuCheckError::Ioctl("KVM_GET_MSR_INDEX_LIST", e))?
            .as_slice()
            .to_vec();
        let features = crate::cpu_state::msrs::feature_msrs(kvm)
            .map_err(|e| CpuCheckError::Ioctl("KVM_GET_MSR_FEATURE_INDEX_LIST", e))?;
        if let Some(features) = features {
            msrs.extend_from_slice(features.as_slice());
        }
        Ok(Self::from_parts(cpuid.as_slice(), msrs))
    }

    /// A host that supports `cpuid` and `msrs`.
    pub fn from_parts(cpuid: &[kvm_cpuid_entry2], msrs: Vec<u32>) -> Self {
        HostCpu {
            supported: cpuid.iter().map(Leaf::from).collect(),
            msrs,
        }
    }

    /// This host less `features` (names as /proc/cpuinfo spells them: a
    /// fleet's baseline), refusing a name this check does not know.
    pub fn without(mut self, features: &[String]) -> Result<Self, CpuCheckError> {
        for feature in features {
            let (function, index, reg, bit, _) = NAMES
                .iter()
                .find(|n| n.4 == feature.as_str())
                .ok_or_else(|| CpuCheckError::Unknown(feature.clone()))?;
            for leaf in self
                .supported
                .iter_mut()
                .filter(|l| (l.function, l.index) == (*function, *index))
            {
                leaf.regs[*reg as usize] &= !(1 << bit);
            }
        }
        Ok(self)
    }

    /// The features `guest` was given that this host lacks, by name.
    pub fn missing(&self, guest: &CpuProfile) -> Vec<String> {
        let mut missing = Vec::new();
        for &(function, index, reg, runtime) in FLAG_REGISTERS {
            let want = reg.of(&regs_of(&guest.cpuid, function, index)) & !runtime;
            let have = reg.of(&regs_of(&self.supported, function, index));
            let lacking = want & !have;
            missing.extend(
                (0..32)
                    .filter(|bit| lacking & (1 << bit) != 0)
                    .map(|bit| name_of(function, index, reg, bit)),
            );
        }
        missing.extend(
            guest
                .msrs
                .iter()
                .filter(|m| !self.msrs.contains(m))
                .map(|m| format!("MSR {m:#x}")),
        );
        missing
    }

    /// Refuses `guest` if this host lacks anything it was given.
    pub fn check(&self, guest: &CpuProfile) -> Result<(), CpuCheckError> {
        match self.missing(guest) {
            m if m.is_empty() => Ok(()),
            m => Err(CpuCheckError::Missing(m)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32, regs: [u32; 4]) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: regs[0],
            ebx: regs[1],
            ecx: regs[2],
            edx: regs[3],
            ..Default::default()
        }
    }

    fn host() -> HostCpu {
        HostCpu::from_parts(
            &[
                entry(1, 0, [0, 0, 1 << 28 | 1 << 20, 1 << 26]),
                entry(7, 0, [0, 1 << 5 | 1 << 16, 0, 0]),
            ],
            vec![0x10, 0xc000_0080],
        )
    }

    #[test]
    fn the_same_cpu_passes_and_a_masked_one_names_what_it_lacks() {
        let h = host();
        let guest = CpuProfile {
            cpuid: h.supported.clone(),
            msrs: vec![0x10],
        };
        h.check(&guest).unwrap();
        let masked = h
            .clone()
            .without(&["avx2".into(), "avx512f".into()])
            .unwrap();
        assert_eq!(
            masked.missing(&guest),
            vec![
                "avx2 (leaf 7 ebx bit 5)".to_string(),
                "avx512f (leaf 7 ebx bit 16)".to_string()
            ]
        );
        let err = masked.check(&guest).unwrap_err().to_string();
        assert!(err.ends_with("it lacks avx2 (leaf 7 ebx bit 5), avx512f (leaf 7 ebx bit 16)"));
    }

    #[test]
    fn run_time_bits_unnamed_bits_and_msrs() {
        let h = host();
        let guest = CpuProfile {
            // OSXSAVE set by the guest OS is not a feature; bit 3 of leaf
            // 7 ecx has no name here.
            cpuid: vec![
                (&entry(1, 0, [0, 0, 1 << 27, 0])).into(),
                (&entry(7, 0, [0, 0, 1 << 3 | 1 << 13, 0])).into(),
            ],
            msrs: vec![0x10, 0x48],
        };
        assert_eq!(
            h.missing(&guest),
            vec![
                "pku (leaf 7 ecx bit 3)".to_string(),
                "leaf 7 ecx bit 13".to_string(),
                "MSR 0x48".to_string()
            ]
        );
        assert!(matches!(
            h.without(&["avx9000".into()]),
            Err(CpuCheckError::Unknown(_))
        ));
    }

    #[test]
    fn a_profile_survives_the_header() {
        let p = CpuProfile {
            cpuid: vec![(&entry(7, 0, [1, 2, 3, 4])).into()],
            msrs: vec![0x10],
        };
        assert_eq!(CpuProfile::from_json(&p.to_json()).unwrap(), p);
        assert!(CpuProfile::from_json(&serde_json::json!({"cpu": 1})).is_err());
    }
}
