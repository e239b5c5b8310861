//! The record layer inside Noise transport messages: length prefix,
//! coalescing of small records, splitting of large ones, close and rekey.
//!
//! ```text
//! stream  = *( len:u16be  noise_message[len] )        16 <= len <= 65535
//! plaintext of a noise_message = *chunk                (empty = keepalive)
//! chunk   = type:u8  body_len:u16be  body[body_len]
//!   0x01 RECORD  a whole record
//!   0x02 FIRST   total_len:u32be, then the first part of a split record
//!   0x03 NEXT    the next part of the split record (complete at total_len)
//!   0x04 CLOSE   code:u8 reason:utf8  — last chunk of the session
//!   0x05 REKEY   empty body — last chunk of its message
//! ```

use bytes::{Buf, Bytes, BytesMut};

use crate::error::{TransportError, Violation};
use crate::session::{Opener, Sealer};
use crate::symmetric::{MAX_PLAINTEXT_LEN, TAGLEN};

/// Bytes of the length prefix before every Noise message.
pub const LENGTH_PREFIX_LEN: usize = 2;
/// Bytes of a chunk header (type and body length).
pub const CHUNK_HEADER_LEN: usize = 3;
/// Longest close reason, in bytes of UTF-8.
pub const MAX_CLOSE_REASON_LEN: usize = 255;

const RECORD: u8 = 0x01;
const FIRST: u8 = 0x02;
const NEXT: u8 = 0x03;
const CLOSE: u8 = 0x04;
const REKEY: u8 = 0x05;

/// Bytes of the total length at the start of a FIRST chunk's body.
const TOTAL_LEN: usize = 4;
/// A split record's buffer is allocated for its whole announced length at
/// once up to this length; a longer one only once half of it has arrived.
const PREALLOC_LIMIT: usize = 1 << 20;

/// A split record being reassembled. Every byte is copied once, into a
/// buffer of exactly the record's length: allocated on the FIRST chunk for
/// records up to [`PREALLOC_LIMIT`], and for longer ones once half the
/// record has arrived (so an announcement alone never makes us allocate
/// much); until then the parts stay where they were decrypted.
struct Partial {
    record: Option<BytesMut>,
    parts: Vec<Bytes>,
    received: usize,
    total: usize,
}

impl Partial {
    fn new(total: usize) -> Self {
        Self {
            record: None,
            parts: Vec::new(),
            received: 0,
            total,
        }
    }

    /// Adds the next part; the caller has checked it fits in `total`.
    fn push(&mut self, part: BytesMut) {
        self.received += part.len();
        if let Some(record) = &mut self.record {
            record.extend_from_slice(&part);
        } else if self.total <= PREALLOC_LIMIT.max(2 * self.received) {
            let mut record = BytesMut::with_capacity(self.total);
            for p in self.parts.drain(..) {
                record.extend_from_slice(&p);
            }
            record.extend_from_slice(&part);
            self.record = Some(record);
        } else {
            self.parts.push(part.freeze());
        }
    }

    fn is_complete(&self) -> bool {
        self.received == self.total
    }

    /// The finished record (once complete, it is always in `record`).
    fn into_record(self) -> Bytes {
        self.record.map(BytesMut::freeze).unwrap_or_default()
    }
}

/// Room for chunks in one message; the last 3 bytes of the largest
/// plaintext stay free for a REKEY chunk.
const CHUNK_ROOM: usize = MAX_PLAINTEXT_LEN - CHUNK_HEADER_LEN;

/// Why a session was closed, as carried by a close record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseCode {
    /// An ordinary end of the session.
    Normal,
    /// The sender's contact policy refused the receiver's key.
    Denied,
    /// The sender is shutting down.
    Shutdown,
    /// A code this version does not name.
    Other(u8),
}

impl CloseCode {
    /// The code's byte on the wire.
    pub fn to_byte(self) -> u8 {
        match self {
            Self::Normal => 0,
            Self::Denied => 1,
            Self::Shutdown => 2,
            Self::Other(b) => b,
        }
    }

    /// The code a byte stands for.
    pub fn from_byte(b: u8) -> Self {
        match b {
            0 => Self::Normal,
            1 => Self::Denied,
            2 => Self::Shutdown,
            other => Self::Other(other),
        }
    }
}

/// The contents of a close record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CloseReason {
    /// Why.
    pub code: CloseCode,
    /// Free text for people (at most 255 bytes).
    pub reason: String,
}

