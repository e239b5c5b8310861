//! The stored-hash layout of a Merkle tree and the RFC 6962 / RFC 9162
//! proofs read from it.
//!
//! Every hash of a complete, aligned subtree is stored once, in the order
//! it becomes complete: appending leaf `i` stores its leaf hash, then the
//! hash of each subtree that leaf completes, smallest first. The hash at
//! level `L` covering leaves `[k * 2^L, (k + 1) * 2^L)` is at
//! [`stored_index`]`(L, k)`; a tree of `n` leaves has [`stored_count`]`(n)`
//! stored hashes. A root or a proof of any size is then a combination of
//! `O(log n)` stored hashes.

use crate::hash::{Hash, empty_root, node_hash};

/// The longest proof [`verify_inclusion`] and [`verify_consistency`]
/// accept: a tree of 2^64 leaves needs no more.
pub const MAX_PROOF_LEN: usize = 64;

/// `2n - popcount(n)`, without overflow.
fn count(n: u128) -> u128 {
    2 * n - u128::from(n.count_ones())
}

fn saturate(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// The stored index of the hash at `level` covering leaves
/// `[index * 2^level, (index + 1) * 2^level)`. Saturates at `u64::MAX`
/// for positions no tree of fewer than 2^63 leaves has.
pub fn stored_index(level: u8, index: u64) -> u64 {
    if level >= 64 {
        return u64::MAX;
    }
    // The hash is completed by leaf `m - 1`, stored `level` places after
    // that leaf's own hash.
    let m = (u128::from(index) + 1) << level;
    saturate(count(m - 1) + u128::from(level))
}

/// The number of hashes stored for a tree of `n` leaves: `2n - popcount(n)`.
pub fn stored_count(n: u64) -> u64 {
    saturate(count(u128::from(n)))
}

/// The inverse of [`stored_index`]: the (level, index) of stored hash `i`.
pub fn split_stored_index(i: u64) -> (u8, u64) {
    let i = u128::from(i);
    // The largest leaf count `n` with `count(n) <= i`: hash `i` is stored
    // with leaf `n`. `count(i / 2) <= i`, and `count(n)` grows by at
    // least one per leaf, so this runs at most about 64 times.
    let mut n = i / 2;
    while count(n + 1) <= i {
        n += 1;
    }
    let level = i - count(n);
    // `level <= trailing_ones(n) < 64`; `n < 2^63`.
    (level as u8, saturate(n >> level))
}

/// A store of hashes, answering by stored index.
pub trait HashReader {
    /// The store's error, e.g. a hash that was pruned.
    type Error;

    /// The hashes at `indexes`, in the same order.
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, Self::Error>;
}

/// The error of the slice [`HashReader`]: no hash at this index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stored hash {index} is missing")]
pub struct MissingHash {
    /// The stored index asked for.
    pub index: u64,
}

impl HashReader for [Hash] {
    type Error = MissingHash;

    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, MissingHash> {
        indexes
            .iter()
            .map(|&index| {
                usize::try_from(index)
                    .ok()
                    .and_then(|i| self.get(i))
                    .copied()
                    .ok_or(MissingHash { index })
            })
            .collect()
    }
}

impl HashReader for Vec<Hash> {
    type Error = MissingHash;

    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, MissingHash> {
        self.as_slice().read_hashes(indexes)
    }
}

/// Why a root or a proof could not be produced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError<E> {
    /// The leaf is not in the tree.
    #[error("leaf index {index} is not in a tree of {size} leaves")]
    IndexOutOfRange {
        /// The leaf index asked for.
        index: u64,
        /// The tree size.
        size: u64,
    },
    /// No consistency proof exists between these sizes (`0 < old <= new`).
    #[error("no consistency proof from size {old} to size {new}")]
    BadSizes {
        /// The old tree size.
        old: u64,
        /// The new tree size.
        new: u64,
    },
    /// The reader answered with the wrong number of hashes.
    #[error("the hash reader returned {got} hashes for {wanted} indexes")]
    ShortRead {
        /// The number of indexes asked for.
        wanted: usize,
        /// The number of hashes returned.
        got: usize,
    },
    /// The reader failed.
    #[error("reading stored hashes")]
    Read(#[source] E),
}

/// Why a proof does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The leaf is not in the tree.
    #[error("leaf index {index} is not in a tree of {size} leaves")]
    IndexOutOfRange {
        /// The leaf index.
        index: u64,
        /// The tree size.
        size: u64,
    },
    /// No consistency proof exists between these sizes (`0 < old <= new`).
    #[error("no consistency proof from size {old} to size {new}")]
    BadSizes {
        /// The old tree size.
        old: u64,
        /// The new tree size.
        new: u64,
    },
    /// The proof is longer than [`MAX_PROOF_LEN`].
    #[error("a proof of {len} hashes is longer than any valid proof")]
    TooLong {
        /// The proof's length.
        len: usize,
    },
    /// The proof has the wrong number of hashes for the tree sizes.
    #[error("the proof has the wrong number of hashes for the tree sizes")]
    WrongLength,
    /// The proof does not lead to the given root(s).
    #[error("the proof does not lead to the given root")]
    Mismatch,
}

