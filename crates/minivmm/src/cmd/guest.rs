//! Which guest the VM boots: minivmm's own program, or a Linux kernel.

use clap::{Args, ValueEnum};
use minivmm::linux::LinuxGuest;
use minivmm::MiniConfig;
use std::path::PathBuf;

/// The guest kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GuestKind {
    /// minivmm's own guest program (CPL3, runs on any KVM).
    Program,
    /// A Linux kernel and initramfs (needs a VMX or SVM host).
    Linux,
}

/// The guest, as the source gives it.
#[derive(Args, Debug, Clone)]
pub struct GuestArgs {
    /// What the VM boots.
    #[arg(long, value_enum, default_value = "program")]
    guest: GuestKind,
    /// --guest linux: the bzImage [default: $SVM_HOST_KERNEL, Debian's
    /// kernel inside scripts/svm-host.sh].
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// --guest linux: the initramfs [default: $SVM_HOST_GUEST_INITRD, the
    /// checker's, inside scripts/svm-host.sh].
    #[arg(long)]
    initrd: Option<PathBuf>,
    /// --guest linux: the kernel command line.
    #[arg(
        long,
        default_value = "console=ttyS0 reboot=acpi panic=-1 pci=off 8250.nr_uarts=1 quiet checker.mib=16"
    )]
    cmdline: String,
    /// --guest linux: MiB of guest RAM (16 MiB of it below the hole at
    /// 16 MiB, the rest above 32 MiB).
    #[arg(long, default_value_t = 256)]
    mem_mib: u64,
}

impl GuestArgs {
    /// Whether the guest is Linux.
    pub fn is_linux(&self) -> bool {
        self.guest == GuestKind::Linux
    }

    /// The same guest as arguments for another minivmm process (the
    /// demo's source).
    pub fn to_args(&self) -> Vec<String> {
        if !self.is_linux() {
            return Vec::new();
        }
        let mut args = vec!["--guest".into(), "linux".into()];
        for (flag, value) in [("--kernel", &self.kernel), ("--initrd", &self.initrd)] {
            if let Some(v) = value {
                args.extend([flag.to_string(), v.display().to_string()]);
            }
        }
        args.extend([
            "--cmdline".into(),
            self.cmdline.clone(),
            "--mem-mib".into(),
            self.mem_mib.to_string(),
        ]);
        args
    }

    /// Sets `config` up for the guest; refuses a Linux guest on a host
    /// that cannot run one, before anything starts.
    pub fn apply(&self, config: &mut MiniConfig) -> Result<(), String> {
        if !self.is_linux() {
            return Ok(());
        }
        minivmm::linux::check_host().map_err(|e| e.to_string())?;
        let needs = |e: String| format!("--guest linux {e}");
        let kernel = given_or_env(&self.kernel, "SVM_HOST_KERNEL", "kernel").map_err(needs)?;
        let initrd =
            given_or_env(&self.initrd, "SVM_HOST_GUEST_INITRD", "initrd").map_err(needs)?;
        if self.mem_mib < 128 || !self.mem_mib.is_multiple_of(2) {
            return Err(format!(
                "--mem-mib {}: a Linux guest takes an even number of MiB, at least 128",
                self.mem_mib
            ));
        }
        config.data_mib = self.mem_mib - 16;
        config.irqchip = true;
        config.linux = Some(LinuxGuest {
            kernel,
            initrd,
            cmdline: self.cmdline.clone(),
        });
        Ok(())
    }
}

/// A file given by `--flag`, or else by the environment variable `env`
/// (which scripts/svm-host.sh sets inside the host).
pub fn given_or_env(given: &Option<PathBuf>, env: &str, flag: &str) -> Result<PathBuf, String> {
    given
        .clone()
        .or_else(|| std::env::var_os(env).map(PathBuf::from))
        .ok_or_else(|| format!("needs --{flag} (or ${env}, which scripts/svm-host.sh sets)"))
}
