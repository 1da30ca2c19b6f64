//! The checker's disk records: one 4 KiB block each, written in turn
//! around the disk. A block holds its record's number, a check of the
//! number and the block, and a fill derived from both, so that a stale,
//! torn or misplaced block is told from the one written.
//!
//! The first 8 bytes are the number, little-endian: the VMM's block device
//! journals them as the writes it served (minivmm's exactly-once check).

/// Bytes of a record.
pub const BYTES: usize = 4096;
const CHECK_MUL: u64 = 0x9e37_79b9_7f4a_7c15;

/// The block record `seq` (from 1) goes to on a disk of `blocks` blocks.
pub fn block_of(seq: u64, blocks: u64) -> u64 {
    (seq - 1) % blocks
}

/// Record `seq` as written to `block`.
pub fn encode(seq: u64, block: u64) -> [u8; BYTES] {
    let mut b = [0u8; BYTES];
    b[..8].copy_from_slice(&seq.to_le_bytes());
    b[8..16].copy_from_slice(&(seq.wrapping_mul(CHECK_MUL) ^ block).to_le_bytes());
    let fill = seq.rotate_left(17) ^ block.wrapping_mul(CHECK_MUL);
    for (i, chunk) in b[16..].chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&fill.wrapping_add(i as u64).to_le_bytes());
    }
    b
}

/// The number in `data`, read from `block`, if it is a whole record of
/// that block; `None` for a never-written (zero) block; `Err` for a
/// damaged one.
pub fn decode(data: &[u8], block: u64) -> Result<Option<u64>, String> {
    if data.len() < BYTES {
        return Err(format!("{} bytes, not {BYTES}", data.len()));
    }
    let seq = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
    if seq == 0 && data[..BYTES].iter().all(|&b| b == 0) {
        return Ok(None);
    }
    match data[..BYTES] == encode(seq, block) {
        true => Ok(Some(seq)),
        false => Err(format!(
            "block {block} holds a damaged record (number {seq})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_decode_only_where_they_were_written() {
        let r = encode(5, 4);
        assert_eq!(decode(&r, 4), Ok(Some(5)));
        assert!(decode(&r, 3).is_err());
        let mut torn = r;
        torn[2048] ^= 1;
        assert!(decode(&torn, 4).is_err());
        assert_eq!(decode(&[0u8; BYTES], 9), Ok(None));
        assert_eq!(block_of(1, 8), 0);
        assert_eq!(block_of(9, 8), 0);
    }
}
