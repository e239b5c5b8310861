//! Grants: delegated rights to a node's controller verbs, as biscuit
//! tokens (WIRE.md 5.5).
//!
//! The bound control plane mints a token with its grant key; the token
//! names the node it is for, the binding it was minted under, the verbs
//! it grants, its expiry and its holder. A holder narrows a token by
//! appending a block of checks, and hands it to another holder with a
//! block signed by its own grant key ([`delegate`]). A node verifies a
//! presented token with nothing but the control plane's grant key, kept
//! with the binding ([`verify`]), and then asks the verified token about
//! one (cap, verb) at a time ([`Verified::allows`]).
//!
//! Everything here is pure: the time is an argument, nothing is read or
//! written.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use capwire_authz::{GrantDenied, GrantKey, GrantSpec, Right, Narrowing, mint, narrow, verify};
//! use capwire_envelope::NodeId;
//!
//! let control_plane = GrantKey::from_secret(&[1; 32]);
//! let worker = GrantKey::from_secret(&[2; 32]);
//! let (node, worker_id) = (NodeId::from_bytes([7; 32]), NodeId::from_bytes([8; 32]));
//! let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
//!
//! let token = mint(&control_plane, &GrantSpec {
//!     node,
//!     epoch: 3,
//!     holder: worker_id,
//!     holder_key: worker.public(),
//!     rights: vec![Right::verb("core.configuration", "set_config")],
//!     expires: now + Duration::from_secs(600),
//! })?;
//!
//! let verified = verify(&token, &control_plane.public(), &node, 3, &worker_id, now, |_| false)
//!     .expect("the holder presents a token minted for it");
//! assert!(verified.allows("core.configuration", "set_config", now).is_ok());
//! assert_eq!(
//!     verified.allows("core.cluster", "remove", now).unwrap_err(),
//!     GrantDenied::NotGranted,
//! );
//! assert_eq!(
//!     verified.allows("core.configuration", "set_config", now + Duration::from_secs(601)).unwrap_err(),
//!     GrantDenied::Expired,
//! );
//!
//! // Anyone else presenting it is refused.
//! let thief = NodeId::from_bytes([9; 32]);
//! let stolen = verify(&token, &control_plane.public(), &node, 3, &thief, now, |_| false);
//! assert_eq!(stolen.unwrap_err(), GrantDenied::WrongHolder);
//!
//! // A narrower copy: shorter expiry.
//! let shorter = narrow(&token, &Narrowing { verbs: None, expires: Some(now + Duration::from_secs(60)) })?;
//! let v = verify(&shorter, &control_plane.public(), &node, 3, &worker_id, now, |_| false).unwrap();
//! assert_eq!(
//!     v.allows("core.configuration", "set_config", now + Duration::from_secs(61)).unwrap_err(),
//!     GrantDenied::Expired,
//! );
//! # Ok::<(), capwire_authz::GrantError>(())
//! ```

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use biscuit_auth::builder::{
    Algorithm, AuthorizerBuilder, Binary, BiscuitBuilder, BlockBuilder, Check, CheckKind, Op, Rule,
    Term,
};
use biscuit_auth::error::{Format, Logic, Token};
use biscuit_auth::{AuthorizerLimits, Biscuit, KeyPair, PrivateKey, PublicKey, UnverifiedBiscuit};
use blake2::Blake2sMac256;
use blake2::digest::{KeyInit, Mac};
use capwire_envelope::NodeId;
use zeroize::Zeroizing;

/// Longest token accepted, in characters of its base64url text.
pub const GRANT_MAX_TOKEN: usize = 8192;
/// Most blocks in a token: the control plane's and seven more.
pub const GRANT_MAX_BLOCKS: usize = 8;
/// Longest a token may be valid for, from the time it is presented (its
/// authority block's expiry). Revocations do not depend on it: a node
/// keeps each one for as long as the binding it was made under lasts.
pub const GRANT_MAX_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// The verbs no grant can carry, whatever the token says: unbinding
/// the control plane, and the grants capability's own controller verbs.
pub fn never_granted(cap: &str, verb: &str) -> bool {
    matches!((cap, verb), ("core.monitoring", "bind" | "disable")) || cap == "core.grants"
}

/// Bounds on one evaluation of a token's logic. The shape of the blocks
/// after the authority block ([`shape`]: no rules, small checks) bounds
/// the work; facts and rounds bound it again; the time is only a
/// backstop, generous so that a thread kept off the CPU on a loaded
/// machine does not refuse an honest token (a refusal for cost is not
/// cached either).
fn limits() -> AuthorizerLimits {
    AuthorizerLimits {
        max_facts: 256,
        max_iterations: 32,
        max_time: Duration::from_secs(1),
    }
}