/// The RFC 6962 hash of a list of subtree roots, left to right, each
/// subtree at least as large as all the ones after it.
fn fold_right(hashes: &[Hash]) -> Hash {
    match hashes.split_last() {
        None => empty_root(),
        Some((last, rest)) => rest.iter().rev().fold(*last, |r, h| node_hash(h, &r)),
    }
}

/// The largest power of two smaller than `len` (`len >= 2`).
fn split_point(len: u64) -> u64 {
    1 << (63 - (len - 1).leading_zeros())
}

/// Appends the stored indexes of the complete aligned subtrees covering
/// leaves `[lo, hi)`, left to right, largest first when `lo` is aligned.
fn cover(mut lo: u64, hi: u64, out: &mut Vec<u64>) {
    while lo < hi {
        let level = lo.trailing_zeros().min(63 - (hi - lo).leading_zeros());
        out.push(stored_index(level as u8, lo >> level));
        lo += 1 << level;
    }
}

fn read<R: HashReader + ?Sized>(r: &R, indexes: &[u64]) -> Result<Vec<Hash>, ProofError<R::Error>> {
    if indexes.is_empty() {
        return Ok(Vec::new());
    }
    let hashes = r.read_hashes(indexes).map_err(ProofError::Read)?;
    if hashes.len() != indexes.len() {
        return Err(ProofError::ShortRead {
            wanted: indexes.len(),
            got: hashes.len(),
        });
    }
    Ok(hashes)
}

/// The hashes of the leaf ranges `ranges`, from one batched read.
fn range_hashes<R: HashReader + ?Sized>(
    ranges: &[(u64, u64)],
    r: &R,
) -> Result<Vec<Hash>, ProofError<R::Error>> {
    let mut indexes = Vec::new();
    let mut ends = Vec::with_capacity(ranges.len());
    for &(lo, hi) in ranges {
        cover(lo, hi, &mut indexes);
        ends.push(indexes.len());
    }
    let hashes = read(r, &indexes)?;
    let mut start = 0;
    Ok(ends
        .into_iter()
        .map(|end| {
            let h = fold_right(&hashes[start..end]);
            start = end;
            h
        })
        .collect())
}

/// The roots of the complete subtrees of a tree, largest first: enough to
/// append leaves and compute the root without reading the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    hashes: Vec<Hash>,
}

impl Frontier {
    /// The frontier of the empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of leaves.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The RFC 6962 root of the tree ([`empty_root`] when empty).
    pub fn root(&self) -> Hash {
        fold_right(&self.hashes)
    }

    /// The subtree roots, largest first: one per set bit of [`Self::size`].
    pub fn hashes(&self) -> &[Hash] {
        &self.hashes
    }

    /// A frontier from its persisted parts, `None` unless there is one hash
    /// per set bit of `size`.
    pub fn from_parts(size: u64, hashes: Vec<Hash>) -> Option<Self> {
        (hashes.len() == size.count_ones() as usize).then_some(Self { size, hashes })
    }

    /// Appends a leaf hash; returns the hashes to store, in stored order:
    /// the leaf hash, then each parent it completes.
    pub fn push(&mut self, leaf: Hash) -> Vec<Hash> {
        let mut stored = Vec::with_capacity(2);
        self.push_with(leaf, |h| stored.push(*h));
        stored
    }

    /// Like [`push`](Self::push), handing each stored hash to `store` in
    /// stored order instead of collecting them (no allocation).
    pub fn push_with(&mut self, leaf: Hash, mut store: impl FnMut(&Hash)) {
        store(&leaf);
        let mut h = leaf;
        let mut size = self.size;
        while size & 1 == 1 {
            let Some(left) = self.hashes.pop() else { break };
            h = node_hash(&left, &h);
            store(&h);
            size >>= 1;
        }
        self.hashes.push(h);
        self.size += 1;
    }

    /// The frontier of the tree of the first `n` leaves in `r`, from one
    /// read of `popcount(n)` stored hashes.
    pub fn from_reader<R: HashReader + ?Sized>(
        n: u64,
        r: &R,
    ) -> Result<Self, ProofError<R::Error>> {
        let mut indexes = Vec::with_capacity(n.count_ones() as usize);
        cover(0, n, &mut indexes);
        Ok(Self {
            size: n,
            hashes: read(r, &indexes)?,
        })
    }
}

/// The RFC 6962 root of the first `n` leaves in `r`.
pub fn tree_hash<R: HashReader + ?Sized>(n: u64, r: &R) -> Result<Hash, ProofError<R::Error>> {
    Ok(Frontier::from_reader(n, r)?.root())
}

