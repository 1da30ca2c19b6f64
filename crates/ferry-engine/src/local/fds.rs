//! File descriptors over a UNIX socket (`SCM_RIGHTS`): the guest memory's
//! files go to the destination process with the first message.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The most fds one message carries.
pub const MAX_FDS: usize = 64;

/// Sends `bytes` (all of them) with `fds` attached to the first byte.
pub fn send(stream: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} fds, over the {MAX_FDS} a message carries", fds.len()),
        ));
    }
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer is CMSG_SPACE bytes for `fds`, so the
        // first header and its data fit in it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
        }
    }
    // SAFETY: `msg` points at `iov` and `control`, both alive for the call.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    // The fds went with the first byte; the rest goes as plain data.
    io::Write::write_all(&mut &*stream, &bytes[sent as usize..])
}

/// Reads exactly `buf.len()` bytes, taking the fds that came with them.
pub fn recv(stream: &UnixStream, buf: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
    let space = {
        // SAFETY: CMSG_SPACE only computes a size.
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) as usize }
    };
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `iov` (over `buf`) and `control`, both alive.
    let got = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `control` up to msg_controllen; the CMSG
    // macros walk only within it.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let n = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..n {
                    // The kernel installed these fds for this process.
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("more fds than the {MAX_FDS} a message carries"),
        ));
    }
    if got == 0 && !buf.is_empty() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    io::Read::read_exact(&mut &*stream, &mut buf[got as usize..])?;
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn a_file_crosses_the_socket_and_is_the_same_file() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut file = tempfile();
        file.write_all(b"shared").unwrap();
        send(&a, b"hello, with a file", &[file.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 18];
        let fds = recv(&b, &mut buf).unwrap();
        assert_eq!(&buf, b"hello, with a file");
        assert_eq!(fds.len(), 1);
        let mut got = std::fs::File::from(fds.into_iter().next().unwrap());
        got.rewind().unwrap();
        let mut s = String::new();
        got.read_to_string(&mut s).unwrap();
        assert_eq!(s, "shared");
    }

    #[test]
    fn plain_bytes_bring_no_fds_and_a_closed_peer_is_an_eof() {
        let (a, b) = UnixStream::pair().unwrap();
        send(&a, b"abc", &[]).unwrap();
        let mut buf = [0u8; 3];
        assert!(recv(&b, &mut buf).unwrap().is_empty());
        drop(a);
        let err = recv(&b, &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    fn tempfile() -> std::fs::File {
        // SAFETY: a NUL-terminated name and valid flags; checked below.
        let fd = unsafe { libc::memfd_create(c"ferry-fds-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` was just created and is owned by nothing else.
        unsafe { std::fs::File::from_raw_fd(fd) }
    }
}
