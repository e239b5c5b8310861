//! Error codes and close codes, with their stable wire strings.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::id::{IdError, is_segment};
use crate::raw::RawValue;

/// Longest application error code, in bytes.
pub const MAX_APP_CODE_LEN: usize = 64;
/// Longest error message carried in an [`ErrorBody`], in bytes.
pub const MAX_MESSAGE_LEN: usize = 1024;
/// Longest reason carried in a close frame, in bytes.
pub const MAX_REASON_LEN: usize = 256;

/// Cuts `s` to at most `max` bytes, at a character boundary.
pub(crate) fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

macro_rules! builtin_codes {
    ($($(#[$doc:meta])* $variant:ident = $wire:literal,)*) => {
        /// Why a request failed: a closed set of codes with stable wire
        /// strings, plus [`ErrorCode::App`] for codes an application defines.
        ///
        /// ```
        /// use capwire_envelope::ErrorCode;
        /// assert_eq!(ErrorCode::UnknownVerb.as_str(), "unknown_verb");
        /// assert_eq!("bad_args".parse::<ErrorCode>().unwrap(), ErrorCode::BadArgs);
        /// let app = ErrorCode::app("out_of_stock").unwrap();
        /// assert_eq!(app.to_string(), "out_of_stock");
        /// assert!(ErrorCode::app("timeout").is_err(), "built-in strings are reserved");
        /// ```
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $($(#[$doc])* $variant,)*
            /// A code defined by an application.
            App(AppCode),
        }

        impl ErrorCode {
            /// Every built-in code, in documentation order.
            pub const BUILT_IN: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The wire string.
            pub fn as_str(&self) -> &str {
                match self {
                    $(ErrorCode::$variant => $wire,)*
                    ErrorCode::App(code) => code.as_str(),
                }
            }

            fn builtin(s: &str) -> Option<Self> {
                match s {
                    $($wire => Some(ErrorCode::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

builtin_codes! {
    /// No such capability or verb, or the chokepoint denies it outright.
    UnknownVerb = "unknown_verb",
    /// A controller verb from a peer that is not the bound control plane.
    Unauthorized = "unauthorized",
    /// The args do not fit the verb's type, or break its rules.
    BadArgs = "bad_args",
    /// The thing the request names does not exist.
    NotFound = "not_found",
    /// The thing the request would create already exists, or the same
    /// request is already running.
    Duplicate = "duplicate",
    /// The operation needs a bound control plane and there is none.
    NotBound = "not_bound",
    /// A compare-and-set found another version than the one it expected
    /// (`core.configuration/set_config` with `if_version`).
    Conflict = "conflict",
    /// The bind ceremony failed; `detail` says why (`{reason, attempts_left}`).
    BindFailed = "bind_failed",
    /// The deadline passed before the request completed.
    Timeout = "timeout",
    /// The caller cancelled the request, or the callee is shutting down.
    Cancelled = "cancelled",
    /// The request or its result is larger than allowed.
    TooLarge = "too_large",
    /// The callee is at a limit (in-flight requests, queues); retry later.
    Overloaded = "overloaded",
    /// The callee cannot serve the request now (for example, shutting down).
    Unavailable = "unavailable",
    /// The callee failed in a way that is not the caller's fault.
    Internal = "internal",
}

impl ErrorCode {
    /// An application-defined code.
    ///
    /// # Errors
    /// See [`AppCode`]'s grammar.
    pub fn app(code: &str) -> Result<Self, IdError> {
        AppCode::try_from(code).map(ErrorCode::App)
    }

    /// `true` for [`ErrorCode::App`].
    pub fn is_app(&self) -> bool {
        matches!(self, ErrorCode::App(_))
    }
}

impl FromStr for ErrorCode {
    type Err = IdError;

    /// A built-in wire string gives its variant; any other string that fits
    /// [`AppCode`]'s grammar gives [`ErrorCode::App`].
    fn from_str(s: &str) -> Result<Self, IdError> {
        match Self::builtin(s) {
            Some(code) => Ok(code),
            None => Self::app(s),
        }
    }
}

impl TryFrom<&str> for ErrorCode {
    type Error = IdError;
    fn try_from(s: &str) -> Result<Self, IdError> {
        s.parse()
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An application-defined error code.
///
/// Grammar: `[a-z][a-z0-9_]*`, at most [`MAX_APP_CODE_LEN`] bytes, and not
/// one of the built-in strings of [`ErrorCode`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AppCode(Box<str>);

impl AppCode {
    const KIND: &'static str = "app error code";

    /// The code as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for AppCode {
    type Error = IdError;

    fn try_from(s: &str) -> Result<Self, IdError> {
        let kind = Self::KIND;
        if s.is_empty() {
            return Err(IdError::Empty { kind });
        }
        if s.len() > MAX_APP_CODE_LEN {
            return Err(IdError::TooLong {
                kind,
                len: s.len(),
                max: MAX_APP_CODE_LEN,
            });
        }
        if !is_segment(s) {
            return Err(IdError::Malformed {
                kind,
                why: "an error code is lowercase `[a-z][a-z0-9_]*`",
            });
        }
        if ErrorCode::builtin(s).is_some() {
            return Err(IdError::Malformed {
                kind,
                why: "that string is a built-in error code",
            });
        }
        Ok(Self(s.into()))
    }
}

impl FromStr for AppCode {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::try_from(s)
    }
}

impl fmt::Display for AppCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a connection is being closed, sent in the close frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseCode {
    /// The sender is done with the connection.
    Normal,
    /// The sender is shutting down.
    Shutdown,
    /// The receiver sent something the protocol does not allow.
    ProtocolError,
    /// The receiver's hello names a protocol version the sender does not speak.
    UnsupportedProtocol,
    /// The receiver sent a record over the sender's limit.
    TooLarge,
    /// The sender cannot keep this connection (resource limits).
    Overloaded,
    /// Nothing arrived for too long.
    IdleTimeout,
    /// Another connection with the same peer replaces this one.
    Replaced,
    /// The sender's contact policy no longer admits the receiver.
    Policy,
}

impl CloseCode {
    /// Every close code.
    pub const ALL: [CloseCode; 9] = [
        CloseCode::Normal,
        CloseCode::Shutdown,
        CloseCode::ProtocolError,
        CloseCode::UnsupportedProtocol,
        CloseCode::TooLarge,
        CloseCode::Overloaded,
        CloseCode::IdleTimeout,
        CloseCode::Replaced,
        CloseCode::Policy,
    ];

    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseCode::Normal => "normal",
            CloseCode::Shutdown => "shutdown",
            CloseCode::ProtocolError => "protocol_error",
            CloseCode::UnsupportedProtocol => "unsupported_protocol",
            CloseCode::TooLarge => "too_large",
            CloseCode::Overloaded => "overloaded",
            CloseCode::IdleTimeout => "idle_timeout",
            CloseCode::Replaced => "replaced",
            CloseCode::Policy => "policy",
        }
    }

    /// The code for a wire string, if it is one.
    pub fn from_wire(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl fmt::Display for CloseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

macro_rules! serde_as_str {
    ($t:ty, $expecting:literal, $parse:expr) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $t;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<$t, E> {
                        $parse(v).map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
    };
}

serde_as_str!(ErrorCode, "an error code", |v: &str| v.parse::<ErrorCode>());
serde_as_str!(AppCode, "an app error code", |v: &str| v.parse::<AppCode>());
serde_as_str!(CloseCode, "a close code", |v: &str| {
    CloseCode::from_wire(v).ok_or("not a known close code")
});

/// The error half of a response: a code, a human-readable message and
/// optional structured detail.
///
/// ```
/// use capwire_envelope::{ErrorBody, ErrorCode, RawValue, MAX_MESSAGE_LEN};
/// let body = ErrorBody::new(ErrorCode::BindFailed, "wrong code")
///     .with_detail(RawValue::encode(&("wrong_code", 2)).unwrap());
/// assert_eq!(body.to_string(), "bind_failed: wrong code");
/// let long = ErrorBody::new(ErrorCode::Internal, "x".repeat(5000));
/// assert_eq!(long.message.len(), MAX_MESSAGE_LEN);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, for programs.
    pub code: ErrorCode,
    /// What went wrong, for people. At most [`MAX_MESSAGE_LEN`] bytes on the
    /// wire: the encoder cuts longer messages at a character boundary.
    pub message: String,
    /// Structured detail, for example the reason of a `bind_failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<RawValue>,
}

impl ErrorBody {
    /// A body without detail; the message is cut to [`MAX_MESSAGE_LEN`] bytes.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let mut message = message.into();
        let keep = truncate_str(&message, MAX_MESSAGE_LEN).len();
        message.truncate(keep);
        Self {
            code,
            message,
            detail: None,
        }
    }

    /// Adds structured detail.
    #[must_use]
    pub fn with_detail(mut self, detail: RawValue) -> Self {
        self.detail = Some(detail);
        self
    }
}

impl fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ErrorBody {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_strings_round_trip() {
        assert_eq!(ErrorCode::BUILT_IN.len(), 14);
        for code in ErrorCode::BUILT_IN {
            assert_eq!(code.as_str().parse::<ErrorCode>().unwrap(), *code);
            assert!(AppCode::try_from(code.as_str()).is_err());
            let bytes = crate::to_vec(code).unwrap();
            assert_eq!(crate::from_slice::<ErrorCode>(&bytes).unwrap(), *code);
        }
        for wire in [
            "unknown_verb",
            "unauthorized",
            "bad_args",
            "not_found",
            "duplicate",
            "not_bound",
            "conflict",
            "bind_failed",
            "timeout",
            "cancelled",
            "too_large",
            "overloaded",
            "internal",
        ] {
            assert!(!wire.parse::<ErrorCode>().unwrap().is_app(), "{wire}");
        }
    }

    #[test]
    fn app_codes_follow_the_grammar() {
        assert!(ErrorCode::app("out_of_stock").unwrap().is_app());
        for bad in ["", "Out", "9x", "a-b", "a b", "a\0", "é"] {
            assert!(ErrorCode::app(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            ErrorCode::app(&"a".repeat(MAX_APP_CODE_LEN + 1)),
            Err(IdError::TooLong { .. })
        ));
        assert!(ErrorCode::app(&"a".repeat(MAX_APP_CODE_LEN)).is_ok());
    }

    #[test]
    fn close_codes_round_trip() {
        for code in CloseCode::ALL {
            assert_eq!(CloseCode::from_wire(code.as_str()), Some(code));
        }
        assert_eq!(CloseCode::from_wire("Normal"), None);
    }

    #[test]
    fn messages_are_cut_at_char_boundaries() {
        let body = ErrorBody::new(ErrorCode::Internal, "é".repeat(MAX_MESSAGE_LEN));
        assert_eq!(body.message.len(), MAX_MESSAGE_LEN);
        let odd = format!("a{}", "é".repeat(MAX_MESSAGE_LEN));
        assert_eq!(
            ErrorBody::new(ErrorCode::Internal, odd).message.len(),
            MAX_MESSAGE_LEN - 1
        );
    }
}
