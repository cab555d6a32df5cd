//! This project's own layout ("native", the names of [`crate::gmlp::weights`]): read back
//! with the configuration from the safetensors `__metadata__` when `--save-weights` wrote
//! it, else inferred from the shapes; and written by [`save_native`].

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use crate::checkpoint::file::Checkpoint;
use crate::checkpoint::plan::{count_layers, image_side, need_shape, Plan};
use crate::checkpoint::stored_spatial::StoredSpatial;
use crate::checkpoint::{ImportHints, Rule};
use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Precision, SpatialForm, Task};
use crate::gmlp::metadata::{config_json, CONFIG_KEY};
use crate::gmlp::weights::{check_values, param_specs, WeightSource};

/// The architecture and rules of a native checkpoint.
pub(super) fn native(
    ck: &Checkpoint,
    hints: &ImportHints,
) -> Result<(GmlpConfig, BTreeMap<String, Rule>)> {
    let stored_toeplitz;
    let mut config = match ck.metadata(CONFIG_KEY) {
        Some(json) => {
            let c: GmlpConfig = serde_json::from_str(json).map_err(|e| {
                Error::BadTensor(format!(
                    "{}: metadata {CONFIG_KEY} is not a valid configuration ({e})",
                    ck.path().display()
                ))
            })?;
            stored_toeplitz = c.spatial.is_toeplitz();
            c
        }
        None => {
            let (c, toeplitz) = infer_native(ck, hints)?;
            stored_toeplitz = toeplitz;
            c
        }
    };
    config.causal |= hints.causal;
    if hints.shift_tokens > 0 {
        config.shift_tokens = hints.shift_tokens;
    }
    // Rules are made against the stored form, then the requested form is applied.
    let stored_form = if stored_toeplitz {
        SpatialForm::ToeplitzGather
    } else {
        SpatialForm::Dense
    };
    let stored_config = GmlpConfig {
        spatial: stored_form,
        ..config.clone()
    };
    let mut plan = Plan::new(ck);
    let windowed = |name: &str| {
        name.strip_prefix("blocks.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|i| i.parse::<usize>().ok())
            .is_some_and(|i| config.block.mixing(i).window.is_some())
    };
    for spec in param_specs(&stored_config) {
        // A local window's W [h, w, 2w] is stored as it is (no other form exists).
        if spec.name.ends_with(".sgu.spatial.weight") && !windowed(&spec.name) {
            let stored = if stored_toeplitz {
                StoredSpatial::Toeplitz(spec.name.clone())
            } else {
                StoredSpatial::Dense(spec.name.clone())
            };
            plan.spatial(&spec.name, stored, vec![spec.shape.clone()]);
        } else {
            plan.same(&spec.name, &spec.name, &spec.shape);
        }
    }
    config.spatial = hints.spatial.unwrap_or(stored_form);
    Ok((config, plan.finish()?))
}

/// Architecture of a native checkpoint without metadata, from its shapes (LayerNorm eps
/// 1e-5). Returns the config and whether W is stored as Toeplitz vectors.
fn infer_native(ck: &Checkpoint, hints: &ImportHints) -> Result<(GmlpConfig, bool)> {
    let layers = count_layers(ck, "blocks")?;
    let d = need_shape(ck, "norm.weight", 1)?[0];
    let f = need_shape(ck, "blocks.0.proj_in.weight", 2)?[1];
    let bias = ck
        .shape("blocks.0.sgu.spatial.bias")
        .unwrap_or(&[])
        .to_vec();
    let (heads, n) = match bias.as_slice() {
        [n] => (1, *n),
        [h, n] => (*h, *n),
        other => {
            return Err(Error::BadTensor(format!(
                "blocks.0.sgu.spatial.bias has shape {other:?}, expected [n] or [heads, n]"
            )))
        }
    };
    let w = ck.shape("blocks.0.sgu.spatial.weight").unwrap_or(&[]);
    let toeplitz = w.last() == Some(&(2 * n - 1)) && w.len() == if heads > 1 { 2 } else { 1 };
    let attn_dim = ck
        .shape("blocks.0.attn.qkv.weight")
        .map(|s| s.get(1).copied().unwrap_or(0) / 3);
    let task = if let Some(embed) = ck.shape("embed.weight") {
        Task::Tokens {
            vocab_size: embed[0],
            seq_len: n,
            tied_embedding: !ck.contains("head.weight"),
        }
    } else {
        let stem = need_shape(ck, "stem.weight", 4)?;
        let (c, p) = (stem[1], stem[2]);
        Task::Vision {
            image_size: image_side(ck, hints, n, p)?,
            patch_size: p,
            in_chans: c,
            num_classes: need_shape(ck, "head.weight", 2)?[1],
        }
    };
    let config = GmlpConfig {
        task,
        layers,
        d_model: d,
        d_ffn: f,
        attn_dim,
        causal: hints.causal,
        heads,
        shift_tokens: hints.shift_tokens,
        spatial: SpatialForm::Dense,
        norm_eps: 1e-5,
        sgu_norm_eps: 1e-5,
        dtype: Precision::F32,
        block: Default::default(),
    };
    Ok((config, toeplitz))
}

/// Writes every parameter of `config` from `source` as a native-layout safetensors file
/// (f32, the configuration as JSON in `__metadata__`), streaming one tensor at a time,
/// atomically.
pub fn save_native(path: &Path, config: &GmlpConfig, source: &dyn WeightSource) -> Result<()> {
    let specs = param_specs(config);
    let mut header = serde_json::Map::new();
    header.insert(
        "__metadata__".into(),
        serde_json::json!({ CONFIG_KEY: config_json(config)?, "format": "gmlp-onnx native" }),
    );
    let mut offset = 0usize;
    for spec in &specs {
        let bytes = spec.len() * 4;
        header.insert(
            spec.name.clone(),
            serde_json::json!({"dtype": "F32", "shape": spec.shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = serde_json::to_string(&header)
        .map_err(|e| Error::InvalidConfig(format!("safetensors header: {e}")))?;
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    crate::fs::write_atomically(path, |w| {
        let io = |e: std::io::Error| Error::io(path, e);
        w.write_all(&(text.len() as u64).to_le_bytes())
            .map_err(io)?;
        w.write_all(text.as_bytes()).map_err(io)?;
        for spec in &specs {
            let v = source.values(spec)?;
            check_values(spec, &v)?;
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            w.write_all(&bytes).map_err(io)?;
        }
        Ok(())
    })
}
