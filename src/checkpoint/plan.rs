//! What every layout's import plan is made of: the rule for each native parameter, the
//! checkpoint tensors (and shapes) it expects, checked all at once; the walk that maps
//! every native parameter through a layout's name table ([`Row`], [`map_names`]); and the
//! shape readers the layouts share (depth from the block numbering, image side from the
//! token count).

use std::collections::{BTreeMap, BTreeSet};

use crate::checkpoint::file::Checkpoint;
use crate::checkpoint::stored_spatial::StoredSpatial;
use crate::checkpoint::{ImportHints, Rule};
use crate::error::{CheckpointError, Error, Result};
use crate::gmlp::config::{GmlpConfig, SpatialForm};
use crate::gmlp::weights::{param_specs, ParamSpec};

/// How an upstream module (or tensor) holds the values of a native one. The upstream shape
/// follows from the native shape, so a table spells names only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Map {
    /// The same values and shape.
    Same,
    /// PyTorch `Linear`: `weight [out, in]`, transposed to the native `[in, out]`; the
    /// `bias` as it is.
    Linear,
    /// A `Linear` patch embedding standing for the native Conv stem: `weight [d, C·p·p]`
    /// (the native `[d, C, p, p]` flattened, same values); the `bias` as it is.
    LinearStem,
    /// The spatial projection: `weight` W dense `[n, n]` (a windowed layer's `[w, 2w]`
    /// taken as it is), `bias` b `[n]`; both `[h, …]` with h > 1 gating heads.
    Spatial,
    /// [`Map::Spatial`], with the heads axis stored even for one head (`[h, n, n]`,
    /// `[h, n]`), as lucidrains' code does.
    SpatialHeaded,
    /// g-mlp-pytorch's `circulant_matrix=True`: W made from `weight`, `circulant_pos_x` and
    /// `circulant_pos_y` of the same module, each `[h, n]`; `bias [h, n]`.
    Circulant,
}

/// One row of a layout's name table: (native name, upstream name, [`Map`]). A native name
/// ending in `.*` stands for a module (its `weight` and `bias`, those the configuration
/// has), and the upstream name then ends in `.*` too. In names, `{i}` is the block index;
/// in upstream names, `{l}` is the layout's prefix of block `{i}` (see [`map_names`]).
pub(super) type Row = (&'static str, &'static str, Map);

/// Maps every parameter of `config` to checkpoint tensors by the first row of `tables`
/// that names it, `layer(i)` standing for `{l}`, and checks them all: the one walk every
/// table-driven layout shares. Spatial weights are expected as upstream stores them
/// (dense, or the circulant vectors) whatever form `config` emits.
pub(super) fn map_names(
    ck: &Checkpoint,
    config: &GmlpConfig,
    tables: &[&[Row]],
    layer: &dyn Fn(usize) -> String,
) -> Result<BTreeMap<String, Rule>> {
    let stored = GmlpConfig {
        spatial: SpatialForm::Dense,
        ..config.clone()
    };
    let mut plan = Plan::new(ck);
    for spec in param_specs(&stored) {
        let indexed = spec.name.strip_prefix("blocks.").and_then(|r| {
            let (i, rest) = r.split_once('.')?;
            Some((i.parse::<usize>().ok()?, rest))
        });
        let (block, pattern) = match indexed {
            Some((i, rest)) => (Some(i), format!("blocks.{{i}}.{rest}")),
            None => (None, spec.name.clone()),
        };
        let (module, field) = pattern.rsplit_once('.').unwrap_or(("", ""));
        let row = tables
            .iter()
            .flat_map(|t| t.iter())
            .find_map(|(native, upstream, map)| {
                if *native == pattern {
                    Some((upstream.to_string(), *map))
                } else {
                    let upstream = upstream.strip_suffix('*')?;
                    (native.strip_suffix(".*") == Some(module))
                        .then(|| (format!("{upstream}{field}"), *map))
                }
            });
        let Some((upstream, map)) = row else {
            return Err(Error::Internal(format!(
                "this layout's name table has no row for the native parameter {pattern}"
            )));
        };
        let key = match block {
            Some(i) => upstream
                .replace("{l}", &layer(i))
                .replace("{i}", &i.to_string()),
            None => upstream,
        };
        let window = block.is_some_and(|i| stored.block.mixing(i).window.is_some());
        plan.map(&stored, &spec, &key, map, field == "weight", window)?;
    }
    plan.finish()
}

/// Rules plus the checkpoint shapes they expect.
pub(super) struct Plan<'c> {
    ck: &'c Checkpoint,
    rules: BTreeMap<String, Rule>,
    expect: Vec<(String, Vec<usize>)>,
}

