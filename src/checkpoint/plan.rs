//! What every layout's import plan is made of: the rule for each native parameter, the
//! checkpoint tensors (and shapes) it expects, checked all at once; and the shape readers
//! the layouts share (depth from the block numbering, image side from the token count).

use std::collections::{BTreeMap, BTreeSet};

use crate::checkpoint::file::Checkpoint;
use crate::checkpoint::spatial::StoredSpatial;
use crate::checkpoint::{ImportHints, Rule};
use crate::error::{Error, Result};

/// Rules plus the checkpoint shapes they expect.
pub(super) struct Plan<'c> {
    ck: &'c Checkpoint,
    rules: BTreeMap<String, Rule>,
    expect: Vec<(String, Vec<usize>)>,
}

impl<'c> Plan<'c> {
    pub(super) fn new(ck: &'c Checkpoint) -> Self {
        Plan {
            ck,
            rules: BTreeMap::new(),
            expect: Vec::new(),
        }
    }
    pub(super) fn same(&mut self, native: &str, key: &str, shape: &[usize]) {
        self.rules.insert(native.into(), Rule::Same(key.into()));
        self.expect.push((key.into(), shape.to_vec()));
    }
    /// PyTorch `Linear.weight [out, in]` → native `[in, out]`.
    pub(super) fn linear(&mut self, native: &str, key: &str, out: usize, inp: usize) {
        self.rules
            .insert(native.into(), Rule::Transposed(key.into()));
        self.expect.push((key.into(), vec![out, inp]));
    }
    pub(super) fn norm(&mut self, native: &str, key: &str, width: usize) {
        self.same(
            &format!("{native}.weight"),
            &format!("{key}.weight"),
            &[width],
        );
        self.same(&format!("{native}.bias"), &format!("{key}.bias"), &[width]);
    }
    pub(super) fn spatial(&mut self, native: &str, stored: StoredSpatial, shapes: Vec<Vec<usize>>) {
        for (key, shape) in stored.keys().into_iter().zip(shapes) {
            self.expect.push((key, shape));
        }
        self.rules.insert(native.into(), Rule::Spatial(stored));
    }
    /// Checks every expected tensor exists with its shape.
    pub(super) fn finish(self) -> Result<BTreeMap<String, Rule>> {
        let missing: Vec<String> = self
            .expect
            .iter()
            .filter(|(k, _)| !self.ck.contains(k))
            .map(|(k, s)| format!("{k} {s:?}"))
            .collect();
        if !missing.is_empty() {
            let shown: Vec<&str> = missing.iter().take(5).map(String::as_str).collect();
            return Err(Error::BadTensor(format!(
                "{}: {} missing tensor(s): {}{}",
                self.ck.path().display(),
                missing.len(),
                shown.join(", "),
                if missing.len() > 5 { ", ..." } else { "" }
            )));
        }
        for (key, shape) in &self.expect {
            let found = self.ck.shape(key).unwrap_or(&[]);
            if found != shape.as_slice() {
                return Err(Error::BadTensor(format!(
                    "{}: tensor {key} has shape {found:?}, expected {shape:?}",
                    self.ck.path().display()
                )));
            }
        }
        Ok(self.rules)
    }
}

pub(super) fn need_shape<'a>(ck: &'a Checkpoint, key: &str, rank: usize) -> Result<&'a [usize]> {
    match ck.shape(key) {
        Some(s) if s.len() == rank => Ok(s),
        Some(s) => Err(Error::BadTensor(format!(
            "{}: tensor {key} has shape {s:?}, expected rank {rank}",
            ck.path().display()
        ))),
        None => Err(Error::BadTensor(format!(
            "{}: missing tensor {key}",
            ck.path().display()
        ))),
    }
}

/// Number of blocks: indices N of keys `{prefix}.N.…`, which must run 0..L without gaps.
pub(super) fn count_layers(ck: &Checkpoint, prefix: &str) -> Result<usize> {
    let indices: BTreeSet<usize> = ck
        .keys()
        .filter_map(|k| k.strip_prefix(prefix)?.strip_prefix('.'))
        .filter_map(|rest| rest.split('.').next()?.parse().ok())
        .collect();
    let layers = indices.len();
    if layers == 0 {
        return Err(Error::BadTensor(format!(
            "{}: no {prefix}.N.* tensors",
            ck.path().display()
        )));
    }
    if let Some(gap) = (0..layers).find(|i| !indices.contains(i)) {
        return Err(Error::BadTensor(format!(
            "{}: inconsistent depth: {prefix}.{gap}.* is missing but {prefix}.{}.* exists",
            ck.path().display(),
            indices.iter().max().expect("non-empty")
        )));
    }
    Ok(layers)
}

pub(super) fn isqrt_exact(v: usize) -> Option<usize> {
    let r = (v as f64).sqrt().round() as usize;
    (r * r == v).then_some(r)
}

/// Image side for `n` patches of side `patch`.
pub(super) fn image_side(
    ck: &Checkpoint,
    hints: &ImportHints,
    n: usize,
    patch: usize,
) -> Result<usize> {
    let side = match hints.image_size {
        Some(s) => s,
        None => isqrt_exact(n).map(|r| r * patch).ok_or_else(|| {
            Error::BadTensor(format!(
                "{}: {n} tokens is not a square number of patches; non-square images are not supported",
                ck.path().display()
            ))
        })?,
    };
    if side % patch != 0 || (side / patch) * (side / patch) != n {
        return Err(Error::InvalidArgument(format!(
            "image size {side} with {patch}x{patch} patches gives {} tokens, but the checkpoint's spatial weight has {n}",
            (side / patch) * (side / patch)
        )));
    }
    Ok(side)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_square_roots_only() {
        assert_eq!(isqrt_exact(196), Some(14));
        assert_eq!(isqrt_exact(1), Some(1));
        assert_eq!(isqrt_exact(195), None);
        assert_eq!(isqrt_exact(0), Some(0));
    }
}
