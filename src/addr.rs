//! Addresses a node listens on or dials: TCP or Unix sockets.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// Where a node listens or where a contact can be reached.
///
/// Text form: `tcp://HOST:PORT` (or a bare `HOST:PORT`) and `unix:PATH`.
///
/// ```
/// use capwire::Addr;
/// let a: Addr = "tcp://127.0.0.1:7000".parse().unwrap();
/// assert_eq!(a.to_string(), "tcp://127.0.0.1:7000");
/// let u: Addr = "unix:/run/capwire.sock".parse().unwrap();
/// assert_eq!(u.to_string(), "unix:/run/capwire.sock");
/// assert!("ftp://x".parse::<Addr>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Addr {
    /// A TCP socket address.
    Tcp(SocketAddr),
    /// A Unix domain socket path.
    Unix(PathBuf),
}

/// An address that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address {input:?}: expected tcp://HOST:PORT or unix:PATH")]
pub struct AddrParseError {
    input: String,
}

impl FromStr for Addr {
    type Err = AddrParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || AddrParseError {
            input: s.chars().take(256).collect(),
        };
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(err());
            }
            return Ok(Addr::Unix(PathBuf::from(path)));
        }
        let host = s.strip_prefix("tcp://").unwrap_or(s);
        host.parse::<SocketAddr>().map(Addr::Tcp).map_err(|_| err())
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Tcp(a) => write!(f, "tcp://{a}"),
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl From<SocketAddr> for Addr {
    fn from(a: SocketAddr) -> Self {
        Addr::Tcp(a)
    }
}