/// Cuts `s` to at most `max` bytes at a character boundary.
fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Turns records into length-prefixed, sealed Noise messages, packing as
/// many records as fit into each message and splitting records that do not
/// fit into one.
///
/// Output accumulates in an internal buffer: [`wire`](Self::wire) gives the
/// sealed bytes ready for the stream, [`consume_wire`](Self::consume_wire)
/// drops them once written. A message stays open (unsealed) until
/// [`flush`](Self::flush) or until it is full.
///
/// [`push_record`](Self::push_record) copies a record into the buffer
/// once (messages are then sealed in place); [`begin_record`](Self::begin_record)
/// lets the caller write a record there directly instead. The buffer is
/// allocated on demand, grows with what is buffered, and is freed by
/// [`release_buffer`](Self::release_buffer) when the session goes quiet.
pub struct RecordEncoder {
    sealer: Sealer,
    buf: Vec<u8>,
    open: Option<usize>,
    rekey_after: Option<u64>,
    since_rekey: u64,
    max_record_size: usize,
    closed: bool,
    failed: bool,
    messages: u64,
}

impl RecordEncoder {
    /// An encoder over `sealer`. Records larger than `max_record_size` are
    /// refused; with `rekey_after_messages = Some(n)`, every n-th message
    /// carries a REKEY chunk and the key is replaced after it.
    pub fn new(sealer: Sealer, max_record_size: usize, rekey_after_messages: Option<u64>) -> Self {
        Self {
            sealer,
            buf: Vec::new(),
            open: None,
            rekey_after: rekey_after_messages.filter(|&n| n > 0),
            since_rekey: 0,
            max_record_size,
            closed: false,
            failed: false,
            messages: 0,
        }
    }

    fn check_usable(&self) -> Result<(), TransportError> {
        if self.failed {
            return Err(TransportError::NonceExhausted);
        }
        if self.closed {
            return Err(TransportError::Closed);
        }
        Ok(())
    }

    fn room(&self) -> usize {
        match self.open {
            Some(start) => CHUNK_ROOM - (self.buf.len() - start - LENGTH_PREFIX_LEN),
            None => 0,
        }
    }

    fn begin(&mut self) {
        self.open = Some(self.buf.len());
        self.buf.extend_from_slice(&[0, 0]);
    }

    fn chunk_header(&mut self, kind: u8, body_len: usize) {
        // Callers guarantee body_len <= CHUNK_ROOM < 65536.
        let len = (body_len as u16).to_be_bytes();
        self.buf.extend_from_slice(&[kind, len[0], len[1]]);
    }

    fn chunk(&mut self, kind: u8, body: &[u8]) {
        self.chunk_header(kind, body.len());
        self.buf.extend_from_slice(body);
    }

    /// Whether the next sealed message must carry a REKEY chunk.
    fn rekey_due(&self, allow_rekey: bool) -> bool {
        allow_rekey && self.rekey_after.is_some_and(|n| self.since_rekey + 1 >= n)
    }

    fn seal_open(&mut self, allow_rekey: bool) -> Result<(), TransportError> {
        let Some(start) = self.open.take() else {
            return Ok(());
        };
        let rekey_now = self.rekey_due(allow_rekey);
        if rekey_now {
            self.chunk(REKEY, &[]);
        }
        let end = self.buf.len();
        self.buf.resize(end + TAGLEN, 0);
        self.seal_at(start, end, rekey_now)
    }

    /// Seals the message whose prefix is at `start` and whose plaintext
    /// ends at `end`; the 16 bytes after `end` receive the tag.
    fn seal_at(&mut self, start: usize, end: usize, rekey_now: bool) -> Result<(), TransportError> {
        let body = start + LENGTH_PREFIX_LEN;
        let plain_len = end - body;
        let sealed = match self
            .sealer
            .seal_in_place(&mut self.buf[body..end + TAGLEN], plain_len)
        {
            Ok(n) => n,
            Err(e) => {
                self.buf.truncate(start);
                self.failed = true;
                return Err(e);
            }
        };
        // sealed <= 65535 by construction.
        self.buf[start..body].copy_from_slice(&(sealed as u16).to_be_bytes());
        self.messages += 1;
        if rekey_now {
            self.sealer.rekey();
            self.since_rekey = 0;
        } else {
            self.since_rekey += 1;
        }
        Ok(())
    }