/// Why a grant does not let a call through. Each has a stable label
/// ([`GrantDenied::as_str`]) that a denied call's message and the
/// counters carry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GrantDenied {
    /// The token is not a well-formed capwire grant (base64, biscuit
    /// format, the authority block's facts, too long, too many blocks).
    BadToken(&'static str),
    /// A signature does not verify, or the token was not minted by the
    /// bound control plane's grant key.
    BadSignature,
    /// The token names another node.
    ForAnotherNode,
    /// The token was minted under an earlier binding: a bind or unbind
    /// since voids every earlier token.
    BindingChanged,
    /// The sender is not the token's holder.
    WrongHolder,
    /// Past the token's expiry (or an attenuation's).
    Expired,
    /// A block of the token has been revoked.
    Revoked,
    /// The token does not grant this verb (or an attenuation took it
    /// away, or it can never be granted).
    NotGranted,
    /// The token's logic went past the evaluation bounds.
    TooCostly,
    /// The node has no grant key for its control plane (not bound, or
    /// bound by a control plane that does not mint grants).
    NoGrantKey,
    /// The token is valid for longer than [`GRANT_MAX_LIFETIME`].
    TooLong,
}

impl GrantDenied {
    /// A stable label, e.g. `"expired"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::BadToken(_) => "bad_token",
            Self::BadSignature => "bad_signature",
            Self::ForAnotherNode => "for_another_node",
            Self::BindingChanged => "binding_changed",
            Self::WrongHolder => "wrong_holder",
            Self::Expired => "expired",
            Self::Revoked => "revoked",
            Self::NotGranted => "not_granted",
            Self::TooCostly => "too_costly",
            Self::NoGrantKey => "no_grant_key",
            Self::TooLong => "too_long",
        }
    }
}

impl GrantDenied {
    /// The label of a call refused for this reason: `grant_` and
    /// [`as_str`](GrantDenied::as_str), e.g. `"grant_expired"`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::BadToken(_) => "grant_bad_token",
            Self::BadSignature => "grant_bad_signature",
            Self::ForAnotherNode => "grant_for_another_node",
            Self::BindingChanged => "grant_binding_changed",
            Self::WrongHolder => "grant_wrong_holder",
            Self::Expired => "grant_expired",
            Self::Revoked => "grant_revoked",
            Self::NotGranted => "grant_not_granted",
            Self::TooCostly => "grant_too_costly",
            Self::NoGrantKey => "grant_no_grant_key",
            Self::TooLong => "grant_too_long",
        }
    }
}

impl fmt::Display for GrantDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadToken(why) => write!(f, "not a capwire grant: {why}"),
            Self::BadSignature => f.write_str("the token's signature does not verify"),
            Self::ForAnotherNode => f.write_str("the token is for another node"),
            Self::BindingChanged => f.write_str("the token was minted under an earlier binding"),
            Self::WrongHolder => f.write_str("the sender is not the token's holder"),
            Self::Expired => f.write_str("the token has expired"),
            Self::Revoked => f.write_str("the token has been revoked"),
            Self::NotGranted => f.write_str("the token does not grant this verb"),
            Self::TooCostly => f.write_str("the token's checks went past the evaluation bounds"),
            Self::NoGrantKey => f.write_str("the node has no grant key for its control plane"),
            Self::TooLong => f.write_str("the token is valid for longer than 30 days"),
        }
    }
}

impl std::error::Error for GrantDenied {}

/// An error making a token (minting, narrowing, delegating).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// The token given to narrow or delegate does not decode.
    #[error("not a capwire grant: {0}")]
    BadToken(String),
    /// The grant names no verb.
    #[error("a grant names at least one verb")]
    NoRights,
    /// The grant names a verb no grant may carry.
    #[error("{0} can never be granted")]
    NeverGranted(String),
    /// The token would be longer than [`GRANT_MAX_TOKEN`] or have more
    /// than [`GRANT_MAX_BLOCKS`] blocks.
    #[error("the token would be too large")]
    TooLarge,
    /// The biscuit library refused.
    #[error("token: {0}")]
    Token(String),
}

impl From<Token> for GrantError {
    fn from(e: Token) -> Self {
        Self::Token(e.to_string())
    }
}