/// The RFC 6962 inclusion proof (audit path) of leaf `index` in the tree
/// of the first `n` leaves in `r`, leaf side first.
pub fn inclusion_proof<R: HashReader + ?Sized>(
    index: u64,
    n: u64,
    r: &R,
) -> Result<Vec<Hash>, ProofError<R::Error>> {
    if index >= n {
        return Err(ProofError::IndexOutOfRange { index, size: n });
    }
    // PATH(m, D[lo:hi]), unrolled from the root down.
    let (mut lo, mut hi) = (0, n);
    let mut ranges = Vec::new();
    while hi - lo > 1 {
        let mid = lo + split_point(hi - lo);
        if index < mid {
            ranges.push((mid, hi));
            hi = mid;
        } else {
            ranges.push((lo, mid));
            lo = mid;
        }
    }
    ranges.reverse();
    range_hashes(&ranges, r)
}

/// The RFC 6962 consistency proof from the tree of the first `m` leaves
/// to the tree of the first `n` leaves in `r` (empty when `m == n`).
pub fn consistency_proof<R: HashReader + ?Sized>(
    m: u64,
    n: u64,
    r: &R,
) -> Result<Vec<Hash>, ProofError<R::Error>> {
    if m == 0 || m > n {
        return Err(ProofError::BadSizes { old: m, new: n });
    }
    // SUBPROOF(m, D[lo:hi], whole), unrolled from the root down.
    let (mut lo, mut hi, mut whole) = (0, n, true);
    let mut ranges = Vec::new();
    while m < hi {
        let mid = lo + split_point(hi - lo);
        if m <= mid {
            ranges.push((mid, hi));
            hi = mid;
        } else {
            ranges.push((lo, mid));
            lo = mid;
            whole = false;
        }
    }
    if !whole {
        ranges.push((lo, hi));
    }
    ranges.reverse();
    range_hashes(&ranges, r)
}

/// Right-shifts `fn_` and `sn` until `fn_` is odd or zero.
fn shift_to_odd(fn_: &mut u64, sn: &mut u64) {
    while *fn_ & 1 == 0 && *fn_ != 0 {
        *fn_ >>= 1;
        *sn >>= 1;
    }
}

/// Checks that `proof` proves `leaf` is leaf `index` of the tree of `n`
/// leaves with root `root` (RFC 9162 section 2.1.3.2).
pub fn verify_inclusion(
    index: u64,
    n: u64,
    leaf: &Hash,
    proof: &[Hash],
    root: &Hash,
) -> Result<(), VerifyError> {
    if index >= n {
        return Err(VerifyError::IndexOutOfRange { index, size: n });
    }
    if proof.len() > MAX_PROOF_LEN {
        return Err(VerifyError::TooLong { len: proof.len() });
    }
    let (mut fn_, mut sn) = (index, n - 1);
    let mut r = *leaf;
    for p in proof {
        if sn == 0 {
            return Err(VerifyError::WrongLength);
        }
        if fn_ & 1 == 1 || fn_ == sn {
            r = node_hash(p, &r);
            shift_to_odd(&mut fn_, &mut sn);
        } else {
            r = node_hash(&r, p);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    if sn != 0 {
        return Err(VerifyError::WrongLength);
    }
    if r != *root {
        return Err(VerifyError::Mismatch);
    }
    Ok(())
}

/// Checks that `proof` proves the tree of `n` leaves with root `new_root`
/// extends the tree of `m` leaves with root `old_root` (RFC 9162 section
/// 2.1.4.2; `m == n` needs an empty proof and equal roots).
pub fn verify_consistency(
    m: u64,
    n: u64,
    old_root: &Hash,
    new_root: &Hash,
    proof: &[Hash],
) -> Result<(), VerifyError> {
    if m == 0 || m > n {
        return Err(VerifyError::BadSizes { old: m, new: n });
    }
    if proof.len() > MAX_PROOF_LEN {
        return Err(VerifyError::TooLong { len: proof.len() });
    }
    if m == n {
        if !proof.is_empty() {
            return Err(VerifyError::WrongLength);
        }
        return if old_root == new_root {
            Ok(())
        } else {
            Err(VerifyError::Mismatch)
        };
    }
    // A power-of-two old tree is itself a subtree of the new one: its root
    // starts the path.
    let (first, rest) = match proof.split_first() {
        None => return Err(VerifyError::WrongLength),
        Some(_) if m.is_power_of_two() => (old_root, proof),
        Some((first, rest)) => (first, rest),
    };
    let (mut fn_, mut sn) = (m - 1, n - 1);
    while fn_ & 1 == 1 {
        fn_ >>= 1;
        sn >>= 1;
    }
    let (mut fr, mut sr) = (*first, *first);
    for c in rest {
        if sn == 0 {
            return Err(VerifyError::WrongLength);
        }
        if fn_ & 1 == 1 || fn_ == sn {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            shift_to_odd(&mut fn_, &mut sn);
        } else {
            sr = node_hash(&sr, c);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    if sn != 0 {
        return Err(VerifyError::WrongLength);
    }
    if fr != *old_root || sr != *new_root {
        return Err(VerifyError::Mismatch);
    }
    Ok(())
}
