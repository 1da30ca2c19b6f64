//! The envelope around a saved vCPU state: a fixed header in front of the
//! serde body, so a destination can tell "not ferry's vCPU state", "state from
//! a ferry that writes another format" and "state damaged on the way" apart,
//! each with its own message, before it parses anything.
//!
//! ```text
//!   0        8          12         16             24
//!   | magic  | version  | crc32    | body length  | body ...
//!   "FERRYCPU" u32 LE     u32 LE     u64 LE
//! ```
//!
//! The checksum is CRC-32 (IEEE) over the body only. The version names
//! the body's encoding: [`JSON`], which every ferry loads, or
//! [`COMPACT`] (bincode), which a source writes only for a destination
//! that said it loads it.

/// The first 8 bytes of every blob.
pub const MAGIC: [u8; 8] = *b"FERRYCPU";
/// Format 1: a JSON body.
pub const JSON: u32 = 1;
/// Format 2: the same state with a bincode body. In Debian's kernel
/// under the SVM host, parsing the JSON of two vCPUs was a large share of
/// the paused guest's time (docs/svm-host-runs.md, "The idle cell's pause").
pub const COMPACT: u32 = 2;
/// The newest format this ferry loads.
pub const VERSION: u32 = COMPACT;
/// The oldest format this ferry still loads.
pub const OLDEST_VERSION: u32 = JSON;
/// Bytes in front of the body.
pub const HEADER_LEN: usize = 24;

/// Why a blob was refused before its body was parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BlobError {
    /// Too short to hold even the header.
    #[error("vCPU state is {len} bytes, shorter than its {HEADER_LEN}-byte header")]
    Short {
        /// Bytes received.
        len: usize,
    },
    /// Not a ferry vCPU state blob.
    #[error(
        "not ferry vCPU state: it starts with \"{}\" where \"FERRYCPU\" was expected",
        .found.escape_ascii()
    )]
    BadMagic {
        /// The first 8 bytes received.
        found: [u8; 8],
    },
    /// A format this ferry does not load.
    #[error("vCPU state version {found}, this ferry loads {oldest} to {newest}")]
    Version {
        /// The blob's version.
        found: u32,
        /// Oldest loadable version.
        oldest: u32,
        /// Newest loadable version.
        newest: u32,
    },
    /// The body is not as long as the header says.
    #[error("vCPU state body is {actual} bytes, its header says {header}")]
    Length {
        /// Length in the header.
        header: u64,
        /// Bytes after the header.
        actual: usize,
    },
    /// The body's checksum does not match the header's.
    #[error(
        "vCPU state body has CRC-32 {actual:#010x}, its header says {header:#010x}: \
         the body was corrupted"
    )]
    Checksum {
        /// Checksum in the header.
        header: u32,
        /// Checksum of the body received.
        actual: u32,
    },
}

/// Puts the header, naming format `version`, in front of `body`.
pub fn encode(version: u32, body: &[u8]) -> Vec<u8> {
    let mut blob = Vec::with_capacity(HEADER_LEN + body.len());
    blob.extend_from_slice(&MAGIC);
    blob.extend_from_slice(&version.to_le_bytes());
    blob.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    blob.extend_from_slice(&(body.len() as u64).to_le_bytes());
    blob.extend_from_slice(body);
    blob
}

/// Checks the header of `blob` and returns its format and body.
pub fn decode(blob: &[u8]) -> Result<(u32, &[u8]), BlobError> {
    if blob.len() < HEADER_LEN {
        // Name the magic when there is one: a short blob that is not ferry's
        // is better reported as such.
        if blob.len() >= MAGIC.len() && blob[..MAGIC.len()] != MAGIC {
            return Err(BlobError::BadMagic {
                found: field(blob, 0),
            });
        }
        return Err(BlobError::Short { len: blob.len() });
    }
    let magic: [u8; 8] = field(blob, 0);
    if magic != MAGIC {
        return Err(BlobError::BadMagic { found: magic });
    }
    let version = u32::from_le_bytes(field(blob, 8));
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        return Err(BlobError::Version {
            found: version,
            oldest: OLDEST_VERSION,
            newest: VERSION,
        });
    }
    let crc = u32::from_le_bytes(field(blob, 12));
    let len = u64::from_le_bytes(field(blob, 16));
    let body = &blob[HEADER_LEN..];
    if len != body.len() as u64 {
        return Err(BlobError::Length {
            header: len,
            actual: body.len(),
        });
    }
    let actual = crc32fast::hash(body);
    if actual != crc {
        return Err(BlobError::Checksum {
            header: crc,
            actual,
        });
    }
    Ok((version, body))
}

/// The `N` bytes of `blob` at `at` (the caller checked the length).
fn field<const N: usize>(blob: &[u8], at: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&blob[at..at + N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_round_trips() {
        let blob = encode(JSON, b"{\"vcpus\":[]}");
        assert_eq!(&blob[..8], b"FERRYCPU");
        assert_eq!(blob.len(), HEADER_LEN + 12);
        assert_eq!(decode(&blob), Ok((JSON, &b"{\"vcpus\":[]}"[..])));
        assert_eq!(decode(&encode(COMPACT, b"")), Ok((COMPACT, &b""[..])));
    }

    #[test]
    fn the_header_is_laid_out_as_documented() {
        let blob = encode(JSON, b"abc");
        assert_eq!(u32::from_le_bytes(field(&blob, 8)), JSON);
        assert_eq!(
            u32::from_le_bytes(field(&blob, 12)),
            crc32fast::hash(b"abc")
        );
        assert_eq!(u64::from_le_bytes(field(&blob, 16)), 3);
    }

    #[test]
    fn a_bad_magic_is_named() {
        let mut blob = encode(JSON, b"body");
        blob[..8].copy_from_slice(b"[{\"cpui\"");
        let e = decode(&blob).unwrap_err();
        assert_eq!(e.to_string(), "not ferry vCPU state: it starts with \"[{\\\"cpui\\\"\" where \"FERRYCPU\" was expected");
        // Short and not ferry's: still a bad magic, not "too short".
        assert!(matches!(
            decode(b"[1,2,3,4,5]"),
            Err(BlobError::BadMagic { .. })
        ));
    }

    #[test]
    fn an_unknown_version_names_both() {
        let blob = encode(VERSION + 2, b"body");
        let e = decode(&blob).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "vCPU state version {}, this ferry loads {OLDEST_VERSION} to {VERSION}",
                VERSION + 2
            )
        );
        assert!(matches!(
            decode(&encode(0, b"")),
            Err(BlobError::Version { found: 0, .. })
        ));
    }

    #[test]
    fn a_corrupted_body_fails_its_checksum() {
        let mut blob = encode(JSON, b"some body");
        *blob.last_mut().unwrap() ^= 1;
        let e = decode(&blob).unwrap_err();
        assert!(matches!(e, BlobError::Checksum { .. }), "{e}");
        assert!(e.to_string().contains("corrupted"), "{e}");
    }

    #[test]
    fn truncation_is_a_length_error() {
        let blob = encode(JSON, b"some body");
        let e = decode(&blob[..blob.len() - 2]).unwrap_err();
        assert_eq!(
            e,
            BlobError::Length {
                header: 9,
                actual: 7
            }
        );
        assert_eq!(decode(&blob[..10]), Err(BlobError::Short { len: 10 }));
        let mut longer = blob.clone();
        longer.push(0);
        assert!(matches!(decode(&longer), Err(BlobError::Length { .. })));
    }
}
