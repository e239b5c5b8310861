//! One audit entry and its bytes: a CBOR map in the strict profile
//! (definite lengths, shortest heads, keys in length-then-byte order),
//! written here by hand so that the bytes a verifier hashes are exactly
//! the ones WIRE.md 5.6 describes.

use capwire_envelope::NodeId;

/// What an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A decision of the chokepoint on one inbound envelope.
    Call,
    /// A change of the binding.
    Bind,
    /// A grant presented or revoked.
    Grant,
    /// A task's change of state.
    Task,
    /// Entries dropped to keep the log within its budget.
    Prune,
    /// The log was opened (the node started).
    Open,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Call => "call",
            Self::Bind => "bind",
            Self::Grant => "grant",
            Self::Task => "task",
            Self::Prune => "prune",
            Self::Open => "open",
        }
    }
}

/// The authority a call ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum By {
    /// A bootstrap verb: anyone.
    Bootstrap,
    /// The bound control plane, at this binding epoch.
    ControlPlane,
    /// A grant (its revocation id is the entry's `grant`).
    Grant,
}

impl By {
    fn as_str(self) -> &'static str {
        match self {
            Self::Bootstrap => "bootstrap",
            Self::ControlPlane => "control_plane",
            Self::Grant => "grant",
        }
    }
}

/// An entry's fields; what a kind does not use stays `None`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry<'a> {
    pub(crate) kind: Kind,
    pub(crate) by: Option<By>,
    /// BLAKE2s-256 of the envelope's args item.
    pub(crate) args: Option<[u8; 32]>,
    pub(crate) cap: Option<&'a str>,
    pub(crate) req: Option<&'a str>,
    /// The args item itself, where its capability keeps them.
    pub(crate) args_kept: Option<&'a [u8]>,
    pub(crate) peer: Option<&'a NodeId>,
    pub(crate) verb: Option<&'a str>,
    pub(crate) class: Option<&'a str>,
    pub(crate) epoch: Option<u64>,
    pub(crate) grant: Option<&'a str>,
    pub(crate) detail: Option<&'a str>,
    /// A grant's chain of holders, minted-for first.
    pub(crate) holders: Option<&'a [NodeId]>,
    pub(crate) outcome: Option<&'a str>,
}

impl<'a> Entry<'a> {
    /// An entry of `kind` with nothing else.
    pub(crate) fn new(kind: Kind) -> Self {
        Self {
            kind,
            by: None,
            args: None,
            cap: None,
            req: None,
            args_kept: None,
            peer: None,
            verb: None,
            class: None,
            epoch: None,
            grant: None,
            detail: None,
            holders: None,
            outcome: None,
        }
    }

    /// Appends the entry's bytes, as entry `index` made at `time_ms`.
    pub(crate) fn encode(&self, index: u64, time_ms: u64, out: &mut Vec<u8>) {
        let fields = 3
            + usize::from(self.by.is_some())
            + usize::from(self.args.is_some())
            + usize::from(self.cap.is_some())
            + usize::from(self.req.is_some())
            + usize::from(self.args_kept.is_some())
            + usize::from(self.peer.is_some())
            + usize::from(self.verb.is_some())
            + usize::from(self.class.is_some())
            + usize::from(self.epoch.is_some())
            + usize::from(self.grant.is_some())
            + usize::from(self.detail.is_some())
            + usize::from(self.holders.is_some())
            + usize::from(self.outcome.is_some());
        head(out, 5, fields as u64);
        text(out, "i");
        head(out, 0, index);
        text(out, "k");
        text(out, self.kind.as_str());
        text(out, "t");
        head(out, 0, time_ms);
        if let Some(by) = self.by {
            text(out, "by");
            text(out, by.as_str());
        }
        if let Some(a) = &self.args {
            text(out, "arg");
            bytes(out, a);
        }
        if let Some(v) = self.cap {
            text(out, "cap");
            text(out, v);
        }
        if let Some(v) = self.req {
            text(out, "req");
            text(out, v);
        }
        if let Some(a) = self.args_kept {
            // The args item as received (strict CBOR, validated).
            text(out, "args");
            out.extend_from_slice(a);
        }
        if let Some(p) = self.peer {
            text(out, "peer");
            bytes(out, p.as_bytes());
        }
        if let Some(v) = self.verb {
            text(out, "verb");
            text(out, v);
        }
        if let Some(v) = self.class {
            text(out, "class");
            text(out, v);
        }
        if let Some(e) = self.epoch {
            text(out, "epoch");
            head(out, 0, e);
        }
        if let Some(v) = self.grant {
            text(out, "grant");
            text(out, v);
        }
        if let Some(v) = self.detail {
            text(out, "detail");
            text(out, v);
        }
        if let Some(h) = self.holders {
            text(out, "holders");
            head(out, 4, h.len() as u64);
            for id in h {
                bytes(out, id.as_bytes());
            }
        }
        if let Some(v) = self.outcome {
            text(out, "outcome");
            text(out, v);
        }
    }
}

/// A CBOR head: major type `major`, argument `n`, shortest form.
fn head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    match n {
        0..=23 => out.push(m | n as u8),
        24..=0xff => out.extend_from_slice(&[m | 24, n as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(m | 26);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

fn text(out: &mut Vec<u8>, s: &str) {
    head(out, 3, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    head(out, 2, b.len() as u64);
    out.extend_from_slice(b);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_a_strict_cbor_map_with_its_keys_in_order() {
        let peer = NodeId::from_bytes([7; 32]);
        let mut e = Entry::new(Kind::Call);
        e.by = Some(By::ControlPlane);
        e.args = Some([1; 32]);
        e.cap = Some("app.echo");
        e.req = Some("r1");
        e.args_kept = Some(&[0x82, 0x01, 0x61, b'x']);
        e.peer = Some(&peer);
        e.verb = Some("say");
        e.class = Some("controller");
        e.epoch = Some(300);
        e.grant = Some("ab");
        e.detail = Some("d");
        let chain = [peer, NodeId::from_bytes([8; 32])];
        e.holders = Some(&chain);
        e.outcome = Some("ok");
        let mut out = Vec::new();
        e.encode(70_000, 1_700_000_000_000, &mut out);
        let value: ciborium::Value = ciborium::from_reader(out.as_slice()).unwrap();
        let map = value.as_map().unwrap();
        let keys: Vec<&str> = map.iter().map(|(k, _)| k.as_text().unwrap()).collect();
        assert_eq!(
            keys,
            [
                "i", "k", "t", "by", "arg", "cap", "req", "args", "peer", "verb", "class", "epoch",
                "grant", "detail", "holders", "outcome"
            ]
        );
        let mut sorted = keys.clone();
        sorted.sort_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)));
        assert_eq!(keys, sorted, "length-then-byte order");
        // The envelope crate's strict decoder takes it (canonical form).
        capwire_envelope::RawValue::from_slice(&out).unwrap();
        assert_eq!(
            out[..4],
            [0xb0, 0x61, b'i', 0x1a],
            "16 keys; i = 70000 in 4 bytes"
        );
    }
}