    /// Starts a record that the caller writes straight into the encoder's
    /// buffer (with [`RecordWriter::extend_from_slice`] or
    /// [`std::io::Write`]), saving the copy [`push_record`](Self::push_record)
    /// makes. [`RecordWriter::finish`] then frames it exactly as
    /// `push_record` would have: a record that fits in the open message
    /// costs no copy at all; one that has to start a new message is moved
    /// by a few bytes inside the buffer (one copy); one too large for a
    /// single message (over 65516 bytes) is moved out and split, which
    /// costs one copy more than `push_record`. Dropping the writer without
    /// `finish` abandons the record.
    ///
    /// # Errors
    /// [`TransportError::Closed`] after [`close`](Self::close);
    /// [`TransportError::NonceExhausted`] after a failure to seal.
    pub fn begin_record(&mut self) -> Result<RecordWriter<'_>, TransportError> {
        self.check_usable()?;
        let opened = self.open.is_none();
        if opened {
            self.begin();
        }
        let hole = self.buf.len();
        self.buf.extend_from_slice(&[0; CHUNK_HEADER_LEN]);
        Ok(RecordWriter {
            enc: self,
            hole,
            opened,
            done: false,
        })
    }

    /// Frames the record written after the header hole at `hole`.
    fn finish_record(&mut self, hole: usize) -> Result<(), TransportError> {
        let data = hole + CHUNK_HEADER_LEN;
        let len = self.buf.len() - data;
        if len > self.max_record_size {
            return Err(TransportError::RecordTooLarge {
                len,
                max: self.max_record_size,
            });
        }
        let Some(start) = self.open else {
            return Err(TransportError::Closed);
        };
        let room = CHUNK_ROOM - (hole - start - LENGTH_PREFIX_LEN);
        if len + CHUNK_HEADER_LEN <= room {
            // Fits where it is.
            self.write_header(hole, RECORD, len);
            return Ok(());
        }
        if len + CHUNK_HEADER_LEN <= CHUNK_ROOM {
            // Seal the open message before the record and start a new one:
            // the record moves by the tag, a prefix and maybe a REKEY chunk.
            let rekey_now = self.rekey_due(true);
            let rekey_len = if rekey_now { CHUNK_HEADER_LEN } else { 0 };
            let shift = rekey_len + TAGLEN + LENGTH_PREFIX_LEN;
            let end = self.buf.len();
            self.buf.resize(end + shift, 0);
            self.buf.copy_within(data..end, data + shift);
            if rekey_now {
                self.write_header(hole, REKEY, 0);
            }
            self.open = None;
            self.seal_at(start, hole + rekey_len, rekey_now)?;
            let next = hole + rekey_len + TAGLEN;
            self.open = Some(next);
            self.buf[next..next + LENGTH_PREFIX_LEN].fill(0);
            self.write_header(next + LENGTH_PREFIX_LEN, RECORD, len);
            return Ok(());
        }
        // Too large for one message: split as push_record does.
        let record = self.buf.split_off(data);
        self.buf.truncate(hole);
        self.push_record(&record)
    }

    /// Drops a record being written (and the message begun for it).
    fn abandon_record(&mut self, hole: usize, opened: bool) {
        self.buf.truncate(hole);
        if opened && let Some(start) = self.open.take() {
            self.buf.truncate(start);
        }
    }

    fn write_header(&mut self, at: usize, kind: u8, body_len: usize) {
        // Callers guarantee body_len <= CHUNK_ROOM < 65536.
        let len = (body_len as u16).to_be_bytes();
        self.buf[at..at + CHUNK_HEADER_LEN].copy_from_slice(&[kind, len[0], len[1]]);
    }

    /// Adds one record. It joins the open message if it fits there; a record
    /// that fits in one message otherwise starts a new one; a larger record
    /// fills the open message and continues in as many as it needs.
    ///
    /// # Errors
    /// [`TransportError::RecordTooLarge`] over the maximum record size;
    /// [`TransportError::Closed`] after [`close`](Self::close);
    /// [`TransportError::NonceExhausted`] when a full message could not be
    /// sealed.
    pub fn push_record(&mut self, record: &[u8]) -> Result<(), TransportError> {
        self.check_usable()?;
        if record.len() > self.max_record_size {
            return Err(TransportError::RecordTooLarge {
                len: record.len(),
                max: self.max_record_size,
            });
        }
        if record.len() + CHUNK_HEADER_LEN <= CHUNK_ROOM {
            if self.room() < record.len() + CHUNK_HEADER_LEN {
                self.seal_open(true)?;
                self.begin();
            }
            self.chunk(RECORD, record);
            return Ok(());
        }
        // Split: FIRST carries the total length, NEXT chunks the rest.
        if self.room() < CHUNK_HEADER_LEN + TOTAL_LEN + 1 {
            self.seal_open(true)?;
            self.begin();
        }
        let space = self.room() - CHUNK_HEADER_LEN - TOTAL_LEN;
        let (first, mut rest) = record.split_at(space);
        // max_record_size is at most u32::MAX (checked by the config).
        let total = u32::try_from(record.len()).map_err(|_| TransportError::RecordTooLarge {
            len: record.len(),
            max: u32::MAX as usize,
        })?;
        self.chunk_header(FIRST, TOTAL_LEN + first.len());
        self.buf.extend_from_slice(&total.to_be_bytes());
        self.buf.extend_from_slice(first);
        while !rest.is_empty() {
            if self.room() <= CHUNK_HEADER_LEN {
                self.seal_open(true)?;
                self.begin();
            }
            let space = self.room() - CHUNK_HEADER_LEN;
            let (part, tail) = rest.split_at(space.min(rest.len()));
            self.chunk(NEXT, part);
            rest = tail;
        }
        Ok(())
    }

    /// Seals the open message, if any.
    ///
    /// # Errors
    /// [`TransportError::NonceExhausted`].
    pub fn flush(&mut self) -> Result<(), TransportError> {
        if self.failed {
            return Err(TransportError::NonceExhausted);
        }
        self.seal_open(true)
    }

    /// Seals a keepalive: an empty message, unless a message with records is
    /// open, in which case that message is sealed instead.
    ///
    /// # Errors
    /// As [`flush`](Self::flush); [`TransportError::Closed`] after close.
    pub fn keepalive(&mut self) -> Result<(), TransportError> {
        self.check_usable()?;
        if self.open.is_none() {
            self.begin();
        }
        self.seal_open(true)
    }

    /// Seals the open message with a close record as its last chunk. Nothing
    /// more can be pushed afterwards. The reason is cut to 255 bytes.
    ///
    /// # Errors
    /// As [`flush`](Self::flush); [`TransportError::Closed`] if already
    /// closed.
    pub fn close(&mut self, code: CloseCode, reason: &str) -> Result<(), TransportError> {
        self.check_usable()?;
        let reason = truncate_utf8(reason, MAX_CLOSE_REASON_LEN);
        let mut body = Vec::with_capacity(1 + reason.len());
        body.push(code.to_byte());
        body.extend_from_slice(reason.as_bytes());
        if self.room() < body.len() + CHUNK_HEADER_LEN {
            self.seal_open(true)?;
            self.begin();
        }
        self.chunk(CLOSE, &body);
        self.closed = true;
        self.seal_open(false)
    }

    /// The sealed bytes ready to be written to the stream.
    pub fn wire(&self) -> &[u8] {
        &self.buf[..self.open.unwrap_or(self.buf.len())]
    }

    /// Bytes held: sealed ones plus the open message.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Forgets the sealed bytes returned by [`wire`](Self::wire) (call once
    /// they are written).
    pub fn consume_wire(&mut self) {
        match self.open {
            Some(start) => {
                self.buf.drain(..start);
                self.open = Some(0);
            }
            None => self.buf.clear(),
        }
    }

    /// Takes the sealed bytes out, so that they can be written somewhere
    /// else (by another task, say) without a copy. Only when no message is
    /// open, which is always the case after [`flush`](Self::flush); `None`
    /// otherwise or when there is nothing to take.
    pub fn take_wire(&mut self) -> Option<Vec<u8>> {
        if self.open.is_some() || self.buf.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut self.buf))
    }

    /// Gives back a buffer returned by [`take_wire`](Self::take_wire) once
    /// it is written, so its allocation is used again.
    pub fn reuse_buffer(&mut self, mut buf: Vec<u8>) {
        if self.buf.is_empty() && self.open.is_none() && buf.capacity() > self.buf.capacity() {
            buf.clear();
            self.buf = buf;
        }
    }

    /// Frees the output buffer if it holds nothing (no sealed bytes waiting
    /// and no open message), so that an idle session keeps no buffer. The
    /// buffer is allocated again, on demand, by the next record. Call it
    /// when the session goes quiet; calling it while busy only costs
    /// reallocations.
    pub fn release_buffer(&mut self) {
        if self.buf.is_empty() && self.open.is_none() {
            self.buf = Vec::new();
        }
    }

    /// Bytes of heap the output buffer holds (its capacity).
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// How many Noise messages have been sealed so far.
    pub fn messages_sealed(&self) -> u64 {
        self.messages
    }

    /// The nonce the next sealed message will use.
    pub fn nonce(&self) -> u64 {
        self.sealer.nonce()
    }

    /// Moves the nonce counter forward (never backwards).
    #[cfg(feature = "test-hooks")]
    pub fn advance_nonce_for_testing(&mut self, n: u64) {
        self.sealer.advance_nonce_for_testing(n);
    }
}

