//! [`FrameStream`]: buffered, offset-tracking frame I/O over one duplex byte
//! stream.
//!
//! The engine owns one `Read + Write` object for both directions (a TCP
//! socket, a Unix socket, later a TLS session), so buffering is done here
//! rather than with a `BufReader` and a `BufWriter` that would each need the
//! stream. Small frames gather in a 1 MiB write buffer; page data of 64 KiB or
//! more goes straight to the stream, so a batch costs one or two `write`
//! calls and no extra copy. Reads go through a 256 KiB buffer, large payloads
//! straight into the payload buffer. Every error carries the stream offset.

use super::frame::{self, FrameHead, FrameKind, FRAME_HEADER_LEN};
use super::{StreamError, MAGIC, MIN_VERSION, PREAMBLE_LEN, VERSION};
use std::io::{ErrorKind, Read, Write};

const WRITE_BUF: usize = 1 << 20;
const READ_BUF: usize = 256 << 10;
const DIRECT_WRITE: usize = 64 << 10;

/// Recorded bytes as a duplex stream: reads replay them, writes are
/// dropped. For decoding a capture, a fuzz input or a test's bytes with a
/// [`FrameStream`], which wants both directions.
pub struct Replay(std::io::Cursor<Vec<u8>>);

impl Replay {
    /// Replays `bytes`.
    pub fn new(bytes: Vec<u8>) -> Self {
        Replay(std::io::Cursor::new(bytes))
    }
}

impl Read for Replay {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Replay {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Frame-level reader and writer over a duplex stream.
pub struct FrameStream<S> {
    inner: S,
    wbuf: Vec<u8>,
    rbuf: Vec<u8>,
    rpos: usize,
    rend: usize,
    /// Large frames are arriving (the last payload was at least
    /// [`READ_BUF`]): every read then goes straight into its destination
    /// and the read buffer takes no bytes ahead, so that no payload is
    /// copied through it. A small frame turns this off.
    large_frames: bool,
    read_offset: u64,
    bytes_written: u64,
    /// The wire version this stream speaks: [`VERSION`] until the preamble
    /// or the peer's Welcome settles it.
    version: u32,
    /// The last frame read, and the buffers the next one is read into.
    last: ReadFrame,
}

/// A frame's payload, flags and page hashes, as read and checked by
/// [`FrameStream::read_frame`]. [`FrameStream::take_frame`] hands it out
/// whole, so that one thread reads and checks the next frame while another
/// uses this one; its buffers then go back in for a later read.
#[derive(Debug, Default)]
pub struct ReadFrame {
    payload: Vec<u8>,
    len: usize,
    flags: u8,
    /// The frame's chunk hashes, when it carried the page check.
    page_hashes: Vec<u64>,
}

impl ReadFrame {
    /// The frame's payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload[..self.len]
    }