/// A node's grant key: the Ed25519 key it signs tokens (and delegation
/// blocks) with, derived from its X25519 identity secret, so it needs no
/// storage of its own. Its public half is advertised in the manifest
/// (`core.grants` params, WIRE.md 5.5).
pub struct GrantKey(KeyPair);

impl GrantKey {
    /// The grant key of the identity whose X25519 secret is `secret`:
    /// the Ed25519 seed is BLAKE2s-256 keyed with the secret over
    /// `"capwire grant key v1"`.
    pub fn from_secret(secret: &[u8; 32]) -> Self {
        let mut mac = <Blake2sMac256 as KeyInit>::new_from_slice(secret)
            .expect("a 32-byte key is a valid BLAKE2s key");
        mac.update(b"capwire grant key v1");
        let seed = Zeroizing::new(<[u8; 32]>::from(mac.finalize().into_bytes()));
        let private = PrivateKey::from_bytes(&seed[..], Algorithm::Ed25519)
            .expect("any 32 bytes are an Ed25519 seed");
        Self(KeyPair::from(&private))
    }

    /// The public half.
    pub fn public(&self) -> GrantPublicKey {
        let bytes = self.0.public().to_bytes();
        let mut out = [0; 32];
        out.copy_from_slice(&bytes[..32]);
        GrantPublicKey(out)
    }
}

impl fmt::Debug for GrantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("GrantKey").field(&self.public()).finish()
    }
}

/// The public half of a [`GrantKey`]: 32 bytes, written
/// `ed25519/<64 lowercase hex digits>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrantPublicKey([u8; 32]);

impl GrantPublicKey {
    /// From its 32 bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Its 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    fn biscuit(&self) -> Option<PublicKey> {
        PublicKey::from_bytes(&self.0, Algorithm::Ed25519).ok()
    }

    fn hex(&self) -> String {
        hex(&self.0)
    }
}

impl fmt::Display for GrantPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ed25519/{}", self.hex())
    }
}

impl fmt::Debug for GrantPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The text of a grant public key is not `ed25519/` and 64 lowercase hex
/// digits of a valid Ed25519 point.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a grant key is ed25519/ and 64 lowercase hexadecimal digits")]
pub struct BadGrantKey;

impl FromStr for GrantPublicKey {
    type Err = BadGrantKey;

    fn from_str(s: &str) -> Result<Self, BadGrantKey> {
        let digits = s.strip_prefix("ed25519/").ok_or(BadGrantKey)?;
        let bytes = base16ct::lower::decode_vec(digits).map_err(|_| BadGrantKey)?;
        let key = Self(bytes.try_into().map_err(|_| BadGrantKey)?);
        key.biscuit().ok_or(BadGrantKey)?;
        Ok(key)
    }
}

fn hex(bytes: &[u8]) -> String {
    base16ct::lower::encode_string(bytes)
}

/// One right a grant carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Right {
    /// Exactly this verb.
    Verb {
        /// The capability.
        cap: String,
        /// The verb.
        verb: String,
    },
    /// Every controller verb of this capability (but those no grant may
    /// carry).
    Cap {
        /// The capability.
        cap: String,
    },
}

impl Right {
    /// Exactly `cap`/`verb`.
    pub fn verb(cap: &str, verb: &str) -> Self {
        Self::Verb {
            cap: cap.into(),
            verb: verb.into(),
        }
    }

    /// Every controller verb of `cap`.
    pub fn cap(cap: &str) -> Self {
        Self::Cap { cap: cap.into() }
    }
}

impl fmt::Display for Right {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Verb { cap, verb } => write!(f, "{cap}/{verb}"),
            Self::Cap { cap } => write!(f, "{cap}/*"),
        }
    }
}

/// What the control plane grants, to mint with [`mint`].
#[derive(Debug, Clone)]
pub struct GrantSpec {
    /// The node whose verbs are granted.
    pub node: NodeId,
    /// The node's binding epoch the token is minted under
    /// (`core.grants/info`).
    pub epoch: u64,
    /// Who may use the token.
    pub holder: NodeId,
    /// The holder's grant public key (its `core.grants` params), which
    /// signs the block that hands the token on.
    pub holder_key: GrantPublicKey,
    /// The verbs granted.
    pub rights: Vec<Right>,
    /// When the token stops being valid.
    pub expires: SystemTime,
}

fn params(pairs: &[(&str, Term)]) -> HashMap<String, Term> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn str_term(s: &str) -> Term {
    Term::Str(s.to_owned())
}

fn date_term(t: SystemTime) -> Term {
    Term::Date(
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    )
}

