//! Payloads of the small main-channel frames. Fixed little-endian layouts for the
//! ones on the switchover path (no parser between pause and resume), JSON for
//! the report, which is read once at the very end and will grow fields.

use super::bytes::{u32_at, u64_at};
use super::{FrameKind, StreamError};
pub use crate::digest::MemoryDigest;
use serde::{Deserialize, Serialize};

/// Flag bit: the destination verifies the digest before it resumes the guest.
const FLAG_VERIFY_BEFORE_RESUME: u32 = 1;
/// Switchover flag bit: postcopy; the pages of the Missing frames follow
/// after the guest resumes.
const FLAG_POSTCOPY: u32 = 2;
/// Switchover flag bit: the source's guest was paused before the
/// switchover, and the destination keeps it paused.
const FLAG_PAUSED: u32 = 4;
/// Hello flag bit: the migration opens a priority connection (postcopy).
const HELLO_PRIORITY: u8 = 1;
/// Hello flag bit: the connection rejoins a postcopy cut off mid-way.
const HELLO_RECOVER: u8 = 2;
/// Most runs one Missing frame carries (16 bytes each: 16 MiB).
pub const MAX_MISSING_RUNS: usize = 1 << 20;
/// Most pages one page request asks for (one batch).
pub const MAX_REQUEST_PAGES: u32 = super::MAX_BATCH_PAGES as u32;

/// What the destination reports once the migration committed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FinalReport {
    /// A vCPU failure seen at the commit, if any.
    pub health: Option<String>,
    /// What postcopy did, if the migration switched to it.
    #[serde(default)]
    pub postcopy: Option<crate::summary::PostcopyReport>,
}

/// A main-channel message.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// Header accepted, destination VM created.
    Accept {
        /// The destination insists on verify-before-resume.
        verify_before_resume: bool,
        /// Wire 6 on: which of the capabilities the header asked for the
        /// destination takes (JSON after the flags). `None` on wire 5.
        answer: Option<super::capabilities::Answer>,
    },
    /// Source paused; all pages and the vCPU state are sent.
    Switchover {
        /// The destination must verify before resuming.
        verify_before_resume: bool,
        /// The last round of pages: the destination waits until every data
        /// connection has ended it. In postcopy, the round that pushes the
        /// missing pages after the guest resumes.
        final_round: u32,
        /// Postcopy: the destination resumes at once and fetches the pages
        /// of the Missing frames on demand.
        postcopy: bool,
        /// The guest was paused on the source before the switchover: the
        /// destination takes it over paused (a flag bit a wire-5 peer
        /// ignores, resuming it as before).
        paused: bool,
    },
    /// Runs (first frame, pages) the destination does not hold current.
    Missing(Vec<(u64, u64)>),
    /// Precopy: the source took the destination's Verified(match) and stays
    /// paused; the destination's guest may run on for good.
    Commit,
    /// The Missing frames of a postcopy recovery are complete: the
    /// destination still lacks `missing` pages.
    Recover {
        /// Pages the runs add up to.
        missing: u64,
    },
    /// A vCPU on the destination waits for `count` pages from `first`.
    PageRequest {
        /// First frame.
        first: u64,
        /// Pages, 1..=[`MAX_REQUEST_PAGES`].
        count: u32,
    },
    /// The guest runs on the destination.
    Resumed {
        /// Destination time from Switchover received to guest running.
        resume_ns: u64,
    },
    /// The source's digest of its memory.
    Digest(MemoryDigest),
    /// The destination's verdict.
    Verified {
        /// Whether the digests are equal.
        matched: bool,
        /// The destination's digest.
        dest: MemoryDigest,
    },
    /// The guest report.
    Report(FinalReport),
    /// The sender gives up.
    Error(String),
    /// Opens a connection of a migration.
    Hello(Hello),
    /// The destination takes the connection.
    Welcome {
        /// The stream version both ends speak from here on.
        version: u32,
    },
    /// Liveness and page-data progress.
    Heartbeat {
        /// Page-data bytes this side has sent (source) or received
        /// (destination) so far, over all data connections.
        data_bytes: u64,
    },
    /// A round is complete on one data connection.
    RoundEnd {
        /// The round.
        round: u32,
        /// Pages this connection carried in it.
        pages: u64,
    },
}

