//! timm's gMLP: `timm.models.mlp_mixer.MlpMixer` with `SpatialGatingBlock` / `GatedMlp`
//! ([mlp_mixer.py](https://github.com/huggingface/pytorch-image-models/blob/main/timm/models/mlp_mixer.py),
//! e.g. `gmlp_s16_224`): `stem.proj`, `blocks.N.norm`,
//! `blocks.N.mlp_channels.{fc1, gate.norm, gate.proj, fc2}`, `norm`, `head`. LayerNorm eps
//! 1e-6 (the gate's 1e-5); mean pooling over tokens in row-major patch order.

use std::collections::BTreeMap;

use crate::checkpoint::file::Checkpoint;
use crate::checkpoint::plan::{count_layers, image_side, map_names, need_shape, Map::*, Row};
use crate::checkpoint::{ImportHints, Rule};
use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Precision, SpatialForm, Task};

/// timm's names; `{l}` is `blocks.{i}.`. The stem is a Conv2d, stored as the native one.
const TIMM: &[Row] = &[
    ("stem.*", "stem.proj.*", Same),
    ("blocks.{i}.norm.*", "{l}norm.*", Same),
    ("blocks.{i}.proj_in.*", "{l}mlp_channels.fc1.*", Linear),
    ("blocks.{i}.sgu.norm.*", "{l}mlp_channels.gate.norm.*", Same),
    (
        "blocks.{i}.sgu.spatial.*",
        "{l}mlp_channels.gate.proj.*",
        Spatial,
    ),
    ("blocks.{i}.proj_out.*", "{l}mlp_channels.fc2.*", Linear),
    ("norm.*", "norm.*", Same),
    ("head.*", "head.*", Linear),
];

/// The architecture and rules of a timm gMLP checkpoint.
pub(super) fn timm(
    ck: &Checkpoint,
    hints: &ImportHints,
) -> Result<(GmlpConfig, BTreeMap<String, Rule>)> {
    let config = infer(ck, hints)?;
    let rules = map_names(ck, &config, &[TIMM], &|i| format!("blocks.{i}."))?;
    Ok((config, rules))
}

/// The architecture of a timm gMLP checkpoint, from its shapes.
fn infer(ck: &Checkpoint, hints: &ImportHints) -> Result<GmlpConfig> {
    let stem = need_shape(ck, "stem.proj.weight", 4)?;
    let (d, c, p) = (stem[0], stem[1], stem[2]);
    if stem[3] != p {
        return Err(Error::BadTensor(format!(
            "stem.proj.weight {stem:?}: non-square patches are not supported"
        )));
    }
    let layers = count_layers(ck, "blocks")?;
    let f = need_shape(ck, "blocks.0.mlp_channels.fc1.weight", 2)?[0];
    let n = need_shape(ck, "blocks.0.mlp_channels.gate.proj.weight", 2)?[0];
    let classes = need_shape(ck, "head.weight", 2)?[0];
    Ok(GmlpConfig {
        task: Task::Vision {
            image_size: image_side(ck, hints, n, p)?,
            patch_size: p,
            in_chans: c,
            num_classes: classes,
        },
        layers,
        d_model: d,
        d_ffn: f,
        attn_dim: None,
        causal: hints.causal,
        heads: 1,
        shift_tokens: hints.shift_tokens,
        spatial: hints.spatial.unwrap_or(SpatialForm::Dense),
        norm_eps: 1e-6,
        sgu_norm_eps: 1e-5,
        dtype: Precision::F32,
        block: Default::default(),
    })
}
