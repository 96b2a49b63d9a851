//! Sessions whose replies travel through shared memory: for clients on the daemon's machine.
//!
//! A client connects to the daemon's `shm` Unix socket. The daemon answers with a greeting that
//! carries three descriptors: a ring of bytes in shared memory ([`ring`]: its data, read-only,
//! and a control page the client writes its position in), and the write end of a pipe. From
//! then on the client's requests go over the socket as on any other, and everything the daemon
//! sends it (the same frames it would write to a socket) goes through the ring: the daemon
//! copies its framed replies in, the client copies them out, and neither asks the kernel to copy
//! them or to run its TCP stack.
//!
//! Waking: a client that finds the ring empty sleeps on the socket, and the daemon writes a byte
//! to it when it adds replies after the client went to sleep; a daemon that finds the ring full
//! sleeps on the pipe, which the client writes a byte to when it frees room after the daemon
//! went to sleep. Under load neither sleeps, and the replies cost no system call at all.
//!
//! The client is not trusted: the daemon reads only the client's two words from the control
//! page, which it maps read-only, checks the position it reads there, and never reads the data
//! back. The client's descriptor of the data is read-only (it cannot write, resize, or free the
//! pages the daemon writes), both objects are sealed against resizing, the pipe's read end is
//! the daemon's own (the client cannot make it block), and the daemon frees the ring's pages
//! when the session ends, even if the client keeps the descriptors. The daemon is trusted by its
//! client as on any other connection, but what the client reads is checked all the same (an
//! impossible position is an error, not a panic).
//!
//! Linux only (memory objects, `/proc/self/fd`); elsewhere the crate is empty.

#[cfg(target_os = "linux")]
mod fds;
#[cfg(target_os = "linux")]
mod io;
#[cfg(target_os = "linux")]
pub mod ring;

#[cfg(target_os = "linux")]
pub use io::{accept, connect, RingReader, RingWriter, DEFAULT_RING_BYTES, GREETING_TIMEOUT};