impl std::fmt::Debug for RecordEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordEncoder")
            .field("messages", &self.messages)
            .finish_non_exhaustive()
    }
}

/// A record being written in place into a [`RecordEncoder`]'s buffer; see
/// [`RecordEncoder::begin_record`].
///
/// ```
/// # use capwire_transport::*;
/// # fn demo(encoder: &mut RecordEncoder) -> Result<(), TransportError> {
/// use std::io::Write;
/// let mut record = encoder.begin_record()?;
/// record.extend_from_slice(b"hello, ");
/// write!(record, "{}", "world").expect("writing to memory");
/// record.finish()?;
/// encoder.flush()?;
/// # Ok(()) }
/// ```
pub struct RecordWriter<'a> {
    enc: &'a mut RecordEncoder,
    /// Where the chunk header goes; the record follows it.
    hole: usize,
    /// Whether `begin_record` began the open message.
    opened: bool,
    done: bool,
}

impl RecordWriter<'_> {
    /// Appends bytes to the record.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.enc.buf.extend_from_slice(bytes);
    }

    /// The record written so far, to read or patch in place.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let data = self.hole + CHUNK_HEADER_LEN;
        &mut self.enc.buf[data..]
    }

    /// Length of the record written so far.
    pub fn len(&self) -> usize {
        self.enc.buf.len() - self.hole - CHUNK_HEADER_LEN
    }

    /// Whether nothing has been written yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ends the record and frames it (see
    /// [`RecordEncoder::begin_record`]).
    ///
    /// # Errors
    /// [`TransportError::RecordTooLarge`] over the maximum record size (the
    /// record is then dropped and the encoder stays usable);
    /// [`TransportError::NonceExhausted`] when a full message could not be
    /// sealed.
    pub fn finish(mut self) -> Result<(), TransportError> {
        let result = self.enc.finish_record(self.hole);
        if matches!(result, Err(TransportError::RecordTooLarge { .. })) {
            return result; // `drop` abandons the record.
        }
        self.done = true;
        result
    }
}

