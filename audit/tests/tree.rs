//! Merkle tree: known answers and a brute-force cross-check against a
//! naive RFC 6962 section 2.1 implementation.

#![allow(clippy::unwrap_used)]

use std::cell::Cell;

use capwire_audit::*;

fn h(s: &str) -> Hash {
    let mut out = [0; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

/// The RFC 6962 test tree of the Certificate Transparency implementations.
fn test_leaves() -> Vec<Vec<u8>> {
    let hex = [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ];
    hex.iter()
        .map(|s| {
            (0..s.len() / 2)
                .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
                .collect()
        })
        .collect()
}

fn k(n: usize) -> usize {
    let mut k = 1;
    while 2 * k < n {
        k *= 2;
    }
    k
}

/// MTH, over leaf hashes.
fn mth(d: &[Hash]) -> Hash {
    match d.len() {
        0 => empty_root(),
        1 => d[0],
        n => node_hash(&mth(&d[..k(n)]), &mth(&d[k(n)..])),
    }
}

/// PATH(m, D), with each sibling's side (true: right).
fn path(m: usize, d: &[Hash]) -> Vec<(Hash, bool)> {
    let n = d.len();
    if n <= 1 {
        return vec![];
    }
    let k = k(n);
    let (mut p, s) = if m < k {
        (path(m, &d[..k]), (mth(&d[k..]), true))
    } else {
        (path(m - k, &d[k..]), (mth(&d[..k]), false))
    };
    p.push(s);
    p
}

/// SUBPROOF(m, D, b), each hash tagged with how the verifier uses it.
fn subproof(m: usize, d: &[Hash], b: bool) -> Vec<(Hash, char)> {
    let n = d.len();
    if m == n {
        return if b { vec![] } else { vec![(mth(d), 's')] };
    }
    let k = k(n);
    let (mut p, s) = if m <= k {
        (subproof(m, &d[..k], b), (mth(&d[k..]), 'r'))
    } else {
        (subproof(m - k, &d[k..], false), (mth(&d[..k]), 'l'))
    };
    p.push(s);
    p
}

fn hashes<T: Copy>(p: &[(Hash, T)]) -> Vec<Hash> {
    p.iter().map(|x| x.0).collect()
}

fn shape<T: Copy>(p: &[(Hash, T)]) -> Vec<T> {
    p.iter().map(|x| x.1).collect()
}

fn leaves(n: usize) -> Vec<Hash> {
    (0..n)
        .map(|i| leaf_hash(&(i as u32).to_be_bytes()))
        .collect()
}

/// The store and frontier of `d`, built by pushing.
fn build(d: &[Hash]) -> (Vec<Hash>, Frontier) {
    let (mut store, mut f) = (Vec::new(), Frontier::new());
    for l in d {
        store.extend(f.push(*l));
    }
    (store, f)
}

#[test]
fn known_answers() {
    let roots = [
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    ];
    assert_eq!(
        empty_root(),
        h("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    );
    let d: Vec<Hash> = test_leaves().iter().map(|l| leaf_hash(l)).collect();
    let (store, f) = build(&d);
    assert_eq!(f.root(), h(roots[7]));
    for (n, root) in (1..=8).zip(roots) {
        assert_eq!(tree_hash(n, &store).unwrap(), h(root), "size {n}");
        assert_eq!(mth(&d[..n as usize]), h(root));
    }
    let hs = |v: &[&str]| v.iter().map(|s| h(s)).collect::<Vec<_>>();
    let (a, b, c) = (
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    );
    let (x, y, z) = (
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    );
    assert_eq!(inclusion_proof(0, 8, &store).unwrap(), hs(&[a, b, c]));
    assert_eq!(inclusion_proof(5, 8, &store).unwrap(), hs(&[x, y, z]));
    assert_eq!(inclusion_proof(2, 3, &store).unwrap(), hs(&[roots[1]]));
    assert_eq!(consistency_proof(1, 8, &store).unwrap(), hs(&[a, b, c]));
    let w = "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a";
    assert_eq!(consistency_proof(6, 8, &store).unwrap(), hs(&[w, y, z]));
    assert_eq!(consistency_proof(2, 5, &store).unwrap(), hs(&[b, x]));
}

#[test]
fn stored_layout() {
    assert_eq!(
        (0..8).map(|k| stored_index(0, k)).collect::<Vec<_>>(),
        [0, 1, 3, 4, 7, 8, 10, 11]
    );
    assert_eq!(
        [
            stored_index(1, 0),
            stored_index(1, 1),
            stored_index(2, 0),
            stored_index(3, 0)
        ],
        [2, 5, 6, 14]
    );
    assert_eq!(
        (0..9).map(stored_count).collect::<Vec<_>>(),
        [0, 1, 3, 4, 7, 8, 10, 11, 15]
    );
    for i in (0..5000).chain(u64::MAX - 5000..=u64::MAX) {
        let (level, k) = split_stored_index(i);
        assert_eq!(stored_index(level, k), i, "{i}");
    }
    assert_eq!(stored_index(64, 0), u64::MAX);
    assert_eq!(stored_count(u64::MAX), u64::MAX);
}

#[test]
fn push_and_rebuild_match_the_naive_layout() {
    let all = leaves(70);
    let (store, _) = build(&all);
    for n in 0..=70usize {
        let d = &all[..n];
        let (prefix, f) = build(d);
        assert_eq!(prefix[..], store[..prefix.len()]);
        assert_eq!(prefix.len() as u64, stored_count(n as u64));
        assert_eq!(f.root(), mth(d));
        assert_eq!(tree_hash(n as u64, &store).unwrap(), mth(d));
        for level in 0..7u8 {
            for k in 0..(n >> level) {
                let i = stored_index(level, k as u64) as usize;
                assert_eq!(prefix[i], mth(&d[k << level..(k + 1) << level]));
                assert_eq!(split_stored_index(i as u64), (level, k as u64));
            }
        }
        assert_eq!(Frontier::from_reader(n as u64, &store).unwrap(), f);
        assert_eq!(
            Frontier::from_parts(f.size(), f.hashes().to_vec()),
            Some(f.clone())
        );
        assert_eq!(
            Frontier::from_parts(2 * f.size() + 1, f.hashes().to_vec()),
            None
        );
    }
}

fn flip(p: &[Hash], i: usize) -> Vec<Hash> {
    let mut p = p.to_vec();
    p[i][i % 32] ^= 1;
    p
}

#[test]
fn inclusion_matches_naive_for_every_index() {
    let all = leaves(140);
    let (store, _) = build(&all);
    for n in 1..=70usize {
        let root = mth(&all[..n]);
        for i in 0..n {
            let naive = path(i, &all[..n]);
            let proof = inclusion_proof(i as u64, n as u64, &store).unwrap();
            assert_eq!(proof, hashes(&naive), "{i} of {n}");
            let v = |i: usize, n: usize, leaf: &Hash, p: &[Hash]| {
                verify_inclusion(i as u64, n as u64, leaf, p, &root)
            };
            assert_eq!(v(i, n, &all[i], &proof), Ok(()));
            assert!(v(i, n, &all[i + 1], &proof).is_err());
            for j in 0..proof.len() {
                assert_eq!(
                    v(i, n, &all[i], &flip(&proof, j)),
                    Err(VerifyError::Mismatch)
                );
            }
            if let Some((_, short)) = proof.split_last() {
                assert!(v(i, n, &all[i], short).is_err());
            }
            assert!(v(i, n, &all[i], &[proof.clone(), vec![root]].concat()).is_err());
            // The size is bound by the checkpoint, not by the proof: a size
            // whose path has the same shape computes the same root.
            for m in [n - 1, n + 1, 2 * n] {
                let same = i < m && shape(&path(i, &all[..m])) == shape(&naive);
                assert_eq!(v(i, m, &all[i], &proof).is_ok(), same, "{i} of {n} as {m}");
            }
        }
    }
}

#[test]
fn consistency_matches_naive_for_every_size() {
    let all = leaves(72);
    let (store, _) = build(&all);
    for n in 1..=70usize {
        let new = mth(&all[..n]);
        for m in 1..=n {
            let old = mth(&all[..m]);
            let naive = subproof(m, &all[..n], true);
            let proof = consistency_proof(m as u64, n as u64, &store).unwrap();
            assert_eq!(proof, hashes(&naive), "{m} to {n}");
            let v = |m: usize, n: usize, o: &Hash, p: &[Hash]| {
                verify_consistency(m as u64, n as u64, o, &new, p)
            };
            assert_eq!(v(m, n, &old, &proof), Ok(()));
            let (mut bad_old, mut bad_new) = (old, new);
            bad_old[m % 32] ^= 1;
            bad_new[n % 32] ^= 1;
            assert_eq!(v(m, n, &bad_old, &proof), Err(VerifyError::Mismatch));
            assert!(verify_consistency(m as u64, n as u64, &old, &bad_new, &proof).is_err());
            for j in 0..proof.len() {
                assert!(v(m, n, &old, &flip(&proof, j)).is_err());
            }
            if let Some((_, short)) = proof.split_last() {
                assert!(v(m, n, &old, short).is_err());
            }
            assert!(v(m, n, &old, &[proof.clone(), vec![old]].concat()).is_err());
            for (m2, n2) in [(m - 1, n), (m + 1, n), (m, n + 1), (m, n - 1)] {
                let same = 0 < m2 && m2 <= n2 && m2.is_power_of_two() == m.is_power_of_two() && {
                    let other = subproof(m2, &all[..n2], true);
                    (m2 == n2) == (m == n) && shape(&other) == shape(&naive)
                };
                assert_eq!(
                    v(m2, n2, &old, &proof).is_ok(),
                    same,
                    "{m} to {n} as {m2} to {n2}"
                );
            }
        }
    }
}

#[test]
fn bad_arguments_are_typed_errors() {
    let (store, _) = build(&leaves(5));
    assert_eq!(
        inclusion_proof(5, 5, &store),
        Err(ProofError::IndexOutOfRange { index: 5, size: 5 })
    );
    assert_eq!(
        consistency_proof(0, 5, &store),
        Err(ProofError::BadSizes { old: 0, new: 5 })
    );
    assert_eq!(
        consistency_proof(6, 5, &store),
        Err(ProofError::BadSizes { old: 6, new: 5 })
    );
    assert_eq!(consistency_proof(5, 5, &store), Ok(vec![]));
    let (r, l) = (empty_root(), leaf_hash(b""));
    assert_eq!(
        verify_inclusion(3, 3, &l, &[], &r),
        Err(VerifyError::IndexOutOfRange { index: 3, size: 3 })
    );
    assert_eq!(
        verify_inclusion(0, 1, &l, &[l; 65], &l),
        Err(VerifyError::TooLong { len: 65 })
    );
    assert_eq!(
        verify_consistency(0, 3, &r, &r, &[]),
        Err(VerifyError::BadSizes { old: 0, new: 3 })
    );
    assert_eq!(
        verify_consistency(4, 3, &r, &r, &[]),
        Err(VerifyError::BadSizes { old: 4, new: 3 })
    );
    assert_eq!(
        verify_consistency(3, 4, &r, &l, &[]),
        Err(VerifyError::WrongLength)
    );
    assert_eq!(
        verify_consistency(3, 3, &r, &l, &[]),
        Err(VerifyError::Mismatch)
    );
    assert_eq!(
        verify_consistency(3, 3, &r, &r, &[r]),
        Err(VerifyError::WrongLength)
    );
    assert_eq!(
        verify_consistency(1, 9, &r, &r, &[r; 65]),
        Err(VerifyError::TooLong { len: 65 })
    );
    let big = |len: usize| verify_inclusion(u64::MAX - 1, u64::MAX, &l, &vec![l; len], &r);
    assert_eq!(
        (big(62), big(63), big(64)),
        (
            Err(VerifyError::WrongLength),
            Err(VerifyError::Mismatch),
            Err(VerifyError::WrongLength)
        )
    );
}

/// A store refusing some indexes, counting reads.
struct Store<'a> {
    hashes: &'a [Hash],
    refuse: fn(u64) -> bool,
    calls: Cell<usize>,
}

impl HashReader for Store<'_> {
    type Error = MissingHash;
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, MissingHash> {
        self.calls.set(self.calls.get() + 1);
        match indexes.iter().find(|&&i| (self.refuse)(i)) {
            Some(&index) => Err(MissingHash { index }),
            None => self.hashes.read_hashes(indexes),
        }
    }
}

#[test]
fn reader_errors_are_returned() {
    let (hashes, _) = build(&leaves(50));
    let s = Store {
        hashes: &hashes,
        refuse: |i| i >= 60,
        calls: Cell::new(0),
    };
    assert!(matches!(
        inclusion_proof(3, 50, &s),
        Err(ProofError::Read(MissingHash { .. }))
    ));
    assert!(matches!(
        consistency_proof(3, 50, &s),
        Err(ProofError::Read(_))
    ));
    assert!(matches!(tree_hash(50, &s), Err(ProofError::Read(_))));
    assert_eq!(
        inclusion_proof(3, 60, &hashes[..]),
        Err(ProofError::Read(MissingHash {
            index: stored_index(3, 6)
        }))
    );
    assert!(Frontier::from_reader(51, &hashes).is_err());
    struct Short;
    impl HashReader for Short {
        type Error = ();
        fn read_hashes(&self, _: &[u64]) -> Result<Vec<Hash>, ()> {
            Ok(vec![[0; 32]])
        }
    }
    assert_eq!(
        inclusion_proof(0, 7, &Short),
        Err(ProofError::ShortRead { wanted: 4, got: 1 })
    );
}

/// A huge store answering every index below its size with a made-up hash.
struct Huge(u64, Cell<(usize, usize)>);

impl HashReader for Huge {
    type Error = MissingHash;
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, MissingHash> {
        let (calls, total) = self.1.get();
        self.1.set((calls + 1, total + indexes.len()));
        indexes
            .iter()
            .map(|&index| {
                if index < stored_count(self.0) {
                    Ok(leaf_hash(&index.to_be_bytes()))
                } else {
                    Err(MissingHash { index })
                }
            })
            .collect()
    }
}

#[test]
fn proofs_read_few_hashes_in_one_batch() {
    let n = 1_000_000_000_007;
    for (i, m) in [
        (0, 1),
        (n / 3, n / 2),
        (n - 1, n - 1),
        (1 << 39, (1 << 39) + 1),
    ] {
        let r = Huge(n, Cell::new((0, 0)));
        assert!(inclusion_proof(i, n, &r).unwrap().len() <= 41);
        assert!(consistency_proof(m, n, &r).unwrap().len() <= 82);
        tree_hash(n, &r).unwrap();
        let (calls, total) = r.1.get();
        assert_eq!(calls, 3);
        assert!(total <= 3 * 2 * 41, "{total}");
    }
}