impl<'c> Plan<'c> {
    /// No rules yet, for `ck`.
    pub(super) fn new(ck: &'c Checkpoint) -> Self {
        Plan {
            ck,
            rules: BTreeMap::new(),
            expect: Vec::new(),
        }
    }
    /// `native` is the tensor `key` as it is, expected in `shape`.
    pub(super) fn same(&mut self, native: &str, key: &str, shape: &[usize]) {
        self.rules.insert(native.into(), Rule::Same(key.into()));
        self.expect.push((key.into(), shape.to_vec()));
    }
    /// `native` is the spatial weight `stored`, whose tensors are expected in `shapes`.
    pub(super) fn spatial(&mut self, native: &str, stored: StoredSpatial, shapes: Vec<Vec<usize>>) {
        for (key, shape) in stored.keys().into_iter().zip(shapes) {
            self.expect.push((key, shape));
        }
        self.rules.insert(native.into(), Rule::Spatial(stored));
    }
    /// The rule for the native parameter `spec` (a `weight` if `weight`, in a windowed
    /// layer if `window`) read from `key` as `map` says.
    fn map(
        &mut self,
        cfg: &GmlpConfig,
        spec: &ParamSpec,
        key: &str,
        map: Map,
        weight: bool,
        window: bool,
    ) -> Result<()> {
        let (name, shape) = (spec.name.as_str(), spec.shape.as_slice());
        let headed = || match cfg.heads {
            1 => [&[1], shape].concat(),
            _ => shape.to_vec(),
        };
        match (map, weight) {
            (Map::Linear, true) => match shape {
                [inp, out] => {
                    self.rules.insert(name.into(), Rule::Transposed(key.into()));
                    self.expect.push((key.into(), vec![*out, *inp]));
                }
                _ => {
                    return Err(Error::Internal(format!(
                        "{name} {shape:?} is read as a Linear weight, which is 2-D"
                    )))
                }
            },
            (Map::LinearStem, true) => {
                let flat = [
                    shape.first().copied().unwrap_or(0),
                    shape.iter().skip(1).product(),
                ];
                self.same(name, key, &flat);
            }
            (Map::Spatial, true) if !window => {
                self.spatial(name, StoredSpatial::Dense(key.into()), vec![shape.to_vec()])
            }
            (Map::SpatialHeaded, true) if !window => {
                self.spatial(name, StoredSpatial::Dense(key.into()), vec![headed()])
            }
            (Map::Circulant, true) => {
                let module = key.strip_suffix("weight").unwrap_or(key);
                let stored = StoredSpatial::Circulant {
                    weight: key.into(),
                    pos_x: format!("{module}circulant_pos_x"),
                    pos_y: format!("{module}circulant_pos_y"),
                };
                self.spatial(name, stored, vec![vec![cfg.heads, cfg.seq_len()]; 3]);
            }
            (Map::SpatialHeaded | Map::Circulant, _) => self.same(name, key, &headed()),
            (Map::Same | Map::Linear | Map::LinearStem | Map::Spatial, _) => {
                self.same(name, key, shape)
            }
        }
        Ok(())
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
            return Err(CheckpointError::Missing(format!(
                "{}: {} missing tensor(s): {}{}",
                self.ck.path().display(),
                missing.len(),
                shown.join(", "),
                if missing.len() > 5 { ", ..." } else { "" }
            ))
            .into());
        }
        for (key, shape) in &self.expect {
            let found = self.ck.shape(key).unwrap_or(&[]);
            if found != shape.as_slice() {
                return Err(CheckpointError::WrongShape(format!(
                    "{}: tensor {key} has shape {found:?}, expected {shape:?}",
                    self.ck.path().display()
                ))
                .into());
            }
        }
        Ok(self.rules)
    }
}

