//! The invite: what a control plane needs to reach and bind a node, in
//! one copy-pasteable text form.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use capwire_envelope::NodeId;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode, percent_encode};

use crate::addr::Addr;

/// The scheme every invite starts with.
const SCHEME: &str = "capwire://";
/// Longest invite text accepted, in bytes.
pub const MAX_INVITE_LEN: usize = 4096;

/// What a control plane needs to bind a node: its key, where it listens,
/// and the one-time bind code (absent when no bind is open: such an invite
/// lets a peer connect, not bind).
///
/// Text form (`Display` / `FromStr`), one line without spaces:
///
/// ```text
/// capwire://NODE_ID@ADDR[,ADDR...][#CODE]
/// ```
///
/// `NODE_ID` is the 64 hex digits of the key; each `ADDR` is `HOST:PORT`
/// (an IPv6 host in brackets; `tcp://HOST:PORT` is read too) or
/// `unix:PATH` with the path's bytes outside
/// `A-Z a-z 0-9 - . _ ~ /` percent-encoded; `CODE` is the 10-character bind
/// code.
///
/// ```
/// use capwire::Invite;
/// let text = "capwire://0101010101010101010101010101010101010101010101010101010101010101\
///             @127.0.0.1:7000,unix:/run/a%20b.sock#K7M2Q9XW4P";
/// let invite: Invite = text.parse()?;
/// assert_eq!(invite.addrs.len(), 2);
/// assert_eq!(invite.addrs[1].to_string(), "unix:/run/a b.sock");
/// assert_eq!(invite.code.as_deref(), Some("K7M2Q9XW4P"));
/// assert_eq!(invite.to_string(), text);
/// // The code never shows in Debug output.
/// assert!(!format!("{invite:?}").contains("K7M2Q9XW4P"));
/// # Ok::<(), capwire::InviteParseError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Invite {
    /// The node's identity.
    pub node_id: NodeId,
    /// Where it listens.
    pub addrs: Vec<Addr>,
    /// The bind code, while a bind is open.
    pub code: Option<String>,
}

impl fmt::Debug for Invite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Invite")
            .field("node_id", &self.node_id)
            .field("addrs", &self.addrs)
            .field("code", &self.code.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Why a text is not an invite.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InviteParseError {
    /// It does not start with `capwire://`.
    #[error("an invite starts with capwire://")]
    Scheme,
    /// It is longer than [`MAX_INVITE_LEN`].
    #[error("an invite is at most {MAX_INVITE_LEN} bytes")]
    TooLong,
    /// The node id is not 64 hex digits.
    #[error("bad node id in invite: {0}")]
    NodeId(String),
    /// An address does not parse.
    #[error("bad address in invite: {0:?}")]
    Addr(String),
    /// The code is not a bind code.
    #[error("bad bind code in invite")]
    Code,
}

/// The bytes of a Unix socket path that stand for themselves in an
/// invite (WIRE.md 3.4): `A-Z a-z 0-9 - . _ ~ /`; every other byte is
/// percent-encoded.
const PATH_ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// Whether `b` stands for itself in an invite's path.
fn keep(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/')
}

fn write_addr(f: &mut fmt::Formatter<'_>, addr: &Addr) -> fmt::Result {
    match addr {
        Addr::Tcp(sa) => write!(f, "{sa}"),
        Addr::Unix(path) => {
            // percent-encoding writes its `%XX` in upper case, as the
            // invite's writer must.
            let bytes = path.as_os_str().as_encoded_bytes();
            write!(f, "unix:{}", percent_encode(bytes, PATH_ESCAPED))
        }
    }
}

impl fmt::Display for Invite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}@", self.node_id)?;
        for (i, addr) in self.addrs.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write_addr(f, addr)?;
        }
        if let Some(code) = &self.code {
            write!(f, "#{code}")?;
        }
        Ok(())
    }
}

fn parse_unix(text: &str) -> Option<PathBuf> {
    // percent-encoding decodes leniently (a raw byte outside the set, or
    // a `%` without two hex digits, passes through as it is); the invite's
    // rules refuse both, so the text is checked first.
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let digits = bytes.get(i + 1..i + 3)?;
                if !digits.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                i += 3;
            }
            b if keep(b) => i += 1,
            _ => return None,
        }
    }
    let out: Vec<u8> = percent_decode(bytes).collect();
    if out.is_empty() {
        return None;
    }
    // Paths are bytes on Unix; elsewhere only UTF-8 paths round-trip.
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        Some(PathBuf::from(std::ffi::OsString::from_vec(out)))
    }
    #[cfg(not(unix))]
    {
        String::from_utf8(out).ok().map(PathBuf::from)
    }
}