/// A token's text, if it is within the bounds a node accepts.
fn within_bounds(blocks: usize, text: Result<String, Token>) -> Result<String, GrantError> {
    let text = text?;
    if blocks > GRANT_MAX_BLOCKS || text.len() > GRANT_MAX_TOKEN {
        return Err(GrantError::TooLarge);
    }
    Ok(text)
}

fn checked(token: &Biscuit) -> Result<String, GrantError> {
    within_bounds(token.block_count(), token.to_base64())
}

/// Mints a token: the authority block, signed with the control plane's
/// grant key. Returns its base64url text.
///
/// # Errors
/// [`GrantError::NoRights`], [`GrantError::NeverGranted`] for a verb no
/// grant may carry, [`GrantError::TooLarge`].
pub fn mint(key: &GrantKey, spec: &GrantSpec) -> Result<String, GrantError> {
    if spec.rights.is_empty() {
        return Err(GrantError::NoRights);
    }
    let mut b = BiscuitBuilder::new().code_with_params(
        "capwire_grant(1); node({node}); binding({epoch}); holder({holder}, {key}); \
         check if time($t), $t <= {expires};",
        params(&[
            ("node", str_term(&spec.node.to_string())),
            (
                "epoch",
                Term::Integer(i64::try_from(spec.epoch).unwrap_or(i64::MAX)),
            ),
            ("holder", str_term(&spec.holder.to_string())),
            ("key", Term::Bytes(spec.holder_key.0.to_vec())),
            ("expires", date_term(spec.expires)),
        ]),
        HashMap::new(),
    )?;
    for right in &spec.rights {
        b = match right {
            Right::Verb { cap, verb } => {
                if never_granted(cap, verb) {
                    return Err(GrantError::NeverGranted(right.to_string()));
                }
                b.code_with_params(
                    "right({cap}, {verb});",
                    params(&[("cap", str_term(cap)), ("verb", str_term(verb))]),
                    HashMap::new(),
                )?
            }
            Right::Cap { cap } => {
                if cap == "core.grants" {
                    return Err(GrantError::NeverGranted(right.to_string()));
                }
                b.code_with_params(
                    "right_cap({cap});",
                    params(&[("cap", str_term(cap))]),
                    HashMap::new(),
                )?
            }
        };
    }
    checked(&b.build(&key.0)?)
}

/// How a copy of a token is narrowed: only these verbs (among those it
/// already grants), no later than this.
#[derive(Debug, Clone, Default)]
pub struct Narrowing {
    /// Only these (cap, verb) pairs; `None` keeps the verbs.
    pub verbs: Option<Vec<(String, String)>>,
    /// A new, earlier expiry; `None` keeps it.
    pub expires: Option<SystemTime>,
}

fn narrowing_block(n: &Narrowing) -> Result<BlockBuilder, GrantError> {
    let mut b = BlockBuilder::new();
    if let Some(verbs) = &n.verbs {
        if verbs.is_empty() {
            return Err(GrantError::NoRights);
        }
        let set: BTreeSet<Term> = verbs
            .iter()
            .map(|(c, v)| str_term(&format!("{c}/{v}")))
            .collect();
        b = b.code_with_params(
            "check if operation_name($o), {verbs}.contains($o);",
            params(&[("verbs", Term::Set(set))]),
            HashMap::new(),
        )?;
    }
    if let Some(t) = n.expires {
        b = b.code_with_params(
            "check if time($t), $t <= {expires};",
            params(&[("expires", date_term(t))]),
            HashMap::new(),
        )?;
    }
    Ok(b)
}

fn unverified(token: &str) -> Result<UnverifiedBiscuit, GrantError> {
    if token.len() > GRANT_MAX_TOKEN {
        return Err(GrantError::TooLarge);
    }
    UnverifiedBiscuit::from_base64(token).map_err(|e| GrantError::BadToken(e.to_string()))
}

fn unverified_text(token: &UnverifiedBiscuit) -> Result<String, GrantError> {
    within_bounds(token.block_count(), token.to_base64())
}

/// A narrower copy of `token` for the same holder: a block of checks
/// anyone holding the token can append. It can only take rights away.
///
/// # Errors
/// [`GrantError::BadToken`], [`GrantError::NoRights`] for an empty verb
/// list, [`GrantError::TooLarge`].
pub fn narrow(token: &str, narrowing: &Narrowing) -> Result<String, GrantError> {
    let t = unverified(token)?;
    let t = t.append(narrowing_block(narrowing)?)?;
    unverified_text(&t)
}