pub(super) fn need_shape<'a>(ck: &'a Checkpoint, key: &str, rank: usize) -> Result<&'a [usize]> {
    match ck.shape(key) {
        Some(s) if s.len() == rank => Ok(s),
        Some(s) => Err(CheckpointError::WrongShape(format!(
            "{}: tensor {key} has shape {s:?}, expected rank {rank}",
            ck.path().display()
        ))
        .into()),
        None => Err(CheckpointError::Missing(format!(
            "{}: missing tensor {key}",
            ck.path().display()
        ))
        .into()),
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
        return Err(CheckpointError::Depth(format!(
            "{}: no {prefix}.N.* tensors",
            ck.path().display()
        ))
        .into());
    }
    if let Some(gap) = (0..layers).find(|i| !indices.contains(i)) {
        return Err(CheckpointError::Depth(format!(
            "{}: inconsistent depth: {prefix}.{gap}.* is missing but {prefix}.{}.* exists",
            ck.path().display(),
            indices.iter().max().expect("non-empty")
        ))
        .into());
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
        return Err(Error::ContradictsWeights(format!(
            "image size {side} with {patch}x{patch} patches gives {} tokens, but the checkpoint's spatial weight has {n}",
            (side / patch) * (side / patch)
        )));
    }
    Ok(side)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gmlp::config::{BlockOptions, NormKind, Precision, Task};
    use std::path::Path;
    use Map::*;

    /// A checkpoint in memory holding zeros under each name, in each shape.
    fn checkpoint(tensors: &[(&str, &[usize])]) -> Checkpoint {
        let data: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(_, s)| vec![0u8; 4 * s.iter().product::<usize>()])
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
            .iter()
            .zip(&data)
            .map(|((n, s), d)| {
                let view =
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.to_vec(), d)
                        .unwrap();
                (n.to_string(), view)
            })
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap();
        Checkpoint::from_bytes(Path::new("t.safetensors"), bytes).unwrap()
    }

    /// One RMSNorm block without spatial bias: d = 2, f = 4, e = 2, n = 3.
    fn backbone() -> GmlpConfig {
        GmlpConfig {
            task: Task::Backbone { seq_len: 3 },
            layers: 1,
            d_model: 2,
            d_ffn: 4,
            attn_dim: None,
            causal: false,
            heads: 1,
            shift_tokens: 0,
            spatial: SpatialForm::ToeplitzGather,
            norm_eps: 1e-6,
            sgu_norm_eps: 1e-6,
            dtype: Precision::F32,
            block: BlockOptions {
                norm: NormKind::RmsNorm,
                spatial_bias: false,
                ..BlockOptions::default()
            },
        }
    }

    const TABLE: &[Row] = &[
        ("blocks.{i}.norm.*", "{l}n.*", Same),
        ("blocks.{i}.proj_in.*", "{l}u.*", Linear),
        ("blocks.{i}.sgu.norm.*", "{l}g.n.*", Same),
        ("blocks.{i}.sgu.spatial.weight", "{l}g.w", SpatialHeaded),
        ("blocks.{i}.proj_out.*", "x.{i}.v.*", Linear),
    ];

    fn layer(i: usize) -> String {
        format!("l.{i}.")
    }

    #[test]
    fn rows_map_modules_and_tensors_with_shapes_from_the_native_ones() {
        let ck = checkpoint(&[
            ("l.0.n.weight", &[2]),
            ("l.0.u.weight", &[4, 2]),
            ("l.0.u.bias", &[4]),
            ("l.0.g.n.weight", &[2]),
            ("l.0.g.w", &[1, 3, 3]),
            ("x.0.v.weight", &[2, 2]),
            ("x.0.v.bias", &[2]),
        ]);
        let rules = map_names(&ck, &backbone(), &[TABLE], &layer).unwrap();
        let rule = |name: &str| rules[name].clone();
        assert_eq!(
            rule("blocks.0.norm.weight"),
            Rule::Same("l.0.n.weight".into())
        );
        assert_eq!(
            rule("blocks.0.proj_in.weight"),
            Rule::Transposed("l.0.u.weight".into())
        );
        assert_eq!(
            rule("blocks.0.proj_in.bias"),
            Rule::Same("l.0.u.bias".into())
        );
        // Read dense, as stored, though the configuration emits Toeplitz vectors.
        assert_eq!(
            rule("blocks.0.sgu.spatial.weight"),
            Rule::Spatial(StoredSpatial::Dense("l.0.g.w".into()))
        );
        assert_eq!(
            rule("blocks.0.proj_out.weight"),
            Rule::Transposed("x.0.v.weight".into())
        );
        assert_eq!(rules.len(), 7);
    }

    #[test]
    fn a_headed_spatial_weight_needs_its_heads_axis_even_for_one_head() {
        let ck = checkpoint(&[
            ("l.0.n.weight", &[2]),
            ("l.0.u.weight", &[4, 2]),
            ("l.0.u.bias", &[4]),
            ("l.0.g.n.weight", &[2]),
            ("l.0.g.w", &[3, 3]),
            ("x.0.v.weight", &[2, 2]),
            ("x.0.v.bias", &[2]),
        ]);
        let e = map_names(&ck, &backbone(), &[TABLE], &layer).unwrap_err();
        assert!(
            matches!(e, Error::Checkpoint(CheckpointError::WrongShape(_))),
            "{e:?}"
        );
        assert!(e
            .to_string()
            .ends_with(": tensor l.0.g.w has shape [3, 3], expected [1, 3, 3]"));
    }

    #[test]
    fn a_parameter_no_row_names_is_an_internal_error_naming_it() {
        let ck = checkpoint(&[("x.0.v.weight", &[2, 2])]);
        let e = map_names(&ck, &backbone(), &[&TABLE[..4]], &layer).unwrap_err();
        assert!(matches!(e, Error::Internal(_)), "{e}");
        assert!(e.to_string().contains("blocks.{i}.proj_out.weight"), "{e}");
    }

    #[test]
    fn exact_square_roots_only() {
        assert_eq!(isqrt_exact(196), Some(14));
        assert_eq!(isqrt_exact(1), Some(1));
        assert_eq!(isqrt_exact(195), None);
        assert_eq!(isqrt_exact(0), Some(0));
    }
}
