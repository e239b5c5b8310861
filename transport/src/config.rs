//! Limits and timers of the tokio driver.

use std::time::Duration;

use crate::error::TransportError;

/// Limits and timers for an [`Endpoint`](crate::Endpoint) and its
/// connections. Start from [`TransportConfig::default`] and change fields.
///
/// ```
/// use std::time::Duration;
/// use capwire_transport::TransportConfig;
/// let mut config = TransportConfig::default();
/// config.idle_timeout = Duration::from_secs(30);
/// config.keepalive_interval = Duration::from_secs(10);
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TransportConfig {
    /// Largest record sent or accepted, in bytes. Default 16 MiB. Both
    /// sides should agree: a larger record from the peer ends the session.
    pub max_record_size: usize,
    /// Deadline for the whole handshake, from the first byte written or
    /// expected to the last. Default 10 s.
    pub handshake_timeout: Duration,
    /// Deadline for the responder to receive all of handshake message 1,
    /// counted from the start of the handshake; a silent or dribbling
    /// socket is dropped after it with [`TransportError::HandshakeTimeout`].
    /// Must be positive and at most `handshake_timeout`. Default 3 s.
    pub first_message_timeout: Duration,
    /// A session that receives no complete message for this long ends with
    /// [`TransportError::IdleTimeout`]. Default 60 s.
    pub idle_timeout: Duration,
    /// When nothing has been sent for this long, a keepalive message is
    /// sent. Must be shorter than `idle_timeout`. Default 15 s.
    pub keepalive_interval: Duration,
    /// A connection whose stream accepts none of the bytes it is writing
    /// (records, keepalives, flush, the close record) for this long ends
    /// with [`TransportError::WriteTimeout`]; it also bounds
    /// [`RecordSender::close`](crate::RecordSender::close). Must be positive.
    /// Default 30 s.
    pub write_timeout: Duration,
    /// Most inbound handshakes in progress at once per endpoint; `accept`
    /// fails fast beyond it. Default 64.
    pub max_concurrent_handshakes: usize,
    /// Replace the sending key (Noise `REKEY`) after this many messages, and
    /// tell the peer in band. `None` (the default) never rekeys.
    pub rekey_after_messages: Option<u64>,
    /// Records that may wait in a connection's send queue before `send`
    /// waits (and `try_send` fails). Default 1024.
    pub send_queue_depth: usize,
    /// Batches of received records (one batch per read from the stream, at
    /// most a few hundred KiB) that may wait for `recv` before the reader
    /// stops reading. Default 16.
    pub recv_queue_depth: usize,
    /// Start every connection's nonce counters here (both directions). Both
    /// peers must use the same value.
    #[cfg(feature = "test-hooks")]
    pub start_nonce_for_testing: u64,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            max_record_size: 16 * 1024 * 1024,
            handshake_timeout: Duration::from_secs(10),
            first_message_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(60),
            keepalive_interval: Duration::from_secs(15),
            write_timeout: Duration::from_secs(30),
            max_concurrent_handshakes: 64,
            rekey_after_messages: None,
            send_queue_depth: 1024,
            recv_queue_depth: 16,
            #[cfg(feature = "test-hooks")]
            start_nonce_for_testing: 0,
        }
    }
}

impl TransportConfig {
    /// Checks that the values can work together.
    ///
    /// # Errors
    /// [`TransportError::InvalidConfig`] naming the first problem.
    pub fn validate(&self) -> Result<(), TransportError> {
        let problem = if self.handshake_timeout.is_zero() {
            "handshake_timeout must be positive"
        } else if self.first_message_timeout.is_zero()
            || self.first_message_timeout > self.handshake_timeout
        {
            "first_message_timeout must be positive and at most handshake_timeout"
        } else if self.write_timeout.is_zero() {
            "write_timeout must be positive"
        } else if self.idle_timeout.is_zero() {
            "idle_timeout must be positive"
        } else if self.keepalive_interval.is_zero() || self.keepalive_interval >= self.idle_timeout
        {
            "keepalive_interval must be positive and shorter than idle_timeout"
        } else if self.max_concurrent_handshakes == 0 {
            "max_concurrent_handshakes must be at least 1"
        } else if self.send_queue_depth == 0 || self.recv_queue_depth == 0 {
            "queue depths must be at least 1"
        } else if u32::try_from(self.max_record_size).is_err() {
            "max_record_size must fit in 32 bits"
        } else if self.rekey_after_messages == Some(0) {
            "rekey_after_messages must be at least 1"
        } else {
            return Ok(());
        };
        Err(TransportError::InvalidConfig(problem))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_nonsense_is_not() {
        assert!(TransportConfig::default().validate().is_ok());
        let c = TransportConfig {
            keepalive_interval: Duration::from_secs(60),
            ..TransportConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(TransportError::InvalidConfig(_))
        ));
        let c = TransportConfig {
            send_queue_depth: 0,
            ..TransportConfig::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn deadlines_must_be_positive_and_ordered() {
        let bad = [
            TransportConfig {
                first_message_timeout: Duration::ZERO,
                ..TransportConfig::default()
            },
            TransportConfig {
                first_message_timeout: Duration::from_secs(11),
                ..TransportConfig::default()
            },
            TransportConfig {
                write_timeout: Duration::ZERO,
                ..TransportConfig::default()
            },
        ];
        for c in bad {
            assert!(matches!(
                c.validate(),
                Err(TransportError::InvalidConfig(_))
            ));
        }
        let edge = TransportConfig {
            first_message_timeout: Duration::from_secs(10),
            ..TransportConfig::default()
        };
        assert!(
            edge.validate().is_ok(),
            "equal to handshake_timeout is fine"
        );
    }
}