impl std::io::Write for RecordWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.extend_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for RecordWriter<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.enc.abandon_record(self.hole, self.opened);
        }
    }
}

impl std::fmt::Debug for RecordWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordWriter")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

/// What one call to [`RecordDecoder::decode`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decoded {
    /// Complete, authenticated Noise messages consumed.
    pub messages: usize,
    /// The close record, once it has arrived.
    pub close: Option<CloseReason>,
}

/// Turns stream bytes back into records: checks each length prefix,
/// authenticates and decrypts each message in place, reassembles split
/// records, and stops at the close record. Any error is final.
///
/// Records that fit in one message are handed out without a copy (they
/// share the caller's buffer). A split record is copied once, into a
/// buffer of exactly its length: allocated when its first part arrives for
/// records up to 1 MiB, and for longer ones only once half of it has
/// arrived, so that an announced length alone never makes the decoder
/// allocate much. Between parts the decoder holds nothing but the parts
/// themselves.
pub struct RecordDecoder {
    opener: Opener,
    /// A split record being reassembled.
    partial: Option<Partial>,
    max_record_size: usize,
    close: Option<CloseReason>,
    failed: Option<Violation>,
}

impl RecordDecoder {
    /// A decoder over `opener` that refuses records over `max_record_size`.
    pub fn new(opener: Opener, max_record_size: usize) -> Self {
        Self {
            opener,
            partial: None,
            max_record_size,
            close: None,
            failed: None,
        }
    }

    /// Consumes every complete message at the front of `buf`, appending the
    /// records they finish to `out` (records inside one message share its
    /// buffer: no copy). A partial message stays in `buf`. After a close
    /// record nothing more is consumed.
    ///
    /// Records of a message are appended only once the whole message has
    /// been authenticated and parsed.
    ///
    /// # Errors
    /// [`TransportError::PeerMisbehaved`] for a length prefix under 16, a
    /// forged or out-of-order message, bad framing or an oversize record;
    /// the decoder then refuses everything.
    pub fn decode(
        &mut self,
        buf: &mut BytesMut,
        out: &mut Vec<Bytes>,
    ) -> Result<Decoded, TransportError> {
        if let Some(v) = self.failed {
            return Err(v.into());
        }
        let mut decoded = Decoded::default();
        while self.close.is_none() && buf.len() >= LENGTH_PREFIX_LEN {
            let len = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
            if len < TAGLEN {
                return Err(self.fail(Violation::ShortMessage));
            }
            if buf.len() < LENGTH_PREFIX_LEN + len {
                buf.reserve(LENGTH_PREFIX_LEN + len - buf.len());
                break;
            }
            let mut msg = buf.split_to(LENGTH_PREFIX_LEN + len);
            msg.advance(LENGTH_PREFIX_LEN);
            let plain = match self.opener.open_in_place(&mut msg) {
                Ok(n) => n,
                Err(TransportError::PeerMisbehaved(v)) => return Err(self.fail(v)),
                Err(e) => return Err(e),
            };
            msg.truncate(plain);
            let mark = out.len();
            match self.parse(msg, out) {
                Ok(rekey) => {
                    if rekey {
                        self.opener.rekey();
                    }
                }
                Err(v) => {
                    out.truncate(mark);
                    return Err(self.fail(v));
                }
            }
            decoded.messages += 1;
        }
        decoded.close.clone_from(&self.close);
        Ok(decoded)
    }

    fn fail(&mut self, v: Violation) -> TransportError {
        self.failed = Some(v);
        self.partial = None;
        v.into()
    }