    /// The frame's flags (0, or a compression flag on Pages).
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// The xxh3 of each page of the frame, when its check was built from
    /// them (an uncompressed Pages frame; see [`frame`]): the last ones are
    /// its pages', in payload order. `None` otherwise.
    pub fn page_hashes(&self) -> Option<&[u64]> {
        (!self.page_hashes.is_empty()).then_some(&self.page_hashes[..])
    }
}

impl<S: Read + Write> FrameStream<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        FrameStream {
            inner,
            wbuf: Vec::with_capacity(WRITE_BUF),
            rbuf: vec![0; READ_BUF],
            rpos: 0,
            rend: 0,
            large_frames: false,
            read_offset: 0,
            bytes_written: 0,
            version: VERSION,
            last: ReadFrame::default(),
        }
    }

    /// The wire version both ends speak on this stream, once settled: by
    /// [`FrameStream::read_preamble`] on the destination, and by the
    /// destination's Welcome ([`FrameStream::set_version`]) on the source.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Records the version the peer chose (a source, on Welcome).
    pub fn set_version(&mut self, version: u32) {
        self.version = version;
    }

    /// Bytes handed to the stream so far (preamble and frames).
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Bytes consumed from the stream so far.
    pub fn bytes_read(&self) -> u64 {
        self.read_offset
    }

    /// The underlying stream, for calls that neither read nor write.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The underlying stream, to read or write around the framing (only
    /// once the framed conversation is over).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The underlying stream.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Writes magic and the versions this ferry speaks.
    pub fn write_preamble(&mut self) -> Result<(), StreamError> {
        let mut p = [0u8; PREAMBLE_LEN];
        p[..8].copy_from_slice(&MAGIC);
        p[8..12].copy_from_slice(&VERSION.to_le_bytes());
        p[12..16].copy_from_slice(&MIN_VERSION.to_le_bytes());
        self.buffer(&p)
    }

    /// Reads the magic and the peer's versions; returns the newest version
    /// both ends speak, or [`StreamError::Version`].
    pub fn read_preamble(&mut self) -> Result<u32, StreamError> {
        let mut p = [0u8; PREAMBLE_LEN];
        let got = self.read_up_to(&mut p)?;
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&p[..8]);
        if got < 8 || magic != MAGIC {
            // A short stream whose bytes so far differ from the magic is not
            // ours; one that matches so far is merely cut off.
            if got < 8 && MAGIC[..got] == p[..got] {
                return Err(StreamError::Truncated {
                    offset: got as u64,
                    what: "the stream preamble",
                });
            }
            // A TLS record header: a handshake (22) of TLS major version 3.
            if got >= 2 && p[0] == 22 && p[1] == 3 {
                return Err(StreamError::TlsPeer);
            }
            return Err(StreamError::BadMagic { found: magic });
        }
        if got < PREAMBLE_LEN {
            return Err(StreamError::Truncated {
                offset: got as u64,
                what: "the stream preamble",
            });
        }
        let peer_max = u32::from_le_bytes([p[8], p[9], p[10], p[11]]);
        let peer_min = match u32::from_le_bytes([p[12], p[13], p[14], p[15]]) {
            0 => peer_max,
            v => v,
        };
        let common = peer_max.min(VERSION);
        if common < peer_min.max(MIN_VERSION) {
            return Err(StreamError::Version { peer_min, peer_max });
        }
        self.version = common;
        Ok(common)
    }

    /// Reads the next frame, or `None` if the peer closed the stream cleanly
    /// at a frame boundary.
    pub fn read_frame_or_end(&mut self) -> Result<Option<(FrameKind, u64)>, StreamError> {
        if self.rpos == self.rend {
            let n = self.refill()?;
            if n == 0 {
                return Ok(None);
            }
        }
        self.read_frame().map(Some)
    }

    /// Queues one frame whose payload is `parts` concatenated. Large parts
    /// are written through at once; call [`Self::flush`] to push the rest.
    pub fn write_frame(&mut self, kind: FrameKind, parts: &[&[u8]]) -> Result<(), StreamError> {
        self.write_frame_with_flags(kind, 0, parts)
    }

    /// Like [`Self::write_frame`], with frame flags (see [`super::compress`]).
    pub fn write_frame_with_flags(
        &mut self,
        kind: FrameKind,
        flags: u8,
        parts: &[&[u8]],
    ) -> Result<(), StreamError> {
        let head = frame::encode_header_with_flags(kind, flags, parts)?;
        self.buffer(&head)?;
        for part in parts {
            if part.len() >= DIRECT_WRITE {
                self.flush_buffer()?;
                self.inner.write_all(part).map_err(StreamError::Io)?;
                self.bytes_written += part.len() as u64;
            } else {
                self.buffer(part)?;
            }
        }
        Ok(())
    }

    /// Pushes everything queued to the peer.
    pub fn flush(&mut self) -> Result<(), StreamError> {
        self.flush_buffer()?;
        self.inner.flush().map_err(StreamError::Io)
    }

    fn buffer(&mut self, bytes: &[u8]) -> Result<(), StreamError> {
        if self.wbuf.len() + bytes.len() > WRITE_BUF {
            self.flush_buffer()?;
        }
        self.wbuf.extend_from_slice(bytes);
        self.bytes_written += bytes.len() as u64;
        Ok(())
    }

    fn flush_buffer(&mut self) -> Result<(), StreamError> {
        if !self.wbuf.is_empty() {
            self.inner.write_all(&self.wbuf).map_err(StreamError::Io)?;
            self.wbuf.clear();
        }
        Ok(())
    }

    /// Reads the next frame, checks length, CRC and type. The payload is then
    /// in [`Self::payload`] until the next read.
    pub fn read_frame(&mut self) -> Result<(FrameKind, u64), StreamError> {
        let offset = self.read_offset;
        let mut raw = [0u8; FRAME_HEADER_LEN];
        self.read_exact_or(&mut raw, "a frame header")?;
        let head: FrameHead = frame::decode_header(&raw, offset)?;
        let len = head.len as usize;
        self.large_frames = len >= READ_BUF;
        let mut last = std::mem::take(&mut self.last);
        if last.payload.len() < len {
            last.payload.resize(len, 0);
        }
        last.len = 0;
        last.flags = raw[1];
        let read = self.read_exact_or(&mut last.payload[..len], "a frame payload");
        let kind = read.and_then(|()| {
            last.len = len;
            frame::verify(&head, &raw, &last.payload[..len], &mut last.page_hashes)
        });
        self.last = last;
        Ok((kind?, offset))
    }

    /// The last frame read, taken out of the stream; the next frame is read
    /// into `spare`'s buffers (a frame taken before and done with, or
    /// [`ReadFrame::default`]), so frames circulate without copies.
    pub fn take_frame(&mut self, mut spare: ReadFrame) -> ReadFrame {
        spare.len = 0;
        spare.page_hashes.clear();
        std::mem::replace(&mut self.last, spare)
    }

    /// The xxh3 of each page of the last frame read: see
    /// [`ReadFrame::page_hashes`].
    pub fn page_hashes(&self) -> Option<&[u64]> {
        self.last.page_hashes()
    }

    /// Flags of the last frame read (0, or a compression flag on Pages).
    pub fn flags(&self) -> u8 {
        self.last.flags
    }

    /// Payload of the last frame read.
    pub fn payload(&self) -> &[u8] {
        self.last.payload()
    }

    fn read_exact_or(&mut self, dst: &mut [u8], what: &'static str) -> Result<(), StreamError> {
        let got = self.read_up_to(dst)?;
        if got < dst.len() {
            return Err(StreamError::Truncated {
                offset: self.read_offset,
                what,
            });
        }
        Ok(())
    }

    /// Fills `dst` as far as the stream goes; returns bytes read (short only
    /// at end of stream).
    fn read_up_to(&mut self, dst: &mut [u8]) -> Result<usize, StreamError> {
        let mut done = 0;
        while done < dst.len() {
            if self.rpos < self.rend {
                let n = (self.rend - self.rpos).min(dst.len() - done);
                dst[done..done + n].copy_from_slice(&self.rbuf[self.rpos..self.rpos + n]);
                self.rpos += n;
                done += n;
                continue;
            }
            let want = dst.len() - done;
            let n = if want >= READ_BUF || self.large_frames {
                retry_read(&mut self.inner, &mut dst[done..])?
            } else {
                let n = self.refill()?;
                if n > 0 {
                    continue;
                }
                0
            };
            if n == 0 {
                break;
            }
            done += n;
        }
        self.read_offset += done as u64;
        Ok(done)
    }
}

