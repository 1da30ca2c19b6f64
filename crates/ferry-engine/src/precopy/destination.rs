//! The receiving side: check the header, build the VM, load pages while
//! keeping per-page hashes, resume, verify, run, report.

use super::{guest_totals, recv, send, unexpected, ReceiveOptions};
use crate::digest::{page_hash, zero_page_hash, PageHashes};
use crate::error::MigrationError;
use crate::stream::pages::Segment;
use crate::stream::{
    decode_batch, FrameKind, FrameStream, GuestReport, Message, StreamError, StreamHeader,
};
use crate::summary::{ms, ReceiveSummary, Status};
use ferry_backend::memstress::read_progress;
use ferry_backend::{BackendError, DirtyPages, Gfn, GuestRam, Vm, VmConfig, PAGE_SIZE};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Builds the destination VM from the configuration in the stream header.
pub type CreateVm<'a> = dyn FnMut(&VmConfig) -> Result<Box<dyn Vm>, BackendError> + 'a;

static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];
/// Longest the destination waits for every vCPU to complete a pass before
/// it reports anyway.
const MAX_RUN_AFTER: Duration = Duration::from_secs(120);
/// How often the destination checks the guest's health while it runs.
const HEALTH_POLL: Duration = Duration::from_millis(100);

/// Receives a migration from `stream`: reads the header, checks it against
/// `opts.expect`, builds the VM with `create_vm`, loads memory, resumes the
/// guest, verifies the digest, runs the guest for `opts.run_after`, reports
/// to the source, and returns the running VM.
///
/// Runs on the caller's thread. Errors found here are also sent to the
/// source as an Error frame. On `Err` no guest of this side is running.
pub fn receive<S: Read + Write + Send>(
    stream: S,
    create_vm: &mut CreateVm<'_>,
    opts: &ReceiveOptions,
) -> Result<(Box<dyn Vm>, ReceiveSummary), MigrationError> {
    let start = Instant::now();
    let mut io = FrameStream::new(stream);
    let prepared = handshake(&mut io, opts).and_then(|header| {
        let vm = create_vm(&header.config)
            .map_err(MigrationError::backend("create the destination VM"))?;
        header.check_destination(&*vm)?;
        if vm.is_running() {
            return Err(MigrationError::Backend {
                what: "take memory into a VM whose vCPUs already run",
                source: BackendError::NotPaused("receive a migration"),
            });
        }
        Ok((header, vm))
    });
    let (header, vm) = match prepared {
        Ok(p) => p,
        Err(e) => {
            notify(&mut io, &e);
            return Err(e);
        }
    };
    let ram = Arc::clone(vm.ram());
    let pages = header.pages();
    // Fresh RAM is zero, except what the backend wrote while building the VM.
    let mut known_zero = Bits::ones(pages);
    let mut written = DirtyPages::new(pages);
    ram.take_vmm_dirty(&mut written);
    written.iter().for_each(|g| known_zero.clear(g.0));
    let mut dest = Dest {
        summary: ReceiveSummary {
            status: Status::Failed,
            backend: header.config.backend.to_string(),
            total_ms: 0.0,
            resume_ms: 0.0,
            bytes_received: 0,
            pages_received: 0,
            zero_pages: 0,
            batches: 0,
            digest: 0,
            digest_match: false,
            passes_after: 0,
            mismatches_before: 0,
            mismatches_after: 0,
        },
        vm,
        ram,
        io,
        header,
        hashes: PageHashes::zeroed(pages),
        known_zero,
        received: Bits::zeros(pages),
        received_count: 0,
        vcpu_state: None,
    };
    let result = dest.run(opts);
    dest.summary.total_ms = ms(start.elapsed());
    dest.summary.bytes_received = dest.io.bytes_read();
    match result {
        Ok(()) => Ok((dest.vm, dest.summary)),
        Err(e) => {
            if dest.vm.is_running() {
                if let Err(pe) = dest.vm.pause() {
                    tracing::error!("cannot pause the unverified destination guest: {pe}");
                }
            }
            notify(&mut dest.io, &e);
            Err(e)
        }
    }
}

/// Tells the source why we give up, unless it told us.
fn notify<S: Read + Write>(io: &mut FrameStream<S>, e: &MigrationError) {
    if !matches!(e, MigrationError::Peer { .. }) {
        let _ = send(io, &Message::Error(e.chain()));
    }
}

