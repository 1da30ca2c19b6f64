//! Where everything lives in the guest's physical memory.
//!
//! ```text
//!   region 0  [0, 16 MiB)            system: page tables, GDT/TSS and the
//!                                    code, shared by every vCPU; then one
//!                                    lane per vCPU (its variables, stack,
//!                                    virtqueue and request buffers)
//!   hole      [16 MiB, 32 MiB)       no memory (ferry never sends it)
//!   region 1  [32 MiB, 32 MiB + N)   data: each vCPU sweeps its own slice
//!   MMIO      0xd000_0000 + i·4 KiB  vCPU i's virtio-blk device
//!   port I/O  COM1..COM4             vCPU i's 16550 serial port
//! ```
//!
//! vCPU i runs the same program from the same code; it finds its lane in
//! `rdi` as it starts, and in its lane the device and port it drives.

/// Bytes of region 0.
pub const SYSTEM_BYTES: u64 = 16 << 20;
/// Where region 1 (the data) starts: a 16 MiB hole above region 0.
pub const DATA_GPA: u64 = 32 << 20;

/// The guest's level-4 page table.
pub const PML4: u64 = 0x1000;
/// Its page-directory-pointer table.
pub const PDPT: u64 = 0x2000;
/// The page directories: one per GiB mapped, up to four.
pub const PD: u64 = 0x3000;
/// The GDT.
pub const GDT: u64 = 0x7000;
/// The TSS, with the I/O permission bitmap after it (shared: no vCPU
/// takes an interrupt, so none needs its own stack in it).
pub const TSS: u64 = 0x7400;
/// The guest code.
pub const CODE: u64 = 0x1_0000;
/// Room for the code.
pub const CODE_MAX: usize = 0x1_0000;

/// The most vCPUs minivmm runs: one per legacy COM port.
pub const MAX_VCPUS: u32 = 4;
/// Where vCPU 0's lane starts.
pub const LANES: u64 = 0x10_0000;
/// Bytes of one lane.
pub const LANE_BYTES: u64 = 0x10_0000;

/// Where vCPU `i`'s lane starts.
pub fn lane(i: u32) -> u64 {
    LANES + u64::from(i) * LANE_BYTES
}

/// The serial port of vCPU `i`: COM1, COM2, COM3, COM4.
pub fn serial_port(i: u32) -> u16 {
    [0x3f8, 0x2f8, 0x3e8, 0x2e8][i as usize]
}

/// The lowest and the highest serial port, so that the I/O bitmap opens
/// them all (and the ports between, which exit to a VMM that ignores them).
pub const SERIAL_PORTS: std::ops::Range<u16> = 0x2e8..0x400;

/// The registers of vCPU `i`'s virtio-blk device.
pub fn mmio_base(i: u32) -> u64 {
    MMIO_BASE + u64::from(i) * MMIO_SIZE
}

// Offsets within a lane follow.

/// The vCPU's own variables (see [`var`]).
pub const VARS: u64 = 0x0;
/// Per-slot request state, [`SLOT_BYTES`] each (see [`slot`]).
pub const SLOTS_STATE: u64 = 0x100;
/// The top of the vCPU's stack.
pub const STACK_TOP: u64 = 0x1_0000;
/// The virtqueue's descriptor table.
pub const DESC: u64 = 0x1_0000;
/// Its available (driver) ring.
pub const AVAIL: u64 = 0x1_1000;
/// Its used (device) ring.
pub const USED: u64 = 0x1_2000;
/// Request headers, 16 bytes per slot.
pub const HEADERS: u64 = 0x1_3000;
/// Request status bytes, one per slot.
pub const STATUS: u64 = 0x1_4000;
/// The guest's table of the sequence number last written to each block.
pub const LAST_WRITTEN: u64 = 0x1_5000;
/// Data buffers, one block per slot.
pub const BUFFERS: u64 = 0x2_0000;
/// The fill device's descriptor table (vCPU 0's lane only).
pub const FILL_DESC: u64 = 0x1_6000;
/// Its available ring.
pub const FILL_AVAIL: u64 = 0x1_7000;
/// Its used ring.
pub const FILL_USED: u64 = 0x1_8000;
/// Its buffers, [`FILL_BUFFER_BYTES`] each: one page each, so the dirty
/// log has distinct pages to report.
pub const FILL_BUFFERS: u64 = 0x3_0000;
/// Buffers the guest keeps posted to the fill device.
pub const FILL_SLOTS: u64 = 4;
/// Bytes of one fill buffer.
pub const FILL_BUFFER_BYTES: u64 = 4096;
/// A list of guest addresses the VMM asks the vCPU to write (see
/// [`var::WRITE_COUNT`]): how a test has the guest write pages it chose.
pub const WRITE_LIST: u64 = 0x4_0000;
/// Entries that list holds.
pub const WRITE_LIST_MAX: u64 = 0x4_0000 / 8;