    /// Parses one plaintext. Returns whether it ended with a REKEY chunk.
    fn parse(&mut self, mut msg: BytesMut, out: &mut Vec<Bytes>) -> Result<bool, Violation> {
        while !msg.is_empty() {
            if msg.len() < CHUNK_HEADER_LEN {
                return Err(Violation::Framing);
            }
            let kind = msg[0];
            let len = usize::from(u16::from_be_bytes([msg[1], msg[2]]));
            if msg.len() < CHUNK_HEADER_LEN + len {
                return Err(Violation::Framing);
            }
            msg.advance(CHUNK_HEADER_LEN);
            let body = msg.split_to(len);
            match kind {
                RECORD => {
                    if self.partial.is_some() {
                        return Err(Violation::Framing);
                    }
                    if len > self.max_record_size {
                        return Err(Violation::RecordTooLarge);
                    }
                    out.push(body.freeze());
                }
                FIRST => {
                    if self.partial.is_some() || len <= TOTAL_LEN {
                        return Err(Violation::Framing);
                    }
                    let total = u32::from_be_bytes([body[0], body[1], body[2], body[3]]) as usize;
                    // Refused on the announcement, before any allocation.
                    if total > self.max_record_size {
                        return Err(Violation::RecordTooLarge);
                    }
                    if len - TOTAL_LEN >= total {
                        return Err(Violation::Framing);
                    }
                    let mut first = body;
                    first.advance(TOTAL_LEN);
                    let mut partial = Partial::new(total);
                    partial.push(first);
                    self.partial = Some(partial);
                }
                NEXT => {
                    let Some(partial) = &mut self.partial else {
                        return Err(Violation::Framing);
                    };
                    if len == 0 || partial.received + len > partial.total {
                        return Err(Violation::Framing);
                    }
                    partial.push(body);
                    if partial.is_complete()
                        && let Some(partial) = self.partial.take()
                    {
                        out.push(partial.into_record());
                    }
                }
                CLOSE => {
                    if self.partial.is_some() || !msg.is_empty() || body.is_empty() {
                        return Err(Violation::Framing);
                    }
                    if body.len() - 1 > MAX_CLOSE_REASON_LEN {
                        return Err(Violation::Framing);
                    }
                    let reason = std::str::from_utf8(&body[1..]).map_err(|_| Violation::Framing)?;
                    self.close = Some(CloseReason {
                        code: CloseCode::from_byte(body[0]),
                        reason: reason.to_owned(),
                    });
                }
                REKEY => {
                    if len != 0 || !msg.is_empty() {
                        return Err(Violation::Framing);
                    }
                    return Ok(true);
                }
                _ => return Err(Violation::Framing),
            }
        }
        Ok(false)
    }

    /// The close record, once received.
    pub fn close_reason(&self) -> Option<&CloseReason> {
        self.close.as_ref()
    }

    /// Whether a record is partly received (some of its parts arrived, the
    /// last has not).
    pub fn has_partial_record(&self) -> bool {
        self.partial.is_some()
    }

    /// The nonce the next message must carry.
    pub fn nonce(&self) -> u64 {
        self.opener.nonce()
    }

    /// Moves the nonce counter forward (never backwards).
    #[cfg(feature = "test-hooks")]
    pub fn advance_nonce_for_testing(&mut self, n: u64) {
        self.opener.advance_nonce_for_testing(n);
    }
}

