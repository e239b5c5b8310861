//! The fixed parameters of the bind ceremony: how long a pending bind
//! lasts, how many wrong codes it takes, and what a bind code looks like.
//!
//! A leaf: it imports nothing from the crate, so the error type can name
//! the bind-code format without depending on the ceremony.

use std::time::Duration;

/// How long a pending bind lasts.
pub const BIND_TTL: Duration = Duration::from_secs(300);
/// Wrong codes allowed per pending bind; the last one clears it.
pub const BIND_MAX_ATTEMPTS: u8 = 3;
/// Characters in a bind code.
pub const BIND_CODE_LEN: usize = 10;
/// The 32 characters a bind code is made of: digits and capital letters
/// without `0`, `1`, `I` and `O`, which people confuse.
pub const BIND_CODE_ALPHABET: &str = "23456789ABCDEFGHJKLMNPQRSTUVWXYZ";
