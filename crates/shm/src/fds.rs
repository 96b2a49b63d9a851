//! Descriptors passed over a Unix socket (`SCM_RIGHTS`), and one-byte signals.

use std::io::{Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Most descriptors a greeting may carry; any beyond the ones expected are closed.
const MAX_FDS: usize = 4;

/// Sends `bytes` with `fds` attached, in one `sendmsg` (non-blocking: `WouldBlock` if the
/// socket is full).
pub fn send_with_fds(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> Result<usize> {
    assert!(fds.len() <= MAX_FDS);
    let mut space = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: the control buffer (128 bytes, 8-aligned) has room for one header of at most
    // MAX_FDS descriptors; every pointer given to `sendmsg` outlives the call.
    unsafe {
        let cmsg_len = libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as usize;
        debug_assert!(cmsg_len <= std::mem::size_of_val(&space));
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = cmsg_len as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
        std::ptr::copy_nonoverlapping(
            fds.as_ptr().cast::<u8>(),
            libc::CMSG_DATA(c),
            std::mem::size_of_val(fds),
        );
        let n = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(Error::last_os_error());
        }
        Ok(n as usize)
    }
}

/// Receives into `buf` and takes the descriptors attached (non-blocking: `WouldBlock` if
/// nothing waits). Descriptors beyond [`MAX_FDS`] are lost to a truncated control message,
/// which is an error.
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>)> {
    let mut space = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: the buffers outlive the call; the control messages are walked with the libc
    // macros within the length the kernel reports, and each descriptor is owned once.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) as _;
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(Error::last_os_error());
        }
        let mut fds = Vec::new();
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let bytes = ((*c).cmsg_len as usize).saturating_sub(data as usize - c as usize);
                for k in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(k));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(Error::new(
                ErrorKind::InvalidData,
                "more descriptors than a greeting carries",
            ));
        }
        Ok((n as usize, fds))
    }
}

/// A new pair of connected Unix stream sockets, both non-blocking. The ends are open file
/// descriptions of their own, so the process given one end cannot make the other block, and a
/// signal sent on a closed pair raises no SIGPIPE.
pub fn socketpair() -> Result<(OwnedFd, OwnedFd)> {
    let mut ends = [0 as RawFd; 2];
    // SAFETY: `socketpair` writes two descriptors into `ends`; the result is checked and each
    // end owned once.
    unsafe {
        let kind = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
        if libc::socketpair(libc::AF_UNIX, kind, 0, ends.as_mut_ptr()) != 0 {
            return Err(Error::last_os_error());
        }
        Ok((OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])))
    }
}

/// Sends one byte on a socket, without blocking and without SIGPIPE: `Ok(false)` if there was
/// no room (the reader has bytes it has not taken, and will wake for them all the same).
pub fn poke(fd: BorrowedFd<'_>) -> Result<bool> {
    let b = [1u8];
    // SAFETY: one byte from a live buffer.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            b.as_ptr().cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        let e = Error::last_os_error();
        return match e.kind() {
            ErrorKind::WouldBlock => Ok(false),
            _ => Err(e),
        };
    }
    Ok(true)
}

/// Takes the bytes waiting on a non-blocking socket (`WouldBlock` if there are none; an error
/// if the other end is closed).
pub fn drain(fd: BorrowedFd<'_>) -> Result<usize> {
    let mut buf = [0u8; 256];
    // SAFETY: into a live buffer of its length.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    match n {
        0 => Err(Error::new(
            ErrorKind::BrokenPipe,
            "the signalling end is closed",
        )),
        n if n < 0 => Err(Error::last_os_error()),
        n => Ok(n as usize),
    }
}
