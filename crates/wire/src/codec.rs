//! Bounded big-endian reader and writer.

use bytes::Bytes;

/// Why a byte string is not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("truncated: {what} needs {need} more bytes")]
    Truncated { what: &'static str, need: usize },
    #[error("{what} is {len}, over the limit of {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("unsupported version {0}")]
    BadVersion(u8),
    #[error("unknown {what} tag {tag}")]
    BadTag { what: &'static str, tag: u8 },
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    #[error("{what} is not valid UTF-8")]
    BadUtf8 { what: &'static str },
    #[error("{what} is empty")]
    Empty { what: &'static str },
    #[error("{what} has non-zero padding bits")]
    Padding { what: &'static str },
    #[error("{what} names one member twice")]
    Duplicate { what: &'static str },
}

/// Reads fields from a byte slice; every method checks its bounds.
#[derive(Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// The buffer `buf` is, when the input is shared: payloads are then views of it, not copies.
    shared: Option<&'a Bytes>,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader {
            buf,
            pos: 0,
            shared: None,
        }
    }
    /// A reader whose [`Reader::payload`]s share `buf` instead of copying out of it. A payload
    /// keeps all of `buf` alive: the caller bounds how much larger than its messages `buf` is.
    pub fn shared(buf: &'a Bytes) -> Self {
        Reader {
            buf,
            pos: 0,
            shared: Some(buf),
        }
    }
    /// A reader of `buf`, a part of `all`, whose [`Reader::payload`]s are views of `all`: a
    /// payload keeps all of `all` alive. A `buf` outside `all` is read as by [`Reader::new`].
    pub fn shared_within(all: &'a Bytes, buf: &'a [u8]) -> Self {
        let range = all.as_ptr_range();
        let inside = range.start <= buf.as_ptr() && buf.as_ptr_range().end <= range.end;
        Reader {
            buf,
            pos: 0,
            shared: inside.then_some(all),
        }
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub fn position(&self) -> usize {
        self.pos
    }
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated {
                what,
                need: n - self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }
    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    /// A count (u32 on the wire) checked against `max`.
    pub fn count(&mut self, what: &'static str, max: usize) -> Result<usize, DecodeError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(DecodeError::TooLong { what, len: n, max });
        }
        Ok(n)
    }
    /// Bytes with a u32 length prefix, at most `max`.
    pub fn bytes(&mut self, what: &'static str, max: usize) -> Result<&'a [u8], DecodeError> {
        let n = self.count(what, max)?;
        self.take(n, what)
    }
    /// [`Reader::bytes`] as a buffer of their own: a view of the input if it is shared, a
    /// copy otherwise.
    pub fn payload(&mut self, what: &'static str, max: usize) -> Result<Bytes, DecodeError> {
        let b = self.bytes(what, max)?;
        Ok(match self.shared {
            Some(all) => all.slice_ref(b),
            None => Bytes::copy_from_slice(b),
        })
    }
    /// A non-empty UTF-8 string with a u8 length prefix, at most `max` bytes.
    pub fn name(&mut self, what: &'static str, max: usize) -> Result<String, DecodeError> {
        self.name_ref(what, max).map(str::to_owned)
    }
    /// [`Reader::name`], borrowed from the input.
    pub fn name_ref(&mut self, what: &'static str, max: usize) -> Result<&'a str, DecodeError> {
        let n = self.u8(what)? as usize;
        if n > max {
            return Err(DecodeError::TooLong { what, len: n, max });
        }
        if n == 0 {
            return Err(DecodeError::Empty { what });
        }
        let b = self.take(n, what)?;
        core::str::from_utf8(b).map_err(|_| DecodeError::BadUtf8 { what })
    }
    pub fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

/// Appends fields to a buffer. Lengths are asserted against the same limits the reader enforces:
/// we never emit what we would refuse to read.
#[derive(Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Writer { buf: Vec::new() }
    }
    /// Appends to bytes already written.
    pub fn from_vec(buf: Vec<u8>) -> Self {
        Writer { buf }
    }
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    pub fn count(&mut self, n: usize, max: usize) {
        assert!(n <= max, "encoding a count of {n} over the limit {max}");
        self.u32(n as u32);
    }
    pub fn bytes(&mut self, b: &[u8], max: usize) {
        self.count(b.len(), max);
        self.buf.extend_from_slice(b);
    }
    pub fn name(&mut self, s: &str, max: usize) {
        assert!(
            !s.is_empty() && s.len() <= max && max <= 255,
            "name length {} out of range",
            s.len()
        );
        self.u8(s.len() as u8);
        self.buf.extend_from_slice(s.as_bytes());
    }
    pub fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }
}
