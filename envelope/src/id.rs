//! Validated identifiers: [`CapId`], [`Verb`], [`ReqId`] and [`NodeId`].
//!
//! Each type can only hold a value that satisfies its grammar; construction
//! goes through `TryFrom<&str>` / [`FromStr`] and fails with [`IdError`].

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// Longest capability id, in bytes.
pub const MAX_CAP_ID_LEN: usize = 64;
/// Longest verb, in bytes.
pub const MAX_VERB_LEN: usize = 64;
/// Longest request id, in bytes.
pub const MAX_REQ_ID_LEN: usize = 64;

/// Why a string is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The value is empty where a value is required.
    #[error("{kind} is empty")]
    Empty {
        /// Which identifier.
        kind: &'static str,
    },
    /// The value is longer than its bound.
    #[error("{kind} is {len} bytes long, the limit is {max}")]
    TooLong {
        /// Which identifier.
        kind: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The value does not follow its grammar.
    #[error("{kind} is malformed: {why}")]
    Malformed {
        /// Which identifier.
        kind: &'static str,
        /// What is wrong.
        why: &'static str,
    },
}

/// The namespace of a capability id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Namespace {
    /// `core.*`: reserved for the framework's own capabilities.
    Core,
    /// `app.*`: application capabilities.
    App,
}

/// `[a-z][a-z0-9_]*`: one segment of a capability id, a verb, or an app
/// error code.
pub(crate) fn is_segment(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
}

/// A capability id such as `core.monitoring` or `app.echo`.
///
/// Grammar: `("core" | "app") ("." segment)+`, where a segment is
/// `[a-z][a-z0-9_]*`, at most [`MAX_CAP_ID_LEN`] bytes in all.
///
/// ```
/// use capwire_envelope::{CapId, Namespace};
/// let cap = CapId::try_from("app.echo").unwrap();
/// assert_eq!(cap.namespace(), Namespace::App);
/// assert!(CapId::try_from("App.Echo").is_err());
/// assert!(CapId::try_from("other.echo").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CapId(Box<str>);

impl CapId {
    const KIND: &'static str = "capability id";

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The namespace (`core` or `app`).
    pub fn namespace(&self) -> Namespace {
        if self.0.starts_with("core.") {
            Namespace::Core
        } else {
            Namespace::App
        }
    }
}

impl TryFrom<&str> for CapId {
    type Error = IdError;

    fn try_from(s: &str) -> Result<Self, IdError> {
        let kind = Self::KIND;
        if s.is_empty() {
            return Err(IdError::Empty { kind });
        }
        if s.len() > MAX_CAP_ID_LEN {
            return Err(IdError::TooLong {
                kind,
                len: s.len(),
                max: MAX_CAP_ID_LEN,
            });
        }
        let mut segments = s.split('.');
        match segments.next() {
            Some("core" | "app") => {}
            _ => {
                return Err(IdError::Malformed {
                    kind,
                    why: "must start with `core.` or `app.`",
                });
            }
        }
        let mut count = 0;
        for segment in segments {
            if !is_segment(segment) {
                return Err(IdError::Malformed {
                    kind,
                    why: "segments are lowercase `[a-z][a-z0-9_]*`, separated by single dots",
                });
            }
            count += 1;
        }
        if count == 0 {
            return Err(IdError::Malformed {
                kind,
                why: "needs a name after the namespace",
            });
        }
        Ok(Self(s.into()))
    }
}

/// A verb within a capability, such as `bind` or `get_config`.
///
/// Grammar: `[a-z][a-z0-9_]*`, at most [`MAX_VERB_LEN`] bytes.
///
/// ```
/// use capwire_envelope::Verb;
/// assert!(Verb::try_from("get_config").is_ok());
/// assert!(Verb::try_from("Disable").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Verb(Box<str>);

impl Verb {
    const KIND: &'static str = "verb";

    /// The verb as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for Verb {
    type Error = IdError;

    fn try_from(s: &str) -> Result<Self, IdError> {
        let kind = Self::KIND;
        if s.is_empty() {
            return Err(IdError::Empty { kind });
        }
        if s.len() > MAX_VERB_LEN {
            return Err(IdError::TooLong {
                kind,
                len: s.len(),
                max: MAX_VERB_LEN,
            });
        }
        if !is_segment(s) {
            return Err(IdError::Malformed {
                kind,
                why: "a verb is lowercase `[a-z][a-z0-9_]*`",
            });
        }
        Ok(Self(s.into()))
    }
}