/// Hands `token` on to another holder, narrowed: a block signed by the
/// current holder's grant key, naming the new holder and its key. Only
/// the current holder can do this, so a stolen token cannot be handed
/// to the thief.
///
/// # Errors
/// As [`narrow`].
pub fn delegate(
    token: &str,
    holder_key: &GrantKey,
    to: &NodeId,
    to_key: &GrantPublicKey,
    narrowing: &Narrowing,
) -> Result<String, GrantError> {
    let t = unverified(token)?;
    let block = narrowing_block(narrowing)?.code_with_params(
        "delegate({holder}, {key});",
        params(&[
            ("holder", str_term(&to.to_string())),
            ("key", Term::Bytes(to_key.0.to_vec())),
        ]),
        HashMap::new(),
    )?;
    let request = t.third_party_request()?;
    let signed = request.create_block(&holder_key.0.private(), block)?;
    let t = t.append_third_party(&signed.serialize()?)?;
    unverified_text(&t)
}

/// The revocation ids of a token's blocks, as lowercase hex, without
/// verifying it: to revoke a token, revoke one of them (its first
/// revokes it and every copy made from it).
///
/// # Errors
/// [`GrantError::BadToken`].
pub fn revocation_ids(token: &str) -> Result<Vec<String>, GrantError> {
    Ok(unverified(token)?
        .revocation_identifiers()
        .iter()
        .map(|id| hex(id))
        .collect())
}

/// A token that verified for its holder: ask it about each verb with
/// [`Verified::allows`].
pub struct Verified {
    token: Biscuit,
    holder: NodeId,
    /// The holders the token went through, the one it was minted for
    /// first and the presenter last.
    holders: Vec<NodeId>,
    epoch: u64,
    revocation_ids: Vec<Vec<u8>>,
    /// The earliest expiry any block sets.
    expires: SystemTime,
    /// The authority block's expiry: no copy of the token lasts longer.
    lifetime_end: SystemTime,
    dates: Vec<SystemTime>,
}

impl fmt::Debug for Verified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verified")
            .field("holder", &self.holder)
            .field("epoch", &self.epoch)
            .field("blocks", &self.revocation_ids.len())
            .finish()
    }
}

fn catch<T>(f: impl FnOnce() -> Result<T, GrantDenied>) -> Result<T, GrantDenied> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(Err(GrantDenied::BadToken("malformed logic")))
}

fn logic(e: &Token) -> GrantDenied {
    match e {
        Token::RunLimit(_) => GrantDenied::TooCostly,
        Token::FailedLogic(Logic::Unauthorized { checks, .. })
        | Token::FailedLogic(Logic::NoMatchingPolicy { checks }) => {
            if checks.iter().any(|c| c.to_string().contains("time(")) {
                GrantDenied::Expired
            } else {
                GrantDenied::NotGranted
            }
        }
        Token::FailedLogic(Logic::InvalidBlockRule(..)) => GrantDenied::BadToken("invalid rule"),
        _ => GrantDenied::BadToken("evaluation failed"),
    }
}

fn parse_node(s: &str) -> Result<NodeId, GrantDenied> {
    s.parse()
        .map_err(|_| GrantDenied::BadToken("a node id is not 64 hex digits"))
}

fn one<T>(mut v: Vec<T>, what: &'static str) -> Result<T, GrantDenied> {
    if v.len() != 1 {
        return Err(GrantDenied::BadToken(what));
    }
    v.pop().ok_or(GrantDenied::BadToken(what))
}

fn walk_dates(term: &Term, out: &mut Vec<SystemTime>) {
    match term {
        Term::Date(d) => out.push(SystemTime::UNIX_EPOCH + Duration::from_secs(*d)),
        Term::Set(s) => s.iter().for_each(|t| walk_dates(t, out)),
        Term::Array(a) => a.iter().for_each(|t| walk_dates(t, out)),
        Term::Map(m) => m.values().for_each(|t| walk_dates(t, out)),
        _ => {}
    }
}

fn walk_ops(ops: &[Op], out: &mut Vec<SystemTime>) {
    for op in ops {
        match op {
            Op::Value(t) => walk_dates(t, out),
            Op::Closure(_, inner) => walk_ops(inner, out),
            _ => {}
        }
    }
}

fn walk_rule(rule: &Rule, out: &mut Vec<SystemTime>) {
    for p in std::iter::once(&rule.head).chain(&rule.body) {
        p.terms.iter().for_each(|t| walk_dates(t, out));
    }
    for e in &rule.expressions {
        walk_ops(&e.ops, out);
    }
}