/// What a [`Message::Hello`] says: which migration and which of its
/// connections this is. The session id ties a migration's connections
/// together on a destination that listens for more than one.
///
/// Channel [`PRIORITY_CHANNEL`] is kept for postcopy's priority connection:
/// page requests and their answers, which must never queue behind bulk
/// batches on a data connection. Data channels stop far below it
/// (`precopy::MAX_CONNECTIONS`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Random per migration, the same on all its connections.
    pub session: u64,
    /// 0 for the main channel, 1..=`data_channels` for data.
    pub channel: u16,
    /// How many data connections the migration uses.
    pub data_channels: u16,
    /// The migration also opens the priority connection (postcopy).
    pub priority: bool,
    /// The connection belongs to the recovery of a postcopy whose
    /// connections broke (the same session, a new set of connections).
    pub recover: bool,
}

/// The channel number kept for postcopy's priority connection.
pub const PRIORITY_CHANNEL: u16 = u16::MAX;

impl Message {
    /// The frame type carrying this message.
    pub fn kind(&self) -> FrameKind {
        match self {
            Message::Accept { .. } => FrameKind::Accept,
            Message::Switchover { .. } => FrameKind::Switchover,
            Message::Resumed { .. } => FrameKind::Resumed,
            Message::Digest(_) => FrameKind::Digest,
            Message::Verified { .. } => FrameKind::Verified,
            Message::Report(_) => FrameKind::Report,
            Message::Error(_) => FrameKind::Error,
            Message::Hello(_) => FrameKind::Hello,
            Message::Welcome { .. } => FrameKind::Welcome,
            Message::Heartbeat { .. } => FrameKind::Heartbeat,
            Message::RoundEnd { .. } => FrameKind::RoundEnd,
            Message::Missing(_) => FrameKind::Missing,
            Message::PageRequest { .. } => FrameKind::PageRequest,
            Message::Recover { .. } => FrameKind::Recover,
            Message::Commit => FrameKind::Commit,
        }
    }

    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        let flags = |strict: bool| {
            let f = if strict { FLAG_VERIFY_BEFORE_RESUME } else { 0 };
            [f.to_le_bytes(), [0; 4]].concat()
        };
        match self {
            Message::Accept {
                verify_before_resume,
                answer,
            } => {
                let mut v = flags(*verify_before_resume);
                if let Some(a) = answer {
                    v.extend(serde_json::to_vec(a).unwrap_or_default());
                }
                v
            }
            Message::Switchover {
                verify_before_resume,
                final_round,
                postcopy,
                paused,
            } => {
                let mut v = flags(*verify_before_resume);
                if *postcopy {
                    v[0] |= FLAG_POSTCOPY as u8;
                }
                if *paused {
                    v[0] |= FLAG_PAUSED as u8;
                }
                v[4..].copy_from_slice(&final_round.to_le_bytes());
                v
            }
            Message::Missing(runs) => runs
                .iter()
                .flat_map(|(f, n)| [f.to_le_bytes(), n.to_le_bytes()])
                .flatten()
                .collect(),
            Message::PageRequest { first, count } => {
                let mut v = first.to_le_bytes().to_vec();
                v.extend_from_slice(&count.to_le_bytes());
                v.extend_from_slice(&[0; 4]);
                v
            }
            Message::Resumed { resume_ns } => resume_ns.to_le_bytes().to_vec(),
            Message::Recover { missing } => missing.to_le_bytes().to_vec(),
            Message::Commit => Vec::new(),
            Message::Digest(d) => digest_bytes(d).to_vec(),
            Message::Verified { matched, dest } => {
                let mut v = vec![u8::from(*matched), 0, 0, 0, 0, 0, 0, 0];
                v.extend_from_slice(&digest_bytes(dest));
                v
            }
            Message::Report(r) => serde_json::to_vec(r).unwrap_or_default(),
            Message::Error(text) => text.as_bytes().to_vec(),
            Message::Hello(h) => {
                let mut v = h.session.to_le_bytes().to_vec();
                v.extend_from_slice(&h.channel.to_le_bytes());
                v.extend_from_slice(&h.data_channels.to_le_bytes());
                let mut flags = if h.priority { HELLO_PRIORITY } else { 0 };
                if h.recover {
                    flags |= HELLO_RECOVER;
                }
                v.extend_from_slice(&[flags, 0, 0, 0]);
                v
            }
            Message::Welcome { version } => [version.to_le_bytes(), [0; 4]].concat(),
            Message::Heartbeat { data_bytes } => data_bytes.to_le_bytes().to_vec(),
            Message::RoundEnd { round, pages } => {
                let mut v = round.to_le_bytes().to_vec();
                v.extend_from_slice(&[0; 4]);
                v.extend_from_slice(&pages.to_le_bytes());
                v
            }
        }
    }

    /// Decodes the payload of a `kind` frame read at `offset`. Pages,
    /// VcpuState and Header frames are not main-channel messages.
    pub fn decode(kind: FrameKind, payload: &[u8], offset: u64) -> Result<Message, StreamError> {
        let bad = |reason: String| StreamError::Malformed {
            kind,
            offset,
            reason,
        };
        let exact = |n: usize| {
            if payload.len() == n {
                Ok(())
            } else {
                Err(bad(format!(
                    "{} payload bytes, expected {n}",
                    payload.len()
                )))
            }
        };
        Ok(match kind {
            FrameKind::Accept if payload.len() > 8 => Message::Accept {
                verify_before_resume: u32_at(payload, 0) & FLAG_VERIFY_BEFORE_RESUME != 0,
                answer: Some(
                    serde_json::from_slice(&payload[8..])
                        .map_err(|e| bad(format!("capability answer: {e}")))?,
                ),
            },
            FrameKind::Accept | FrameKind::Switchover => {
                exact(8)?;
                let flags = u32_at(payload, 0);
                let strict = flags & FLAG_VERIFY_BEFORE_RESUME != 0;
                if kind == FrameKind::Accept {
                    Message::Accept {
                        verify_before_resume: strict,
                        answer: None,
                    }
                } else {
                    Message::Switchover {
                        verify_before_resume: strict,
                        final_round: u32_at(payload, 4),
                        postcopy: flags & FLAG_POSTCOPY != 0,
                        paused: flags & FLAG_PAUSED != 0,
                    }
                }
            }
            FrameKind::Missing => {
                if !payload.len().is_multiple_of(16) || payload.len() / 16 > MAX_MISSING_RUNS {
                    return Err(bad(format!(
                        "{} payload bytes: not whole 16-byte runs, or more than {MAX_MISSING_RUNS}",
                        payload.len()
                    )));
                }
                let runs: Vec<(u64, u64)> = payload
                    .chunks_exact(16)
                    .map(|r| (u64_at(r, 0), u64_at(r, 8)))
                    .collect();
                if let Some((f, n)) = runs
                    .iter()
                    .find(|(f, n)| *n == 0 || f.checked_add(*n).is_none())
                {
                    return Err(bad(format!("run of {n} pages from frame {f}")));
                }
                Message::Missing(runs)
            }
            FrameKind::PageRequest => {
                exact(16)?;
                let count = u32_at(payload, 8);
                if !(1..=MAX_REQUEST_PAGES).contains(&count) {
                    return Err(bad(format!(
                        "a request for {count} pages (1 to {MAX_REQUEST_PAGES})"
                    )));
                }
                Message::PageRequest {
                    first: u64_at(payload, 0),
                    count,
                }
            }
            FrameKind::Commit => {
                exact(0)?;
                Message::Commit
            }
            FrameKind::Recover => {
                exact(8)?;
                Message::Recover {
                    missing: u64_at(payload, 0),
                }
            }
            FrameKind::Resumed => {
                exact(8)?;
                Message::Resumed {
                    resume_ns: u64_at(payload, 0),
                }
            }
            FrameKind::Digest => {
                exact(16)?;
                Message::Digest(digest_at(payload, 0))
            }
            FrameKind::Verified => {
                exact(24)?;
                Message::Verified {
                    matched: payload[0] != 0,
                    dest: digest_at(payload, 8),
                }
            }
            FrameKind::Report => Message::Report(
                serde_json::from_slice(payload).map_err(|e| bad(format!("bad report: {e}")))?,
            ),
            FrameKind::Error => Message::Error(String::from_utf8_lossy(payload).into_owned()),
            FrameKind::Hello => {
                exact(16)?;
                let h = Hello {
                    session: u64_at(payload, 0),
                    channel: u16::from_le_bytes([payload[8], payload[9]]),
                    data_channels: u16::from_le_bytes([payload[10], payload[11]]),
                    priority: payload[12] & HELLO_PRIORITY != 0,
                    recover: payload[12] & HELLO_RECOVER != 0,
                };
                let data_or_priority =
                    h.channel <= h.data_channels || h.channel == PRIORITY_CHANNEL;
                if h.data_channels == 0 || !data_or_priority {
                    return Err(bad(format!(
                        "channel {} of {} data connections",
                        h.channel, h.data_channels
                    )));
                }
                Message::Hello(h)
            }
            FrameKind::Welcome => {
                exact(8)?;
                Message::Welcome {
                    version: u32_at(payload, 0),
                }
            }
            FrameKind::Heartbeat => {
                exact(8)?;
                Message::Heartbeat {
                    data_bytes: u64_at(payload, 0),
                }
            }
            FrameKind::RoundEnd => {
                exact(16)?;
                Message::RoundEnd {
                    round: u32_at(payload, 0),
                    pages: u64_at(payload, 8),
                }
            }
            FrameKind::Header
            | FrameKind::Pages
            | FrameKind::Delta
            | FrameKind::VcpuState
            | FrameKind::Sections
            | FrameKind::SectionsPart
            | FrameKind::LiveSection => return Err(bad("not a main-channel message here".into())),
        })
    }
}