/// A request correlation token. Empty means fire-and-forget.
///
/// Grammar: 0 to [`MAX_REQ_ID_LEN`] bytes of printable ASCII
/// (`0x21..=0x7e`: no spaces, no control bytes).
///
/// ```
/// use capwire_envelope::ReqId;
/// assert!(ReqId::EMPTY.is_fire_and_forget());
/// let id = ReqId::try_from("r-17").unwrap();
/// assert!(!id.is_fire_and_forget());
/// assert!(ReqId::try_from("a\0b").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReqId(ReqIdRepr);

/// Hashes the id's text only (the unused tail of the buffer is always
/// zero, so equal ids hash alike).
impl std::hash::Hash for ReqId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.as_bytes());
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ReqIdRepr {
    len: u8,
    bytes: [u8; MAX_REQ_ID_LEN],
}

impl ReqId {
    const KIND: &'static str = "request id";

    /// The empty request id: the envelope is fire-and-forget.
    pub const EMPTY: ReqId = ReqId(ReqIdRepr {
        len: 0,
        bytes: [0; MAX_REQ_ID_LEN],
    });

    /// `true` when this id is empty, i.e. no response is expected.
    pub fn is_fire_and_forget(&self) -> bool {
        self.0.len == 0
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        // Only printable ASCII is ever stored, so this cannot fail.
        std::str::from_utf8(&self.0.bytes[..usize::from(self.0.len)]).unwrap_or("")
    }

    /// The id's bytes (printable ASCII).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0.bytes[..usize::from(self.0.len)]
    }

    /// A request id made from a counter, e.g. `ReqId::from_u64(7)` is `"7"`.
    pub fn from_u64(n: u64) -> Self {
        let mut bytes = [0; MAX_REQ_ID_LEN];
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut v = n;
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        let len = digits.len() - i;
        bytes[..len].copy_from_slice(&digits[i..]);
        ReqId(ReqIdRepr {
            len: len as u8,
            bytes,
        })
    }
}

impl Default for ReqId {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl TryFrom<&str> for ReqId {
    type Error = IdError;

    fn try_from(s: &str) -> Result<Self, IdError> {
        let kind = Self::KIND;
        if s.len() > MAX_REQ_ID_LEN {
            return Err(IdError::TooLong {
                kind,
                len: s.len(),
                max: MAX_REQ_ID_LEN,
            });
        }
        if !s.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(IdError::Malformed {
                kind,
                why: "only printable ASCII without spaces (0x21..=0x7e)",
            });
        }
        let mut bytes = [0; MAX_REQ_ID_LEN];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Ok(ReqId(ReqIdRepr {
            len: s.len() as u8,
            bytes,
        }))
    }
}

/// A node's identity: its static X25519 public key.
///
/// The canonical text form is 64 lowercase hex digits; parsing accepts only
/// that form, so `parse(display(id)) == id` and every id has one spelling.
///
/// ```
/// use capwire_envelope::NodeId;
/// let id = NodeId::from_bytes([0xab; 32]);
/// let text = id.to_string();
/// assert_eq!(text.len(), 64);
/// assert_eq!(text.parse::<NodeId>().unwrap(), id);
/// assert!(text.to_uppercase().parse::<NodeId>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId([u8; 32]);

impl NodeId {
    const KIND: &'static str = "node id";

    /// Wraps 32 raw key bytes as they are.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw key bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Builds from a slice that must be exactly 32 bytes long.
    ///
    /// # Errors
    /// [`IdError::Malformed`] when the slice is not 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, IdError> {
        <[u8; 32]>::try_from(bytes)
            .map(Self)
            .map_err(|_| IdError::Malformed {
                kind: Self::KIND,
                why: "must be exactly 32 bytes",
            })
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({self})")
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = HEX[usize::from(b >> 4)];
            out[2 * i + 1] = HEX[usize::from(b & 0x0f)];
        }
        f.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

impl TryFrom<&str> for NodeId {
    type Error = IdError;

    fn try_from(s: &str) -> Result<Self, IdError> {
        let kind = Self::KIND;
        if s.len() != 64 {
            return Err(IdError::Malformed {
                kind,
                why: "must be 64 lowercase hex digits",
            });
        }
        fn nibble(c: u8) -> Option<u8> {
            match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            }
        }
        let mut out = [0u8; 32];
        for (i, pair) in s.as_bytes().chunks_exact(2).enumerate() {
            match (nibble(pair[0]), nibble(pair[1])) {
                (Some(hi), Some(lo)) => out[i] = (hi << 4) | lo,
                _ => {
                    return Err(IdError::Malformed {
                        kind,
                        why: "must be 64 lowercase hex digits",
                    });
                }
            }
        }
        Ok(Self(out))
    }
}