/// Verifies a presented token for `sender`, as node `node` under binding
/// `epoch`, whose control plane's grant key is `root`: the signatures,
/// the authority block's facts, the holder chain, the revocations
/// (`revoked` says whether a revocation id is revoked) and the lifetime.
/// The verbs are asked one at a time with [`Verified::allows`].
///
/// # Errors
/// The [`GrantDenied`] reason.
pub fn verify(
    token: &str,
    root: &GrantPublicKey,
    node: &NodeId,
    epoch: u64,
    sender: &NodeId,
    now: SystemTime,
    revoked: impl Fn(&[u8]) -> bool,
) -> Result<Verified, GrantDenied> {
    catch(|| verify_inner(token, root, node, epoch, sender, now, &revoked))
}

fn verify_inner(
    token: &str,
    root: &GrantPublicKey,
    node: &NodeId,
    epoch: u64,
    sender: &NodeId,
    now: SystemTime,
    revoked: &dyn Fn(&[u8]) -> bool,
) -> Result<Verified, GrantDenied> {
    if token.len() > GRANT_MAX_TOKEN {
        return Err(GrantDenied::BadToken("longer than 8192 characters"));
    }
    let root = root.biscuit().ok_or(GrantDenied::NoGrantKey)?;
    let token = match Biscuit::from_base64(token, root) {
        Ok(t) => t,
        Err(Token::Format(Format::Signature(_) | Format::UnknownPublicKey)) => {
            return Err(GrantDenied::BadSignature);
        }
        Err(Token::Base64(_)) => return Err(GrantDenied::BadToken("not base64url")),
        Err(_) => return Err(GrantDenied::BadToken("not a biscuit token")),
    };
    if token.block_count() > GRANT_MAX_BLOCKS {
        return Err(GrantDenied::BadToken("more than 8 blocks"));
    }
    let lifetime_end = authority_shape(&token)?;
    shape(&token)?;
    let revocation_ids = token.revocation_identifiers();
    if revocation_ids.iter().any(|id| revoked(id)) {
        return Err(GrantDenied::Revoked);
    }

    let mut authorizer = AuthorizerBuilder::new()
        .set_limits(limits())
        .build(&token)
        .map_err(|e| logic(&e))?;
    let version: Vec<(i64,)> = authorizer
        .query("v($v) <- capwire_grant($v)")
        .map_err(|e| logic(&e))?;
    if one(version, "no capwire_grant(1) fact")?.0 != 1 {
        return Err(GrantDenied::BadToken("an unknown grant format"));
    }
    let named: Vec<(String,)> = authorizer
        .query("n($n) <- node($n)")
        .map_err(|e| logic(&e))?;
    if parse_node(&one(named, "not one node fact")?.0)? != *node {
        return Err(GrantDenied::ForAnotherNode);
    }
    let minted: Vec<(i64,)> = authorizer
        .query("e($e) <- binding($e)")
        .map_err(|e| logic(&e))?;
    if u64::try_from(one(minted, "not one binding fact")?.0).ok() != Some(epoch) {
        return Err(GrantDenied::BindingChanged);
    }
    let first: Vec<(String, Vec<u8>)> = authorizer
        .query("h($h, $k) <- holder($h, $k)")
        .map_err(|e| logic(&e))?;
    let (mut holder, mut key) = one(first, "not one holder fact")?;
    let mut holders = vec![parse_node(&holder)?];

    // The holder chain: each block signed by another key must be signed
    // by the holder of the moment, and names the next holder.
    let mut seen = Vec::new();
    for external in token.external_public_keys().iter().skip(1) {
        let Some(external) = external else { continue };
        let bytes = external.to_bytes();
        if bytes != key || seen.contains(&bytes) {
            return Err(GrantDenied::WrongHolder);
        }
        let rule = format!(
            "d($h, $k) <- delegate($h, $k) trusting ed25519/{}",
            hex(&bytes)
        );
        let next: Vec<(String, Vec<u8>)> =
            authorizer.query(rule.as_str()).map_err(|e| logic(&e))?;
        let (h, k) = one(next, "a delegation block names not one holder")?;
        if GrantPublicKey(
            k.as_slice()
                .try_into()
                .map_err(|_| GrantDenied::BadToken("a key is 32 bytes"))?,
        )
        .biscuit()
        .is_none()
        {
            return Err(GrantDenied::BadToken("a holder key is not an Ed25519 key"));
        }
        seen.push(bytes);
        holders.push(parse_node(&h)?);
        holder = h;
        key = k;
    }
    if parse_node(&holder)? != *sender {
        return Err(GrantDenied::WrongHolder);
    }

    // Every date the token's logic names: a verb's answer can change only
    // there, so an answer holds until the next one.
    let (facts, rules, checks, _) = authorizer.dump();
    let mut dates = Vec::new();
    for f in &facts {
        f.predicate
            .terms
            .iter()
            .for_each(|t| walk_dates(t, &mut dates));
    }
    for r in &rules {
        walk_rule(r, &mut dates);
    }
    for c in &checks {
        c.queries.iter().for_each(|r| walk_rule(r, &mut dates));
    }
    dates.sort();
    dates.dedup();

    // The authority block's expiry bounds every copy of the token; a
    // later block may set an earlier one, and the earliest is when the
    // token stops letting anything through.
    let expires = checks
        .iter()
        .filter_map(expiry_of)
        .min()
        .unwrap_or(lifetime_end)
        .min(lifetime_end);
    if lifetime_end > now + GRANT_MAX_LIFETIME {
        return Err(GrantDenied::TooLong);
    }
    // Dates are whole seconds: valid through the second it names.
    if now >= expires + Duration::from_secs(1) {
        return Err(GrantDenied::Expired);
    }
    Ok(Verified {
        token,
        holder: *sender,
        holders,
        epoch,
        revocation_ids,
        expires,
        lifetime_end,
        dates,
    })
}