/// The first virtio-mmio device's registers.
pub const MMIO_BASE: u64 = 0xd000_0000;
/// Their size; device i follows device i − 1.
pub const MMIO_SIZE: u64 = 0x1000;

/// Entries in the virtqueue.
pub const QUEUE_SIZE: u16 = 16;
/// Requests the guest keeps in flight, each in its own three descriptors.
pub const SLOTS: u64 = 4;
/// Bytes of one disk block the guest writes and reads back.
pub const BLOCK_BYTES: u64 = 4096;
/// Blocks each slot cycles through (so slots never share a block).
pub const BLOCKS_PER_SLOT: u64 = 16;
/// Blocks on the disk the guest uses.
pub const DISK_BLOCKS: u64 = SLOTS * BLOCKS_PER_SLOT;
/// Bytes of one slot's state.
pub const SLOT_BYTES: u64 = 0x20;

/// Offsets of a vCPU's variables from its lane: what it has done, which
/// the VMM reads as its probe, and what the VMM told it.
pub mod var {
    /// The next console line's number.
    pub const CONSOLE_SEQ: u64 = 0x00;
    /// The next disk write's sequence number.
    pub const DISK_SEQ: u64 = 0x08;
    /// Writes completed.
    pub const WRITES_DONE: u64 = 0x10;
    /// Reads back that found the block last written.
    pub const READS_VERIFIED: u64 = 0x18;
    /// Reads back that did not.
    pub const BAD_READS: u64 = 0x20;
    /// Requests the device completed with an error status.
    pub const STATUS_ERRORS: u64 = 0x28;
    /// The driver's copy of the available ring's index.
    pub const AVAIL_IDX: u64 = 0x30;
    /// Used-ring entries the driver has handled.
    pub const USED_SEEN: u64 = 0x38;
    /// The sweep's next data page.
    pub const SWEEP_PAGE: u64 = 0x40;
    /// The sweep's pass.
    pub const SWEEP_PASS: u64 = 0x48;
    /// Main-loop iterations.
    pub const LOOPS: u64 = 0x50;
    /// Set by the VMM: the serial port this vCPU prints on.
    pub const PORT: u64 = 0x80;
    /// Set by the VMM: the address of this vCPU's device registers.
    pub const MMIO: u64 = 0x88;
    /// Set by the VMM: the first page of this vCPU's data slice.
    pub const SWEEP_BASE: u64 = 0x90;
    /// Set by the VMM: pages in that slice.
    pub const SWEEP_PAGES: u64 = 0x98;
    /// Set by the VMM: the fill device's registers, or 0 (no device, or
    /// not this vCPU's).
    pub const FILL_MMIO: u64 = 0xa0;
    /// The driver's copy of the fill queue's available index.
    pub const FILL_AVAIL_IDX: u64 = 0xa8;
    /// Fill used-ring entries handled.
    pub const FILL_SEEN: u64 = 0xb0;
    /// The fill sequence number the guest expects next.
    pub const FILL_NEXT: u64 = 0xb8;
    /// Filled buffers checked.
    pub const FILL_DONE: u64 = 0xc0;
    /// Sequence numbers skipped (buffers the device lost).
    pub const FILL_LOST: u64 = 0xc8;
    /// Sequence numbers that came again.
    pub const FILL_DOUBLED: u64 = 0xd0;
    /// Buffers whose check did not match their number.
    pub const FILL_BAD: u64 = 0xd8;
    /// Set by the VMM: addresses waiting in the lane's [`super::WRITE_LIST`];
    /// the vCPU writes a byte of each (a locked OR of 0: the value stays,
    /// the store happens) and sets it back to 0.
    pub const WRITE_COUNT: u64 = 0xe0;
    /// Lists the vCPU has written.
    pub const WRITE_DONE: u64 = 0xe8;
}

/// Offsets of a slot's state from its base in [`SLOTS_STATE`].
pub mod slot {
    /// 1: a write is in flight; 2: its read back is.
    pub const PHASE: u64 = 0x00;
    /// The sequence number it writes.
    pub const SEQ: u64 = 0x08;
    /// The block it writes and reads.
    pub const BLOCK: u64 = 0x10;
    /// Writes it has started (picks the next block).
    pub const ROUND: u64 = 0x18;
}

/// What a block's first 16 bytes carry: its sequence number and this
/// check, so a read back can tell a stale or torn block.
pub fn block_check(seq: u64, block: u64) -> u64 {
    seq.wrapping_mul(CHECK_MUL) ^ block
}

/// What a console line carries after its number: the number times this.
pub const CHECK_MUL: u64 = 0x9e37_79b9_7f4a_7c15;
