//! timm's gMLP: `timm.models.mlp_mixer.MlpMixer` with `SpatialGatingBlock` / `GatedMlp`
//! ([mlp_mixer.py](https://github.com/huggingface/pytorch-image-models/blob/main/timm/models/mlp_mixer.py),
//! e.g. `gmlp_s16_224`): `stem.proj`, `blocks.N.norm`,
//! `blocks.N.mlp_channels.{fc1, gate.norm, gate.proj, fc2}`, `norm`, `head`. LayerNorm eps
//! 1e-6 (the gate's 1e-5); mean pooling over tokens in row-major patch order.

use std::collections::BTreeMap;

use crate::checkpoint::file::Checkpoint;
use crate::checkpoint::plan::{count_layers, image_side, need_shape, Plan};
use crate::checkpoint::spatial::StoredSpatial;
use crate::checkpoint::{ImportHints, Rule};
use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Precision, SpatialForm, Task};

/// The architecture and rules of a timm gMLP checkpoint.
pub(super) fn timm(
    ck: &Checkpoint,
    hints: &ImportHints,
) -> Result<(GmlpConfig, BTreeMap<String, Rule>)> {
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
    let e = f / 2;
    let config = GmlpConfig {
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
    };
    let mut plan = Plan::new(ck);
    plan.same("stem.weight", "stem.proj.weight", &[d, c, p, p]);
    plan.same("stem.bias", "stem.proj.bias", &[d]);
    for i in 0..layers {
        let (b, t) = (format!("blocks.{i}"), format!("blocks.{i}.mlp_channels"));
        plan.norm(&format!("{b}.norm"), &format!("{b}.norm"), d);
        plan.linear(
            &format!("{b}.proj_in.weight"),
            &format!("{t}.fc1.weight"),
            f,
            d,
        );
        plan.same(&format!("{b}.proj_in.bias"), &format!("{t}.fc1.bias"), &[f]);
        plan.norm(&format!("{b}.sgu.norm"), &format!("{t}.gate.norm"), e);
        plan.spatial(
            &format!("{b}.sgu.spatial.weight"),
            StoredSpatial::Dense(format!("{t}.gate.proj.weight")),
            vec![vec![n, n]],
        );
        plan.same(
            &format!("{b}.sgu.spatial.bias"),
            &format!("{t}.gate.proj.bias"),
            &[n],
        );
        plan.linear(
            &format!("{b}.proj_out.weight"),
            &format!("{t}.fc2.weight"),
            d,
            e,
        );
        plan.same(
            &format!("{b}.proj_out.bias"),
            &format!("{t}.fc2.bias"),
            &[d],
        );
    }
    plan.norm("norm", "norm", d);
    plan.linear("head.weight", "head.weight", classes, d);
    plan.same("head.bias", "head.bias", &[classes]);
    Ok((config, plan.finish()?))
}