fn parse_addr(text: &str) -> Result<Addr, InviteParseError> {
    let bad = || InviteParseError::Addr(text.chars().take(256).collect());
    if let Some(path) = text.strip_prefix("unix:") {
        return parse_unix(path).map(Addr::Unix).ok_or_else(bad);
    }
    let host = text.strip_prefix("tcp://").unwrap_or(text);
    host.parse::<SocketAddr>().map(Addr::Tcp).map_err(|_| bad())
}

impl FromStr for Invite {
    type Err = InviteParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.len() > MAX_INVITE_LEN {
            return Err(InviteParseError::TooLong);
        }
        let rest = s.strip_prefix(SCHEME).ok_or(InviteParseError::Scheme)?;
        let (rest, code) = match rest.split_once('#') {
            Some((rest, code)) => (rest, Some(code)),
            None => (rest, None),
        };
        let (id, addrs) = rest.split_once('@').unwrap_or((rest, ""));
        let node_id = NodeId::try_from(id).map_err(|e| InviteParseError::NodeId(e.to_string()))?;
        let addrs = if addrs.is_empty() {
            Vec::new()
        } else {
            addrs.split(',').map(parse_addr).collect::<Result<_, _>>()?
        };
        let code = match code {
            Some(c) => Some(
                capwire_authz::BindCode::parse(c)
                    .map_err(|_| InviteParseError::Code)?
                    .expose()
                    .to_owned(),
            ),
            None => None,
        };
        Ok(Invite {
            node_id,
            addrs,
            code,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> NodeId {
        NodeId::from_bytes([0xab; 32])
    }

    #[test]
    fn round_trips_every_address_kind() {
        let invite = Invite {
            node_id: id(),
            addrs: vec![
                "127.0.0.1:7000".parse().unwrap(),
                "[::1]:9".parse().unwrap(),
                Addr::Unix(PathBuf::from("/tmp/odd ,#@%name.sock")),
            ],
            code: Some("K7M2Q9XW4P".into()),
        };
        let text = invite.to_string();
        assert!(!text.contains(' '), "{text}");
        assert_eq!(text.parse::<Invite>().unwrap(), invite);
        let bare = Invite {
            node_id: id(),
            addrs: vec![],
            code: None,
        };
        assert_eq!(bare.to_string().parse::<Invite>().unwrap(), bare);
    }

    #[test]
    fn the_reader_keeps_the_bytes_the_writer_keeps() {
        for b in 0..=255u8 {
            let written = percent_encode(&[b], PATH_ESCAPED).to_string();
            assert_eq!(
                written == char::from(b).to_string(),
                keep(b),
                "byte {b:#04x}"
            );
            if !keep(b) {
                assert_eq!(written, format!("%{b:02X}"), "upper case");
            }
        }
    }

    #[test]
    fn paths_follow_the_escaping_rules() {
        let parse = |path: &str| format!("capwire://{}@unix:{path}", id()).parse::<Invite>();
        let path = |invite: Invite| match &invite.addrs[..] {
            [Addr::Unix(p)] => p.clone(),
            other => panic!("one unix address expected: {other:?}"),
        };
        assert_eq!(path(parse("/a%2cb%2C").unwrap()), PathBuf::from("/a,b,"));
        assert_eq!(path(parse("/%C3%A9").unwrap()), PathBuf::from("/\u{e9}"));
        let invite = Invite {
            node_id: id(),
            addrs: vec![Addr::Unix(PathBuf::from("/x y\u{e9}:%"))],
            code: None,
        };
        assert!(
            invite.to_string().ends_with("@unix:/x%20y%C3%A9%3A%25"),
            "{invite}"
        );
        for bad in ["/a b", "/a:b", "/%", "/%2", "/%2g", "/%%41", "", "/\u{e9}"] {
            assert!(parse(bad).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn refuses_what_is_not_an_invite() {
        let good = format!("capwire://{}@127.0.0.1:1#K7M2Q9XW4P", id());
        assert!(good.parse::<Invite>().is_ok());
        for (text, want) in [
            (
                good.replace("capwire://", "http://"),
                InviteParseError::Scheme,
            ),
            (
                good.replace("abab", "zz"),
                InviteParseError::NodeId(String::new()),
            ),
            (
                good.replace("127.0.0.1:1", "nowhere"),
                InviteParseError::Addr(String::new()),
            ),
            (good.replace("K7M2Q9XW4P", "k7m2"), InviteParseError::Code),
            (
                format!("capwire://{}@unix:/a%zz", id()),
                InviteParseError::Addr(String::new()),
            ),
            (
                "capwire://".to_owned() + &"a".repeat(5000),
                InviteParseError::TooLong,
            ),
        ] {
            let got = text.parse::<Invite>().unwrap_err();
            assert_eq!(
                std::mem::discriminant(&got),
                std::mem::discriminant(&want),
                "{text:.80}: {got}"
            );
        }
    }
}