fn handshake<S: Read + Write>(
    io: &mut FrameStream<S>,
    opts: &ReceiveOptions,
) -> Result<StreamHeader, MigrationError> {
    io.read_preamble()?;
    let (kind, offset) = io.read_frame()?;
    if kind != FrameKind::Header {
        if kind == FrameKind::Error {
            if let Ok(Message::Error(message)) = Message::decode(kind, io.payload(), offset) {
                return Err(MigrationError::Peer {
                    peer: "source",
                    message,
                });
            }
        }
        return Err(MigrationError::Protocol {
            expected: "Header",
            got: kind,
            offset,
        });
    }
    let header = StreamHeader::decode(io.payload())?;
    if let Some(expect) = &opts.expect {
        header.check_expected(expect)?;
    }
    Ok(header)
}

struct Dest<S> {
    summary: ReceiveSummary,
    vm: Box<dyn Vm>,
    ram: Arc<GuestRam>,
    io: FrameStream<S>,
    header: StreamHeader,
    hashes: PageHashes,
    known_zero: Bits,
    received: Bits,
    received_count: u64,
    vcpu_state: Option<Vec<u8>>,
}

impl<S: Read + Write> Dest<S> {
    fn run(&mut self, opts: &ReceiveOptions) -> Result<(), MigrationError> {
        send(
            &mut self.io,
            &Message::Accept {
                verify_before_resume: opts.verify_before_resume,
            },
        )?;
        let (strict, switch_offset) = self.load()?;
        let switched = Instant::now();
        let total = self.header.pages();
        if self.received_count != total {
            return Err(MigrationError::Incomplete {
                missing: total - self.received_count,
                total,
            });
        }
        let state = self.vcpu_state.take().ok_or(MigrationError::Protocol {
            expected: "VcpuState before Switchover",
            got: FrameKind::Switchover,
            offset: switch_offset,
        })?;
        self.vm
            .restore_vcpus(&state)
            .map_err(MigrationError::backend("restore vCPU state"))?;
        let vcpus = self.header.vcpus;
        let (passes_before, mismatches_before) =
            guest_totals(&self.ram, vcpus).map_err(MigrationError::ram("read guest progress"))?;
        let ours = self.hashes.digest();
        self.summary.digest = ours.value;

        if !strict {
            self.resume(switched)?;
        }
        let theirs = match recv(&mut self.io, "source", "Digest")? {
            (Message::Digest(d), _) => d,
            (m, offset) => return Err(unexpected("Digest", &m, offset)),
        };
        if theirs != ours {
            if self.vm.is_running() {
                self.vm
                    .pause()
                    .map_err(MigrationError::backend("pause the unverified guest"))?;
            }
            let _ = send(
                &mut self.io,
                &Message::Verified {
                    matched: false,
                    dest: ours,
                },
            );
            return Err(MigrationError::DigestMismatch {
                source_digest: theirs.value,
                dest_digest: ours.value,
            });
        }
        if strict {
            self.resume(switched)?;
        }
        send(
            &mut self.io,
            &Message::Verified {
                matched: true,
                dest: ours,
            },
        )?;
        // Committed: from here on the guest stays up whatever happens.
        self.summary.digest_match = true;
        self.summary.status = Status::Completed;
        self.ram.take_vmm_dirty(&mut DirtyPages::new(total));
        let report = self.run_guest(opts.run_after, passes_before, mismatches_before);
        self.summary.passes_after = report.passes_after;
        self.summary.mismatches_before = report.mismatches_before;
        self.summary.mismatches_after = report.mismatches_after;
        if let Err(e) = send(&mut self.io, &Message::Report(report)) {
            tracing::warn!("cannot send the guest report to the source: {e}");
        }
        Ok(())
    }

    /// Reads Pages and VcpuState frames up to Switchover. Returns the
    /// Switchover's verify-before-resume flag and offset.
    fn load(&mut self) -> Result<(bool, u64), MigrationError> {
        loop {
            let (kind, offset) = self.io.read_frame()?;
            match kind {
                FrameKind::Pages => self.apply_pages(offset)?,
                FrameKind::VcpuState => self.vcpu_state = Some(self.io.payload().to_vec()),
                FrameKind::Switchover | FrameKind::Error => {
                    match Message::decode(kind, self.io.payload(), offset)? {
                        Message::Switchover {
                            verify_before_resume,
                        } => return Ok((verify_before_resume, offset)),
                        Message::Error(message) => {
                            return Err(MigrationError::Peer {
                                peer: "source",
                                message,
                            })
                        }
                        m => return Err(unexpected("Pages", &m, offset)),
                    }
                }
                got => {
                    return Err(MigrationError::Protocol {
                        expected: "Pages, VcpuState or Switchover",
                        got,
                        offset,
                    })
                }
            }
        }
    }