macro_rules! text_id_impls {
    ($t:ty) => {
        impl FromStr for $t {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::try_from(s)
            }
        }

        impl TryFrom<String> for $t {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::try_from(s.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $t;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str(<$t>::KIND)
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<$t, E> {
                        <$t>::try_from(v).map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
    };
}

text_id_impls!(CapId);
text_id_impls!(Verb);
text_id_impls!(ReqId);

impl FromStr for NodeId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::try_from(s)
    }
}

impl<'de> Deserialize<'de> for NodeId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NodeId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a node id: 32 bytes, or 64 lowercase hex digits")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<NodeId, E> {
                NodeId::try_from(v).map_err(E::custom)
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<NodeId, E> {
                NodeId::from_slice(v).map_err(E::custom)
            }
        }
        if d.is_human_readable() {
            d.deserialize_str(V)
        } else {
            d.deserialize_bytes(V)
        }
    }
}

macro_rules! display_as_str {
    ($t:ty) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl AsRef<str> for $t {
            fn as_ref(&self) -> &str {
                self.as_str()
            }
        }

        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}

display_as_str!(CapId);
display_as_str!(Verb);
display_as_str!(ReqId);

/// On the wire a node id is a CBOR byte string of 32 bytes; in
/// human-readable formats (JSON) it is its canonical hex text.
/// The JSON form of a node id (what the command-line tool reads and a
/// manifest's schemas describe): its 64 lowercase hex digits.
impl schemars::JsonSchema for NodeId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "NodeId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[0-9a-f]{64}$",
            "description": "a node id: 64 lowercase hex digits"
        })
    }
}

impl Serialize for NodeId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.collect_str(self)
        } else {
            s.serialize_bytes(&self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_ids() {
        for ok in ["core.monitoring", "app.echo", "app.a.b_c9", "core.x"] {
            assert!(CapId::try_from(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "core",
            "app.",
            "app..x",
            ".app.x",
            "app.x.",
            "App.x",
            "app.X",
            "app.9x",
            "apps.x",
            "app.x y",
            "app.x\0",
            "app.x/../y",
            "app.é",
            " app.x",
            "app.x ",
        ] {
            assert!(CapId::try_from(bad).is_err(), "{bad:?}");
        }
        let long = format!("app.{}", "a".repeat(MAX_CAP_ID_LEN));
        assert!(matches!(
            CapId::try_from(long.as_str()),
            Err(IdError::TooLong { .. })
        ));
        assert_eq!(
            CapId::try_from("core.cluster").unwrap().namespace(),
            Namespace::Core
        );
    }

    #[test]
    fn verbs() {
        assert!(Verb::try_from("set_config").is_ok());
        for bad in [
            "", "Disable", " bind", "bind ", "bi\0nd", "1bind", "b.c", "b-c",
        ] {
            assert!(Verb::try_from(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn req_ids() {
        assert_eq!(ReqId::try_from("").unwrap(), ReqId::EMPTY);
        assert_eq!(ReqId::from_u64(0).as_str(), "0");
        assert_eq!(ReqId::from_u64(u64::MAX).as_str(), "18446744073709551615");
        let max = "x".repeat(MAX_REQ_ID_LEN);
        assert_eq!(ReqId::try_from(max.as_str()).unwrap().as_str(), max);
        let over = "x".repeat(MAX_REQ_ID_LEN + 1);
        assert!(ReqId::try_from(over.as_str()).is_err());
        assert!(ReqId::try_from("a b").is_err());
        assert!(ReqId::try_from("é").is_err());
    }

    #[test]
    fn node_id_text_round_trip() {
        let id = NodeId::from_bytes(core::array::from_fn(|i| i as u8 * 7));
        let text = id.to_string();
        assert_eq!(text.parse::<NodeId>().unwrap(), id);
        assert!(text[..63].parse::<NodeId>().is_err());
        assert!(format!("{text}0").parse::<NodeId>().is_err());
        assert!(text.replace('a', "A").parse::<NodeId>().is_err() || !text.contains('a'));
        assert!(NodeId::from_slice(&[0; 31]).is_err());
    }
}
