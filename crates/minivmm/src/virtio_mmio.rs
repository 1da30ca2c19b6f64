//! The part of the virtio-mmio transport (virtio 1.2, 4.2.2) every minivmm
//! device shares: identification, feature negotiation, status and the
//! interrupt registers. Each device ([`crate::blk`], the fill device)
//! answers its queue and configuration registers itself.

use serde::{Deserialize, Serialize};

/// virtio-mmio magic, "virt".
const MAGIC: u32 = 0x7472_6976;
/// The vendor id minivmm's devices report: "MMVM".
const VENDOR: u32 = 0x4d56_4d4d;
/// The queue-notify register.
pub const QUEUE_NOTIFY: u64 = 0x50;
/// The status register.
pub const STATUS: u64 = 0x70;

/// The shared registers that are state (saved in each device's section
/// under these names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Common {
    /// Device status.
    pub status: u32,
    /// Which word of the device's features the guest reads.
    pub device_features_sel: u32,
    /// Which word of its own features the guest writes.
    pub driver_features_sel: u32,
    /// The features the driver accepted.
    pub driver_features: u64,
    /// Which queue the queue registers mean.
    pub queue_sel: u32,
    /// Interrupt status.
    pub interrupt_status: u32,
}

impl Common {
    /// A guest read of a shared register, for a device of `device_id`
    /// offering `features`; `None` for the device's own registers.
    pub fn read(&self, offset: u64, device_id: u32, features: u64) -> Option<u32> {
        Some(match offset {
            0x000 => MAGIC,
            0x004 => 2, // virtio-mmio version 2 (virtio 1.x)
            0x008 => device_id,
            0x00c => VENDOR,
            0x010 => (features >> (32 * self.device_features_sel.min(1))) as u32,
            0x060 => self.interrupt_status,
            STATUS => self.status,
            _ => return None,
        })
    }

    /// A guest write of `v` to a shared register: true if it was one.
    /// Status is the device's own, since writing 0 resets it.
    pub fn write(&mut self, offset: u64, v: u32) -> bool {
        match offset {
            0x014 => self.device_features_sel = v,
            0x020 => {
                let shift = 32 * u64::from(self.driver_features_sel.min(1));
                let kept = self.driver_features & !(0xffff_ffff << shift);
                self.driver_features = kept | (u64::from(v) << shift);
            }
            0x024 => self.driver_features_sel = v,
            0x030 => self.queue_sel = v,
            0x064 => self.interrupt_status &= !v,
            _ => return false,
        }
        true
    }
}

/// The little-endian word a guest wrote (shorter writes zero-extended).
pub fn word(data: &[u8]) -> u32 {
    let mut word = [0u8; 4];
    let n = data.len().min(4);
    word[..n].copy_from_slice(&data[..n]);
    u32::from_le_bytes(word)
}

/// Answers a guest read of `data.len()` bytes with `value`.
pub fn answer(value: u32, data: &mut [u8]) {
    let n = data.len().min(4);
    data[..n].copy_from_slice(&value.to_le_bytes()[..n]);
}