    fn apply_pages(&mut self, offset: u64) -> Result<(), MigrationError> {
        let Dest {
            io,
            ram,
            hashes,
            known_zero,
            received,
            received_count,
            summary,
            header,
            ..
        } = self;
        let batch = decode_batch(io.payload(), header.pages()).map_err(|reason| {
            StreamError::Malformed {
                kind: FrameKind::Pages,
                offset,
                reason,
            }
        })?;
        let mut note = |g: u64| {
            if !received.get(g) {
                received.set(g);
                *received_count += 1;
            }
        };
        batch.visit(|segment| -> Result<(), MigrationError> {
            match segment {
                Segment::Zero(gfn) => {
                    if !known_zero.get(gfn.0) {
                        ram.write_pages(gfn, &ZERO_PAGE)
                            .map_err(MigrationError::ram("write guest memory"))?;
                        known_zero.set(gfn.0);
                    }
                    hashes.set(gfn, zero_page_hash());
                    note(gfn.0);
                }
                Segment::Data { first, bytes } => {
                    ram.write_pages(first, bytes)
                        .map_err(MigrationError::ram("write guest memory"))?;
                    for (i, page) in bytes.chunks_exact(PAGE_SIZE).enumerate() {
                        let g = first.0 + i as u64;
                        hashes.set(Gfn(g), page_hash(page));
                        known_zero.clear(g);
                        note(g);
                    }
                }
            }
            Ok(())
        })?;
        summary.batches += 1;
        summary.pages_received += batch.pages() as u64;
        summary.zero_pages += batch.zero_pages() as u64;
        Ok(())
    }

    fn resume(&mut self, switched: Instant) -> Result<(), MigrationError> {
        self.vm.start().map_err(MigrationError::backend(
            "start the guest on the destination",
        ))?;
        let took = switched.elapsed();
        self.summary.resume_ms = ms(took);
        send(
            &mut self.io,
            &Message::Resumed {
                resume_ns: took.as_nanos().min(u128::from(u64::MAX)) as u64,
            },
        )?;
        Ok(())
    }

    /// Runs the committed guest for `run_after`, and on until every vCPU has
    /// completed a pass here (at most [`MAX_RUN_AFTER`]), so the report says
    /// the guest really works on this side. Watches its health, then reads
    /// what the guest reports.
    fn run_guest(&mut self, run_after: Duration, passes0: u64, mismatches0: u64) -> GuestReport {
        let started = Instant::now();
        let at_switchover = read_progress(&self.ram, self.header.vcpus).unwrap_or_default();
        let mut health = None;
        loop {
            if let Err(e) = self.vm.check_health() {
                health = Some(e.to_string());
                break;
            }
            let elapsed = started.elapsed();
            if elapsed >= MAX_RUN_AFTER {
                break;
            }
            if elapsed >= run_after {
                let now = read_progress(&self.ram, self.header.vcpus).unwrap_or_default();
                let each_passed = now.len() == at_switchover.len()
                    && now
                        .iter()
                        .zip(&at_switchover)
                        .all(|(n, s)| n.passes > s.passes);
                if each_passed {
                    break;
                }
            }
            std::thread::sleep(
                HEALTH_POLL.min(
                    run_after
                        .saturating_sub(elapsed)
                        .max(Duration::from_millis(5)),
                ),
            );
        }
        let (passes, mismatches) = match guest_totals(&self.ram, self.header.vcpus) {
            Ok(t) => t,
            Err(e) => {
                health.get_or_insert_with(|| format!("cannot read guest progress: {e}"));
                (passes0, mismatches0)
            }
        };
        GuestReport {
            passes_after: passes.wrapping_sub(passes0),
            mismatches_before: mismatches0,
            mismatches_after: mismatches.wrapping_sub(mismatches0),
            run_ms: started.elapsed().as_millis() as u64,
            health,
        }
    }
}

/// A plain bitmap over guest frames (unlike `DirtyPages`, bits can be cleared).
struct Bits {
    words: Vec<u64>,
}

impl Bits {
    fn zeros(pages: u64) -> Self {
        Bits {
            words: vec![0; pages.div_ceil(64) as usize],
        }
    }
    fn ones(pages: u64) -> Self {
        Bits {
            words: vec![u64::MAX; pages.div_ceil(64) as usize],
        }
    }
    fn get(&self, i: u64) -> bool {
        self.words
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
    fn set(&mut self, i: u64) {
        if let Some(w) = self.words.get_mut((i / 64) as usize) {
            *w |= 1 << (i % 64);
        }
    }
    fn clear(&mut self, i: u64) {
        if let Some(w) = self.words.get_mut((i / 64) as usize) {
            *w &= !(1 << (i % 64));
        }
    }
}