impl std::fmt::Debug for RecordDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordDecoder")
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::{Initiator, Responder};
    use crate::keys::{Keypair, OsEntropy};
    use crate::session::TransportSession;

    fn pair() -> (TransportSession, TransportSession) {
        let a = Keypair::generate().unwrap();
        let b = Keypair::generate().unwrap();
        let (mut m1, mut m2, mut m3, mut p) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let i = Initiator::new(&a, &OsEntropy)
            .unwrap()
            .write_message(&[], &mut m1)
            .unwrap();
        let r = Responder::new(&b, &OsEntropy)
            .unwrap()
            .read_message(&m1, &mut p)
            .unwrap()
            .write_message(&[], &mut m2)
            .unwrap();
        let i = i
            .read_message(&m2, &mut p)
            .unwrap()
            .write_message(&[], &mut m3)
            .unwrap();
        let r = r.read_message(&m3, &mut p).unwrap();
        (i, r)
    }

    fn codec(max: usize, rekey: Option<u64>) -> (RecordEncoder, RecordDecoder) {
        let (i, r) = pair();
        let (sealer, _) = i.split();
        let (_, opener) = r.split();
        (
            RecordEncoder::new(sealer, max, rekey),
            RecordDecoder::new(opener, max),
        )
    }

    fn message_lengths(wire: &[u8]) -> Vec<usize> {
        let mut lens = Vec::new();
        let mut rest = wire;
        while rest.len() >= 2 {
            let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
            lens.push(len);
            rest = &rest[2 + len..];
        }
        assert!(rest.is_empty());
        lens
    }

    #[test]
    fn small_records_share_one_message() {
        let (mut enc, mut dec) = codec(1 << 20, None);
        for i in 0..100u8 {
            enc.push_record(&[i; 64]).unwrap();
        }
        enc.flush().unwrap();
        assert_eq!(message_lengths(enc.wire()), vec![100 * 67 + 16]);
        let mut buf = BytesMut::from(enc.wire());
        let mut out = Vec::new();
        let d = dec.decode(&mut buf, &mut out).unwrap();
        assert_eq!(d.messages, 1);
        assert_eq!(out.len(), 100);
        assert!(out.iter().enumerate().all(|(i, r)| r[..] == [i as u8; 64]));
    }

    #[test]
    fn large_records_are_split_and_reassembled() {
        let (mut enc, mut dec) = codec(1 << 20, None);
        let record: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        enc.push_record(b"first").unwrap();
        enc.push_record(&record).unwrap();
        enc.push_record(b"last").unwrap();
        enc.flush().unwrap();
        let lens = message_lengths(enc.wire());
        assert!(lens.len() >= 4);
        assert!(lens.iter().all(|&l| l <= 65535));
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        // Feed the stream one byte at a time: nothing is delivered early.
        for &b in enc.wire() {
            buf.extend_from_slice(&[b]);
            dec.decode(&mut buf, &mut out).unwrap();
        }
        assert_eq!(out.len(), 3);
        assert_eq!(&out[0][..], b"first");
        assert_eq!(&out[1][..], &record[..]);
        assert_eq!(&out[2][..], b"last");
    }

    #[test]
    fn empty_records_and_keepalives() {
        let (mut enc, mut dec) = codec(100, None);
        enc.keepalive().unwrap();
        enc.push_record(b"").unwrap();
        enc.flush().unwrap();
        enc.keepalive().unwrap();
        assert_eq!(message_lengths(enc.wire()), vec![16, 19, 16]);
        let mut buf = BytesMut::from(enc.wire());
        let mut out = Vec::new();
        let d = dec.decode(&mut buf, &mut out).unwrap();
        assert_eq!(d.messages, 3);
        assert_eq!(out, vec![Bytes::new()]);
    }

    #[test]
    fn close_ends_the_stream() {
        let (mut enc, mut dec) = codec(100, None);
        enc.push_record(b"bye").unwrap();
        enc.close(CloseCode::Normal, "done").unwrap();
        assert!(matches!(enc.push_record(b"x"), Err(TransportError::Closed)));
        let mut buf = BytesMut::from(enc.wire());
        let mut out = Vec::new();
        let d = dec.decode(&mut buf, &mut out).unwrap();
        assert_eq!(
            d.close,
            Some(CloseReason {
                code: CloseCode::Normal,
                reason: "done".into()
            })
        );
        assert_eq!(out, vec![Bytes::from_static(b"bye")]);
    }

    #[test]
    fn rekey_every_n_messages_stays_in_step() {
        let (mut enc, mut dec) = codec(1 << 20, Some(3));
        let mut out = Vec::new();
        for round in 0..10u8 {
            enc.push_record(&[round; 10]).unwrap();
            enc.flush().unwrap();
            let mut buf = BytesMut::from(enc.wire());
            enc.consume_wire();
            dec.decode(&mut buf, &mut out).unwrap();
        }
        assert_eq!(out.len(), 10);
        assert_eq!(enc.nonce(), 10, "rekey keeps the nonce counter");
    }

    #[test]
    fn oversize_record_is_refused_on_both_sides() {
        let (mut enc, _) = codec(10, None);
        assert!(matches!(
            enc.push_record(&[0; 11]),
            Err(TransportError::RecordTooLarge { len: 11, max: 10 })
        ));
        // A sender with a larger limit than the receiver: whole and split.
        for size in [11, 100_000] {
            let (i, r) = pair();
            let mut enc = RecordEncoder::new(i.split().0, 1 << 20, None);
            let mut dec = RecordDecoder::new(r.split().1, 10);
            enc.push_record(&vec![0; size]).unwrap();
            enc.flush().unwrap();
            let mut buf = BytesMut::from(enc.wire());
            let mut out = Vec::new();
            assert!(matches!(
                dec.decode(&mut buf, &mut out),
                Err(TransportError::PeerMisbehaved(Violation::RecordTooLarge))
            ));
            assert!(out.is_empty());
        }
    }

    /// Encodes `records` with `push_record` or with `begin_record`, both
    /// through the same chunking, and returns the message lengths and what
    /// a decoder makes of them.
    fn encode_both_ways(records: &[Vec<u8>], rekey: Option<u64>) -> [(Vec<usize>, Vec<Bytes>); 2] {
        [false, true].map(|in_place| {
            let (mut enc, mut dec) = codec(1 << 22, rekey);
            for r in records {
                if in_place {
                    let mut w = enc.begin_record().unwrap();
                    // Written in two pieces, as a serializer would.
                    let (a, b) = r.split_at(r.len() / 3);
                    w.extend_from_slice(a);
                    std::io::Write::write_all(&mut w, b).unwrap();
                    assert_eq!(w.len(), r.len());
                    w.finish().unwrap();
                } else {
                    enc.push_record(r).unwrap();
                }
            }
            enc.flush().unwrap();
            let lens = message_lengths(enc.wire());
            let mut buf = BytesMut::from(enc.wire());
            let mut out = Vec::new();
            dec.decode(&mut buf, &mut out).unwrap();
            (lens, out)
        })
    }

    #[test]
    fn records_written_in_place_are_framed_like_pushed_ones() {
        let sizes = [
            0usize, 1, 100, 30_000, 40_000, 65_513, 65_516, 65_517, 70_000, 200_000, 5,
        ];
        let records: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
            .collect();
        for rekey in [None, Some(1), Some(2)] {
            let [(pushed_lens, pushed), (written_lens, written)] =
                encode_both_ways(&records, rekey);
            assert_eq!(pushed_lens, written_lens, "rekey {rekey:?}");
            assert_eq!(pushed, written);
            assert_eq!(written.len(), records.len());
            for (got, want) in written.iter().zip(&records) {
                assert_eq!(&got[..], &want[..]);
            }
        }
    }

    #[test]
    fn an_abandoned_or_oversize_record_leaves_nothing_behind() {
        let (mut enc, mut dec) = codec(100, None);
        let mut w = enc.begin_record().unwrap();
        w.extend_from_slice(b"never mind");
        drop(w);
        enc.flush().unwrap();
        assert!(enc.wire().is_empty(), "no message, not even a keepalive");
        let mut w = enc.begin_record().unwrap();
        w.extend_from_slice(&[0; 101]);
        assert!(matches!(
            w.finish(),
            Err(TransportError::RecordTooLarge { len: 101, max: 100 })
        ));
        enc.push_record(b"kept").unwrap();
        let mut w = enc.begin_record().unwrap();
        w.extend_from_slice(b"patch me");
        w.as_mut_slice()[0] = b'P';
        w.finish().unwrap();
        enc.flush().unwrap();
        assert_eq!(message_lengths(enc.wire()), vec![3 + 4 + 3 + 8 + 16]);
        let mut buf = BytesMut::from(enc.wire());
        let mut out = Vec::new();
        dec.decode(&mut buf, &mut out).unwrap();
        assert_eq!(out, [&b"kept"[..], &b"Patch me"[..]]);
    }

    #[test]
    fn the_output_buffer_is_allocated_on_demand_and_released_when_idle() {
        let (mut enc, _) = codec(1 << 20, None);
        assert_eq!(enc.buffer_capacity(), 0, "nothing up front");
        enc.push_record(&[1; 1000]).unwrap();
        assert!(enc.buffer_capacity() >= 1000);
        enc.release_buffer();
        assert!(enc.buffer_capacity() > 0, "kept while a message is open");
        enc.flush().unwrap();
        enc.release_buffer();
        assert!(
            enc.buffer_capacity() > 0,
            "kept while bytes wait to be written"
        );
        enc.consume_wire();
        enc.release_buffer();
        assert_eq!(enc.buffer_capacity(), 0);
        enc.keepalive().unwrap();
        assert_eq!(message_lengths(enc.wire()), vec![16]);
    }

    #[test]
    fn records_over_a_mebibyte_are_reassembled_exactly() {
        let (mut enc, mut dec) = codec(8 << 20, None);
        let record: Vec<u8> = (0..(3 << 20) + 7).map(|i: u32| (i % 249) as u8).collect();
        enc.push_record(&record).unwrap();
        enc.push_record(b"after").unwrap();
        enc.flush().unwrap();
        let wire = enc.wire().to_vec();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut messages = 0;
        for piece in wire.chunks(10_000) {
            buf.extend_from_slice(piece);
            messages += dec.decode(&mut buf, &mut out).unwrap().messages;
            if out.is_empty() && messages > 0 {
                assert!(dec.has_partial_record());
            }
        }
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].len(), record.len());
        assert!(out[0] == record[..]);
        assert_eq!(&out[1][..], b"after");
        assert!(!dec.has_partial_record());
    }

    #[test]
    fn consume_wire_keeps_the_open_message() {
        let (mut enc, mut dec) = codec(1 << 20, None);
        enc.push_record(&vec![7u8; 70_000]).unwrap();
        let first = enc.wire().to_vec();
        assert!(!first.is_empty());
        enc.consume_wire();
        enc.push_record(b"tail").unwrap();
        enc.flush().unwrap();
        let mut buf = BytesMut::from(&first[..]);
        buf.extend_from_slice(enc.wire());
        let mut out = Vec::new();
        dec.decode(&mut buf, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].len(), 70_000);
        assert_eq!(&out[1][..], b"tail");
    }
}