/// The date `D` of a check `check if time($t), $t <= D` (one query, one
/// `time` predicate, one comparison): an expiry. Other checks may refuse
/// a call for other reasons, but never set when the token ends.
fn expiry_of(check: &Check) -> Option<SystemTime> {
    if check.kind != CheckKind::One {
        return None;
    }
    let [query] = check.queries.as_slice() else {
        return None;
    };
    let [time] = query.body.as_slice() else {
        return None;
    };
    let [Term::Variable(var)] = time.terms.as_slice() else {
        return None;
    };
    let [expression] = query.expressions.as_slice() else {
        return None;
    };
    match expression.ops.as_slice() {
        [
            Op::Value(Term::Variable(v)),
            Op::Value(Term::Date(d)),
            Op::Binary(Binary::LessOrEqual),
        ] if time.name == "time" && v == var => {
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(*d))
        }
        _ => None,
    }
}

/// The facts the authority block holds, by name and arity: exactly one
/// of each of the first four, and at least one right.
const AUTHORITY_FACTS: [(&str, usize); 6] = [
    ("capwire_grant", 1),
    ("node", 1),
    ("binding", 1),
    ("holder", 2),
    ("right", 2),
    ("right_cap", 1),
];

/// Checks that the authority block holds exactly what a capwire grant
/// holds (WIRE.md 5.5): its facts, at least one right, no rule, and one
/// check, the expiry; returns that expiry.
fn authority_shape(token: &Biscuit) -> Result<SystemTime, GrantDenied> {
    let source = token
        .print_block_source(0)
        .map_err(|_| GrantDenied::BadToken("the authority block does not print"))?;
    let block = BlockBuilder::new()
        .code(&source)
        .map_err(|_| GrantDenied::BadToken("the authority block does not parse"))?;
    if !block.rules.is_empty() || !block.scopes.is_empty() {
        return Err(GrantDenied::BadToken(
            "the authority block holds a rule or a scope",
        ));
    }
    let mut rights = 0;
    for fact in &block.facts {
        let p = &fact.predicate;
        if !AUTHORITY_FACTS.contains(&(p.name.as_str(), p.terms.len())) {
            return Err(GrantDenied::BadToken(
                "the authority block holds a fact a grant does not",
            ));
        }
        if p.name.starts_with("right") {
            if !p.terms.iter().all(|t| matches!(t, Term::Str(_))) {
                return Err(GrantDenied::BadToken("a right names something not a text"));
            }
            rights += 1;
        }
    }
    if rights == 0 {
        return Err(GrantDenied::BadToken("the token grants no right"));
    }
    let [check] = block.checks.as_slice() else {
        return Err(GrantDenied::BadToken(
            "the authority block holds other than one check",
        ));
    };
    if !check.queries.iter().all(|q| q.scopes.is_empty()) {
        return Err(GrantDenied::BadToken("the expiry check has a scope"));
    }
    expiry_of(check).ok_or(GrantDenied::BadToken(
        "the authority block's check is not an expiry",
    ))
}