fn digest_bytes(d: &MemoryDigest) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&d.pages.to_le_bytes());
    b[8..].copy_from_slice(&d.value.to_le_bytes());
    b
}

fn digest_at(p: &[u8], at: usize) -> MemoryDigest {
    MemoryDigest {
        pages: u64_at(p, at),
        value: u64_at(p, at + 8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let d = MemoryDigest {
            pages: 262_144,
            value: 0xdead_beef_0123_4567,
        };
        let all = [
            Message::Accept {
                verify_before_resume: true,
                answer: None,
            },
            Message::Accept {
                verify_before_resume: false,
                answer: Some(super::super::capabilities::Answer::to(
                    &["postcopy".to_string(), "teleport".to_string()],
                    &Default::default(),
                )),
            },
            Message::Switchover {
                verify_before_resume: false,
                final_round: 7,
                postcopy: false,
                paused: true,
            },
            Message::Switchover {
                verify_before_resume: true,
                final_round: 2,
                postcopy: true,
                paused: false,
            },
            Message::Missing(vec![(0, 5), (1 << 40, 1)]),
            Message::Missing(Vec::new()),
            Message::PageRequest {
                first: 77,
                count: 16,
            },
            Message::Hello(Hello {
                session: 0x1234_5678_9abc,
                channel: 3,
                data_channels: 4,
                priority: true,
                recover: true,
            }),
            Message::Recover { missing: 1 << 33 },
            Message::Commit,
            Message::Welcome { version: 2 },
            Message::Heartbeat {
                data_bytes: 1 << 40,
            },
            Message::RoundEnd {
                round: 3,
                pages: 99,
            },
            Message::Resumed { resume_ns: 1234 },
            Message::Digest(d),
            Message::Verified {
                matched: true,
                dest: d,
            },
            Message::Report(FinalReport {
                health: Some("vCPU 1 stopped".into()),
                ..FinalReport::default()
            }),
            Message::Error("cancelled".into()),
        ];
        for m in all {
            let back = Message::decode(m.kind(), &m.encode(), 0).unwrap();
            assert_eq!(back, m);
        }
    }

    #[test]
    fn wrong_lengths_are_malformed() {
        let err = Message::decode(FrameKind::Digest, &[0; 15], 99).unwrap_err();
        assert_eq!(
            err.to_string(),
            "malformed Digest frame at stream offset 99: 15 payload bytes, expected 16"
        );
        assert!(Message::decode(FrameKind::Report, b"{", 0).is_err());
        assert!(Message::decode(FrameKind::Pages, b"", 0).is_err());
        let mut hello = Message::Hello(Hello {
            session: 1,
            channel: 5,
            data_channels: 4,
            priority: false,
            recover: false,
        })
        .encode();
        let err = Message::decode(FrameKind::Hello, &hello, 0).unwrap_err();
        assert!(err.to_string().contains("channel 5 of 4"), "{err}");
        hello[10] = 0;
        assert!(Message::decode(FrameKind::Hello, &hello, 0).is_err());
        let run = |f: u64, n: u64| [f.to_le_bytes(), n.to_le_bytes()].concat();
        assert!(Message::decode(FrameKind::Missing, &run(u64::MAX, 2), 0).is_err());
        assert!(Message::decode(FrameKind::Missing, &run(3, 0), 0).is_err());
        assert!(Message::decode(FrameKind::Missing, &[0; 15], 0).is_err());
        let req = |n: u32| {
            [
                7u64.to_le_bytes().to_vec(),
                n.to_le_bytes().to_vec(),
                vec![0; 4],
            ]
            .concat()
        };
        assert!(Message::decode(FrameKind::PageRequest, &req(0), 0).is_err());
        assert!(Message::decode(FrameKind::PageRequest, &req(MAX_REQUEST_PAGES + 1), 0).is_err());
    }
}