impl<S: Read> FrameStream<S> {
    /// Refills the empty read buffer: a header's worth while large frames
    /// arrive, else as much as the stream has, up to [`READ_BUF`].
    fn refill(&mut self) -> Result<usize, StreamError> {
        let want = if self.large_frames {
            FRAME_HEADER_LEN
        } else {
            READ_BUF
        };
        let n = retry_read(&mut self.inner, &mut self.rbuf[..want])?;
        self.rpos = 0;
        self.rend = n;
        Ok(n)
    }
}

fn retry_read<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<usize, StreamError> {
    loop {
        match r.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(StreamError::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A duplex stream over two buffers: reads from `input`, writes to `output`.
    struct Duplex {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }
    impl Read for Duplex {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(buf)
        }
    }
    impl Write for Duplex {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.output.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn reader(bytes: Vec<u8>) -> FrameStream<Duplex> {
        FrameStream::new(Duplex {
            input: Cursor::new(bytes),
            output: Vec::new(),
        })
    }

    fn written(frames: &[(FrameKind, Vec<u8>)]) -> Vec<u8> {
        let mut w = reader(Vec::new());
        w.write_preamble().unwrap();
        for (k, p) in frames {
            w.write_frame(*k, &[p]).unwrap();
        }
        w.flush().unwrap();
        assert_eq!(w.bytes_written() as usize, w.inner.output.len());
        w.into_inner().output
    }

    #[test]
    fn frames_round_trip_small_and_large() {
        let big: Vec<u8> = (0..3_000_000u32).map(|i| i as u8).collect();
        let frames = vec![
            (FrameKind::Header, b"{}".to_vec()),
            (FrameKind::Pages, big),
            (FrameKind::Switchover, vec![]),
        ];
        let mut r = reader(written(&frames));
        r.read_preamble().unwrap();
        for (k, p) in &frames {
            let (kind, _) = r.read_frame().unwrap();
            assert_eq!(kind, *k);
            assert_eq!(r.payload(), &p[..]);
        }
        assert!(matches!(
            r.read_frame(),
            Err(StreamError::Truncated {
                what: "a frame header",
                ..
            })
        ));
    }

    #[test]
    fn wrong_magic_and_version() {
        let mut r = reader(b"GET / HTTP/1.1\r\n\r\n".to_vec());
        let err = r.read_preamble().unwrap_err();
        assert!(err.to_string().starts_with("not a ferry migration stream"));

        let mut bytes = written(&[]);
        assert_eq!(reader(bytes.clone()).read_preamble().unwrap(), VERSION);
        // A v1 peer: version 1, reserved 0.
        bytes[8..16].copy_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        let err = reader(bytes.clone()).read_preamble().unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "the peer speaks stream version 1, this ferry speaks {MIN_VERSION} to {VERSION}"
            )
        );
        // A v2 peer (no Commit) is refused too.
        bytes[8..16].copy_from_slice(&[2, 0, 0, 0, 2, 0, 0, 0]);
        assert!(reader(bytes.clone()).read_preamble().is_err());
        // A newer peer that still speaks ours: ours is picked.
        bytes[8..16].copy_from_slice(&[9, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(reader(bytes.clone()).read_preamble().unwrap(), VERSION);
        // The previous version's peer: its version is picked, and kept.
        bytes[8..16].copy_from_slice(&MIN_VERSION.to_le_bytes().repeat(2));
        let mut r = reader(bytes.clone());
        assert_eq!(r.read_preamble().unwrap(), MIN_VERSION);
        assert_eq!(r.version(), MIN_VERSION);
        bytes[8..16].copy_from_slice(&[9, 0, 0, 0, 7, 0, 0, 0]);
        let err = reader(bytes).read_preamble().unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("the peer speaks stream version 7 to 9, this ferry speaks {MIN_VERSION} to {VERSION}")
        );
    }

    #[test]
    fn truncation_anywhere_is_reported_not_panicked() {
        let bytes = written(&[(FrameKind::Pages, vec![5u8; 100_000])]);
        for cut in [0, 3, 8, 15, 16, 20, 28, 5000, bytes.len() - 1] {
            let mut r = reader(bytes[..cut].to_vec());
            let err = r.read_preamble().and_then(|_| r.read_frame().map(|_| ()));
            assert!(
                matches!(err, Err(StreamError::Truncated { .. })),
                "cut {cut}: {err:?}"
            );
        }
    }

    /// Reads at most 100,000 bytes per call, as a socket may, and counts
    /// the calls.
    struct Short {
        input: Cursor<Vec<u8>>,
        calls: usize,
    }
    impl Read for Short {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.calls += 1;
            let n = buf.len().min(100_000);
            self.input.read(&mut buf[..n])
        }
    }
    impl Write for Short {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn large_frames_over_short_reads_take_few_calls_and_taken_frames_stay_whole() {
        let page = |i: usize| (0..1 << 20).map(|b| (b * 7 + i) as u8).collect::<Vec<u8>>();
        let frames = [
            (FrameKind::Pages, page(1)),
            (FrameKind::Pages, page(2)),
            (FrameKind::Header, b"{}".to_vec()),
            (FrameKind::Pages, page(3)),
        ];
        let mut r = FrameStream::new(Short {
            input: Cursor::new(written(&frames)),
            calls: 0,
        });
        r.read_preamble().unwrap();
        let mut taken = Vec::new();
        for (kind, payload) in &frames {
            let (got, _) = r.read_frame_or_end().unwrap().expect("a frame");
            assert_eq!(got, *kind);
            taken.push(r.take_frame(ReadFrame::default()));
            assert_eq!(r.payload(), &[] as &[u8], "taken out of the stream");
            assert_eq!(taken.last().unwrap().payload(), &payload[..]);
        }
        assert!(r.read_frame_or_end().unwrap().is_none());
        for (frame, (_, payload)) in taken.iter().zip(&frames) {
            assert_eq!(frame.payload(), &payload[..], "a taken frame is its own");
        }
        // 11 calls per MiB at most 100,000 bytes each, a few for headers
        // and the small frame: never a call per few bytes.
        assert!(r.get_ref().calls < 60, "{} calls", r.get_ref().calls);
    }

    #[test]
    fn bit_flip_is_a_checksum_error_with_offset() {
        let mut bytes = written(&[
            (FrameKind::Header, b"{}".to_vec()),
            (FrameKind::Pages, vec![1u8; 10_000]),
        ]);
        let flip = bytes.len() - 10;
        bytes[flip] ^= 0x10;
        let mut r = reader(bytes);
        r.read_preamble().unwrap();
        r.read_frame().unwrap();
        let err = r.read_frame().unwrap_err().to_string();
        assert!(
            err.contains("checksum mismatch in Pages frame at stream offset 30"),
            "{err}"
        );
    }
}