/// What a block after the authority block may hold: checks, and the one
/// fact of a hand-over, so that evaluating them is cheap whatever they
/// say (a rule, or a check joining many predicates, could cost more
/// than any bound within one round of evaluation).
const MAX_BLOCK_FACTS: usize = 2;
const MAX_BLOCK_CHECKS: usize = 8;
const MAX_CHECK_QUERIES: usize = 4;
const MAX_QUERY_PREDICATES: usize = 2;
const MAX_QUERY_OPS: usize = 32;

fn shape(token: &Biscuit) -> Result<(), GrantDenied> {
    for i in 1..token.block_count() {
        let source = token
            .print_block_source(i)
            .map_err(|_| GrantDenied::BadToken("a block does not print"))?;
        let block = BlockBuilder::new()
            .code(&source)
            .map_err(|_| GrantDenied::BadToken("a block does not parse"))?;
        if !block.rules.is_empty() {
            return Err(GrantDenied::BadToken("a narrowing block holds a rule"));
        }
        if block.facts.len() > MAX_BLOCK_FACTS || block.checks.len() > MAX_BLOCK_CHECKS {
            return Err(GrantDenied::BadToken("a narrowing block holds too much"));
        }
        for check in &block.checks {
            if check.queries.len() > MAX_CHECK_QUERIES {
                return Err(GrantDenied::BadToken("a check has too many alternatives"));
            }
            for q in &check.queries {
                let ops: usize = q.expressions.iter().map(|e| e.ops.len()).sum();
                if q.body.len() > MAX_QUERY_PREDICATES || ops > MAX_QUERY_OPS {
                    return Err(GrantDenied::BadToken("a check is too complex"));
                }
            }
        }
    }
    Ok(())
}

impl Verified {
    /// The holders the token went through: the one the control plane
    /// minted it for first, then each one a holder handed it on to; the
    /// last is the presenter.
    pub fn holders(&self) -> &[NodeId] {
        &self.holders
    }

    /// The revocation id of each block.
    pub fn revocation_ids(&self) -> &[Vec<u8>] {
        &self.revocation_ids
    }

    /// The first block's revocation id as lowercase hex: the token's name
    /// in monitoring copies and denials.
    pub fn id(&self) -> String {
        self.revocation_ids
            .first()
            .map_or_else(String::new, |id| hex(id))
    }

    /// The binding epoch the token is for.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// When the token stops letting anything through: the earliest expiry
    /// any of its blocks sets (valid through that second).
    pub fn expires(&self) -> SystemTime {
        self.expires
    }

    /// The authority block's expiry: no copy of the token, however it was
    /// narrowed, is valid after that second.
    pub fn lifetime_end(&self) -> SystemTime {
        self.lifetime_end
    }

    /// The first time after `now` at which an answer of
    /// [`allows`](Verified::allows) may change. The token's logic sees
    /// the time in whole seconds, so an answer can change only where the
    /// second reaches a date the token names (`D`) or passes it (`D` plus
    /// one second): an answer given within a token's last second changes
    /// when that second ends, not later.
    pub fn next_change(&self, now: SystemTime) -> Option<SystemTime> {
        let second = Duration::from_secs(1);
        let floor = SystemTime::UNIX_EPOCH
            + Duration::from_secs(
                now.duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            );
        self.dates
            .iter()
            .flat_map(|d| [*d, *d + second])
            .filter(|b| *b > floor)
            .min()
    }

    /// Whether the token lets its holder call `cap`/`verb` at `now`.
    ///
    /// # Errors
    /// [`GrantDenied::NotGranted`], [`GrantDenied::Expired`],
    /// [`GrantDenied::TooCostly`].
    pub fn allows(&self, cap: &str, verb: &str, now: SystemTime) -> Result<(), GrantDenied> {
        if never_granted(cap, verb) {
            return Err(GrantDenied::NotGranted);
        }
        catch(|| {
            let mut authorizer = AuthorizerBuilder::new()
                .set_limits(limits())
                .code_with_params(
                    "time({now}); operation({cap}, {verb}); operation_name({name}); \
                     allow if operation($c, $v), right($c, $v); \
                     allow if operation($c, $v), right_cap($c);",
                    params(&[
                        ("now", date_term(now)),
                        ("cap", str_term(cap)),
                        ("verb", str_term(verb)),
                        ("name", str_term(&format!("{cap}/{verb}"))),
                    ]),
                    HashMap::new(),
                )
                .map_err(|_| GrantDenied::BadToken("a name is not a datalog string"))?
                .build(&self.token)
                .map_err(|e| logic(&e))?;
            authorizer
                .authorize_with_limits(limits())
                .map(|_| ())
                .map_err(|e| logic(&e))
        })
    }
}
