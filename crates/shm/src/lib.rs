//! Sessions whose replies travel through shared memory: for clients on the daemon's machine.
//!
//! A client connects to the daemon's `shm` Unix socket. The daemon greets it with two
//! descriptors: a read-only view of a ring of bytes in shared memory ([`ring`]), and one end of
//! a signalling socket; the client answers with a control page of its own (where it writes how
//! far it has read), sealed so that no one can free it. From then on the client's requests go
//! over the socket as on any other, and everything the daemon sends it (the same frames it
//! would write to a socket) goes through the ring: the daemon copies its framed replies in, the
//! client copies them out, and neither asks the kernel to copy them or to run its TCP stack.
//!
//! Waking: a client that finds the ring empty sleeps on the session's socket, and the daemon
//! sends it a byte when it adds replies after the client went to sleep; a daemon that finds the
//! ring full sleeps on the signalling socket, which the client sends a byte on when it frees
//! room after the daemon went to sleep. Under load neither sleeps, and the replies cost no
//! system call at all.
//!
//! The client is not trusted. The daemon maps the client's control page read-only, once it has
//! checked its seals, size and allocation, and checks the position it reads there; it never reads
//! the data back. The client's descriptor of the data is read-only and the object's mode keeps a
//! client of another user from opening it again to write, so it can neither write, resize nor
//! free the pages the daemon writes; the signalling socket's end is the daemon's own (the client
//! cannot make it block), and a closed one ends the session. The daemon frees the ring's pages
//! when the session ends, even if the client keeps its descriptor. A client of the daemon's own
//! user could reopen the data to write (as it could stop or trace the daemon itself). The daemon
//! is trusted by its client as on any other connection, but what the client reads is checked
//! all the same (an impossible position is an error, not a panic).
//!
//! Linux only (memory objects and their seals, `/proc/self/fd`); elsewhere the crate is empty.

#[cfg(target_os = "linux")]
mod fds;
#[cfg(target_os = "linux")]
mod io;
#[cfg(target_os = "linux")]
pub mod ring;

#[cfg(target_os = "linux")]
pub use io::{accept, connect, RingReader, RingWriter, DEFAULT_RING_BYTES, GREETING_TIMEOUT};
