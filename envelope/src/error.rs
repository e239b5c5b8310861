//! The codec's errors: [`DecodeError`] (the bytes came from a peer and break
//! the profile or the record layout) and [`EncodeError`] (a local value cannot
//! be put on the wire).

use crate::id::IdError;

/// Why received bytes were rejected.
///
/// Every variant is the sender's fault: the bytes break the strict CBOR
/// profile (see the crate docs) or the layout of a record. Offsets (`at`) are
/// byte positions in the input that was handed to the decoder.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ends in the middle of a data item.
    #[error("input ends inside a data item (at byte {at})")]
    Truncated {
        /// Where the missing bytes were expected.
        at: usize,
    },
    /// Bytes follow the end of the data item.
    #[error("{count} trailing bytes after the data item (at byte {at})")]
    TrailingBytes {
        /// Where the trailing bytes start.
        at: usize,
        /// How many there are.
        count: usize,
    },
    /// Arrays and maps nest deeper than the profile allows.
    #[error("nesting deeper than {max} levels (at byte {at})")]
    DepthExceeded {
        /// The container that went over the limit.
        at: usize,
        /// The limit, [`MAX_DEPTH`](crate::MAX_DEPTH).
        max: usize,
    },
    /// A length or item count larger than what is left of the input.
    #[error("header at byte {at} claims {claimed} bytes or items, only {remaining} bytes remain")]
    LengthTooLarge {
        /// The header's position.
        at: usize,
        /// The claimed length (bytes for strings, items for arrays, pairs for maps).
        claimed: u64,
        /// Bytes left in the input after the header.
        remaining: usize,
    },
    /// An indefinite-length string, array or map, or a stray "break" byte.
    #[error("indefinite-length encoding (at byte {at})")]
    IndefiniteLength {
        /// The offending header.
        at: usize,
    },
    /// A CBOR tag (major type 6): the profile has none.
    #[error("CBOR tag (at byte {at})")]
    Tag {
        /// The tag's position.
        at: usize,
    },
    /// An integer, length or simple value not in its shortest encoding.
    #[error("integer or length not in its shortest form (at byte {at})")]
    NonMinimalInteger {
        /// The offending header.
        at: usize,
    },
    /// A float that a shorter float encoding represents exactly, or a
    /// half- or single-precision signaling NaN (which has no exact value
    /// as a double, so that no encoder writes it).
    #[error("float not in its shortest exact form (at byte {at})")]
    NonMinimalFloat {
        /// The offending header.
        at: usize,
    },
    /// A simple value other than `false`, `true` and `null` (e.g. `undefined`).
    #[error("simple value {value} is not allowed (at byte {at})")]
    SimpleValue {
        /// Its position.
        at: usize,
        /// The simple value number (23 is `undefined`).
        value: u8,
    },
    /// An initial byte CBOR reserves (additional information 28 to 30).
    #[error("reserved initial byte {byte:#04x} (at byte {at})")]
    Reserved {
        /// Its position.
        at: usize,
        /// The byte.
        byte: u8,
    },
    /// A text string that is not valid UTF-8.
    #[error("text string is not valid UTF-8 (at byte {at})")]
    InvalidUtf8 {
        /// The string's header.
        at: usize,
    },
    /// The same key twice in one map.
    #[error("duplicate map key (at byte {at})")]
    DuplicateKey {
        /// The second occurrence.
        at: usize,
    },
    /// A map key that is not an integer, a text string or a byte string.
    #[error("map keys must be integers or strings (at byte {at})")]
    MapKeyType {
        /// The key's position.
        at: usize,
    },
    /// A record field of the wrong CBOR type.
    #[error("field `{field}` must be {expected}")]
    WrongType {
        /// The field (or `frame` for the record itself).
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// An integer field outside its range.
    #[error("field `{field}` is out of range")]
    IntegerOutOfRange {
        /// The field.
        field: &'static str,
    },
    /// A required field is absent.
    #[error("missing field `{field}`")]
    MissingField {
        /// The field.
        field: &'static str,
    },
    /// A key the record does not define, or one that does not belong with
    /// the others (such as `result` in a failed response).
    #[error("unknown field `{name}`")]
    UnknownField {
        /// The key as sent (cut to 64 bytes).
        name: Box<str>,
    },
    /// A frame type or close code that this version does not know.
    #[error("unknown {field} `{name}`")]
    UnknownName {
        /// `type` or `code`.
        field: &'static str,
        /// The name as sent (cut to 64 bytes).
        name: Box<str>,
    },
    /// A text field longer than its bound.
    #[error("field `{field}` is {len} bytes long, the limit is {max}")]
    StringTooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A request id or error code that breaks its grammar.
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// Well-formed CBOR that does not fit the Rust type it is decoded into.
    #[error("value does not match the expected type: {0}")]
    Deserialize(String),
}

/// Why a value could not be encoded.
///
/// These are local faults: the value has no representation in the strict
/// profile, or a record is not fit to send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The value's `Serialize` implementation failed.
    #[error("value cannot be serialized: {0}")]
    Serialize(String),
    /// The value serializes to CBOR outside the strict profile (for example
    /// integers beyond 64 bits, which CBOR encodes with tags, map keys that
    /// are not integers or strings, duplicate keys, or nesting too deep).
    #[error("value is outside the strict CBOR profile: {0}")]
    Profile(DecodeError),
    /// A text field longer than its bound.
    #[error("field `{field}` is {len} bytes long, the limit is {max}")]
    StringTooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// An identifier not fit for this record (such as an empty request id on
    /// a response).
    #[error(transparent)]
    InvalidId(#[from] IdError),
}

/// A copy of peer-supplied text for an error message, cut to 64 bytes.
pub(crate) fn name_for_error(bytes: &[u8]) -> Box<str> {
    let cut = &bytes[..bytes.len().min(64)];
    String::from_utf8_lossy(cut).into()
}
