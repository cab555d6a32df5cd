//! Checkpoint layouts: how each implementation names and shapes its tensors, and how the
//! architecture is read back from them.
//!
//! - timm (`timm.models.mlp_mixer.MlpMixer` with `SpatialGatingBlock` / `GatedMlp`):
//!   `stem.proj`, `blocks.N.norm`, `blocks.N.mlp_channels.{fc1, gate.norm, gate.proj, fc2}`,
//!   `norm`, `head`. LayerNorm eps 1e-6 (gate 1e-5).
//! - g-mlp-pytorch 0.1.x (`gMLP`, `gMLPVision`): `layers.N.fn.norm` (pre-norm), the block
//!   under `layers.N.fn.fn.fn.` (0.1.5 token models, with `PreShiftTokens`) or
//!   `layers.N.fn.fn.` (vision models, and token models of ≤ 0.1.4): `proj_in.0`,
//!   `sgu.{norm, weight, bias}`, `attn.{to_qkv, to_out}`, `proj_out`; `to_embed` /
//!   `to_patch_embed.1`, `to_logits`. LayerNorm eps 1e-5. Causality and token shift are not
//!   visible in the weights and come from the hints.
//! - native: this project's own names (see [`crate::gmlp::weights`]), the configuration in
//!   the safetensors `__metadata__` when written by `--save-weights`.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkpoint::spatial::StoredSpatial;
use crate::checkpoint::{Checkpoint, Rule, NATIVE_CONFIG_KEY, TOEPLITZ_TOLERANCE};
use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Precision, SpatialForm, Task};

/// A checkpoint layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// This project's own names.
    Native,
    /// timm's gMLP (`MlpMixer`).
    Timm,
    /// g-mlp-pytorch (lucidrains).
    Lucidrains,
}

impl Format {
    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            Format::Native => "native",
            Format::Timm => "timm",
            Format::Lucidrains => "lucidrains (g-mlp-pytorch)",
        }
    }
}

/// What the weights do not say, from the command line.
#[derive(Clone, Debug)]
pub struct ImportHints {
    /// Force a layout instead of recognizing it.
    pub format: Option<Format>,
    /// The model was trained causal (g-mlp-pytorch `causal=True`).
    pub causal: bool,
    /// g-mlp-pytorch `shift_tokens`.
    pub shift_tokens: usize,
    /// Input channels (g-mlp-pytorch vision stores C·p·p only).
    pub in_chans: Option<usize>,
    /// Image side, when the token count is not a perfect square.
    pub image_size: Option<usize>,
    /// Patch side (g-mlp-pytorch vision).
    pub patch_size: Option<usize>,
    /// Spatial form to emit (default: the stored one; dense for dense checkpoints).
    pub spatial: Option<SpatialForm>,
    /// Accept checkpoint tensors that the model does not use.
    pub allow_unused: bool,
    /// Relative tolerance for accepting a dense W as Toeplitz.
    pub toeplitz_tolerance: f32,
}

impl Default for ImportHints {
    fn default() -> Self {
        ImportHints {
            format: None,
            causal: false,
            shift_tokens: 0,
            in_chans: None,
            image_size: None,
            patch_size: None,
            spatial: None,
            allow_unused: false,
            toeplitz_tolerance: TOEPLITZ_TOLERANCE,
        }
    }
}

/// Rules plus the checkpoint shapes they expect.
struct Plan<'c> {
    ck: &'c Checkpoint,
    rules: BTreeMap<String, Rule>,
    expect: Vec<(String, Vec<usize>)>,
}

impl<'c> Plan<'c> {
    fn new(ck: &'c Checkpoint) -> Self {
        Plan {
            ck,
            rules: BTreeMap::new(),
            expect: Vec::new(),
        }
    }
    fn same(&mut self, native: &str, key: &str, shape: &[usize]) {
        self.rules.insert(native.into(), Rule::Same(key.into()));
        self.expect.push((key.into(), shape.to_vec()));
    }
    /// PyTorch `Linear.weight [out, in]` → native `[in, out]`.
    fn linear(&mut self, native: &str, key: &str, out: usize, inp: usize) {
        self.rules
            .insert(native.into(), Rule::Transposed(key.into()));
        self.expect.push((key.into(), vec![out, inp]));
    }
    fn norm(&mut self, native: &str, key: &str, width: usize) {
        self.same(
            &format!("{native}.weight"),
            &format!("{key}.weight"),
            &[width],
        );
        self.same(&format!("{native}.bias"), &format!("{key}.bias"), &[width]);
    }
    fn spatial(&mut self, native: &str, stored: StoredSpatial, shapes: Vec<Vec<usize>>) {
        for (key, shape) in stored.keys().into_iter().zip(shapes) {
            self.expect.push((key, shape));
        }
        self.rules.insert(native.into(), Rule::Spatial(stored));
    }
    /// Checks every expected tensor exists with its shape.
    fn finish(self) -> Result<BTreeMap<String, Rule>> {
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

fn need_shape<'a>(ck: &'a Checkpoint, key: &str, rank: usize) -> Result<&'a [usize]> {
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
fn count_layers(ck: &Checkpoint, prefix: &str) -> Result<usize> {
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

fn isqrt_exact(v: usize) -> Option<usize> {
    let r = (v as f64).sqrt().round() as usize;
    (r * r == v).then_some(r)
}

/// Image side for `n` patches of side `patch`.
fn image_side(ck: &Checkpoint, hints: &ImportHints, n: usize, patch: usize) -> Result<usize> {
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

fn timm(ck: &Checkpoint, hints: &ImportHints) -> Result<(GmlpConfig, BTreeMap<String, Rule>)> {
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

/// The block prefix of layer `i` in g-mlp-pytorch: `layers.i.fn.fn.fn.` (0.1.5 token
/// models) or `layers.i.fn.fn.` (vision, ≤ 0.1.4).
fn lucid_nesting(ck: &Checkpoint) -> Option<&'static str> {
    ["fn.fn.fn.", "fn.fn."].into_iter().find(|nest| {
        ck.keys().any(|k| {
            k.strip_prefix("layers.")
                .and_then(|rest| rest.split_once('.'))
                .is_some_and(|(index, tail)| {
                    index.parse::<usize>().is_ok() && tail == format!("{nest}proj_in.0.weight")
                })
        })
    })
}

fn lucidrains(
    ck: &Checkpoint,
    hints: &ImportHints,
) -> Result<(GmlpConfig, BTreeMap<String, Rule>)> {
    let nest = lucid_nesting(ck).ok_or_else(|| {
        Error::BadTensor(format!(
            "{}: no layers.0.fn.fn[.fn].proj_in.0.weight: not a g-mlp-pytorch gMLP checkpoint",
            ck.path().display()
        ))
    })?;
    let block = |i: usize| format!("layers.{i}.{nest}");
    let layers = count_layers(ck, "layers")?;
    let proj_in = need_shape(ck, &format!("{}proj_in.0.weight", block(0)), 2)?;
    let (f, d) = (proj_in[0], proj_in[1]);
    let e = f / 2;
    let sgu = format!("{}sgu.", block(0));
    let circulant = ck.contains(&format!("{sgu}circulant_pos_x"));
    let sgu_shape = need_shape(ck, &format!("{sgu}weight"), if circulant { 2 } else { 3 })?;
    let (heads, n) = (sgu_shape[0], sgu_shape[1]);
    let attn_dim = match ck.shape(&format!("{}attn.to_qkv.weight", block(0))) {
        Some([rows, cols]) if rows % 3 == 0 && *cols == d => Some(rows / 3),
        Some(s) => {
            return Err(Error::BadTensor(format!(
                "{}attn.to_qkv.weight has shape {s:?}, expected [3a, {d}]",
                block(0)
            )))
        }
        None => None,
    };
    let mut plan = Plan::new(ck);
    let task = if ck.contains("to_embed.weight") {
        let vocab = need_shape(ck, "to_embed.weight", 2)?[0];
        plan.same("embed.weight", "to_embed.weight", &[vocab, d]);
        plan.norm("norm", "to_logits.0", d);
        plan.linear("head.weight", "to_logits.1.weight", vocab, d);
        plan.same("head.bias", "to_logits.1.bias", &[vocab]);
        Task::Tokens {
            vocab_size: vocab,
            seq_len: n,
            tied_embedding: false,
        }
    } else {
        let k = need_shape(ck, "to_patch_embed.1.weight", 2)?[1];
        let (c, p) = match (hints.patch_size, hints.in_chans) {
            (Some(p), _) if p > 0 && k % (p * p) == 0 => (k / (p * p), p),
            (None, c) => {
                let c = c.unwrap_or(3);
                let p = (c > 0 && k % c == 0).then(|| isqrt_exact(k / c)).flatten();
                (c, p.ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "to_patch_embed.1.weight has {k} inputs, not {c} channels times a square patch; pass --in-chans / --patch-size"
                    ))
                })?)
            }
            (Some(p), _) => {
                return Err(Error::InvalidArgument(format!(
                    "--patch-size {p} does not divide the {k} inputs of to_patch_embed.1.weight"
                )))
            }
        };
        let classes = need_shape(ck, "to_logits.2.weight", 2)?[0];
        plan.same("stem.weight", "to_patch_embed.1.weight", &[d, k]);
        plan.same("stem.bias", "to_patch_embed.1.bias", &[d]);
        plan.norm("norm", "to_logits.0", d);
        plan.linear("head.weight", "to_logits.2.weight", classes, d);
        plan.same("head.bias", "to_logits.2.bias", &[classes]);
        Task::Vision {
            image_size: image_side(ck, hints, n, p)?,
            patch_size: p,
            in_chans: c,
            num_classes: classes,
        }
    };
    for i in 0..layers {
        let (b, l) = (format!("blocks.{i}"), block(i));
        plan.norm(&format!("{b}.norm"), &format!("layers.{i}.fn.norm"), d);
        plan.linear(
            &format!("{b}.proj_in.weight"),
            &format!("{l}proj_in.0.weight"),
            f,
            d,
        );
        plan.same(
            &format!("{b}.proj_in.bias"),
            &format!("{l}proj_in.0.bias"),
            &[f],
        );
        plan.norm(&format!("{b}.sgu.norm"), &format!("{l}sgu.norm"), e);
        if circulant {
            plan.spatial(
                &format!("{b}.sgu.spatial.weight"),
                StoredSpatial::Circulant {
                    weight: format!("{l}sgu.weight"),
                    pos_x: format!("{l}sgu.circulant_pos_x"),
                    pos_y: format!("{l}sgu.circulant_pos_y"),
                },
                vec![vec![heads, n]; 3],
            );
        } else {
            plan.spatial(
                &format!("{b}.sgu.spatial.weight"),
                StoredSpatial::Dense(format!("{l}sgu.weight")),
                vec![vec![heads, n, n]],
            );
        }
        plan.same(
            &format!("{b}.sgu.spatial.bias"),
            &format!("{l}sgu.bias"),
            &[heads, n],
        );
        if let Some(a) = attn_dim {
            plan.linear(
                &format!("{b}.attn.qkv.weight"),
                &format!("{l}attn.to_qkv.weight"),
                3 * a,
                d,
            );
            plan.linear(
                &format!("{b}.attn.out.weight"),
                &format!("{l}attn.to_out.weight"),
                e,
                a,
            );
            plan.same(
                &format!("{b}.attn.out.bias"),
                &format!("{l}attn.to_out.bias"),
                &[e],
            );
        }
        plan.linear(
            &format!("{b}.proj_out.weight"),
            &format!("{l}proj_out.weight"),
            d,
            e,
        );
        plan.same(
            &format!("{b}.proj_out.bias"),
            &format!("{l}proj_out.bias"),
            &[d],
        );
    }
    let config = GmlpConfig {
        task,
        layers,
        d_model: d,
        d_ffn: f,
        attn_dim,
        causal: hints.causal,
        heads,
        shift_tokens: hints.shift_tokens,
        spatial: hints.spatial.unwrap_or(SpatialForm::Dense),
        norm_eps: 1e-5,
        sgu_norm_eps: 1e-5,
        dtype: Precision::F32,
    };
    Ok((config, plan.finish()?))
}

fn native(ck: &Checkpoint, hints: &ImportHints) -> Result<(GmlpConfig, BTreeMap<String, Rule>)> {
    let stored_toeplitz;
    let mut config = match ck.metadata(NATIVE_CONFIG_KEY) {
        Some(json) => {
            let c: GmlpConfig = serde_json::from_str(json).map_err(|e| {
                Error::BadTensor(format!(
                    "{}: metadata {NATIVE_CONFIG_KEY} is not a valid configuration ({e})",
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
    for spec in crate::gmlp::weights::param_specs(&stored_config) {
        if spec.name.ends_with(".sgu.spatial.weight") {
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
    };
    Ok((config, toeplitz))
}

/// Which layout markers a checkpoint has, for recognition and for the error message.
fn markers(ck: &Checkpoint) -> Vec<(Format, &'static str)> {
    let mut found = Vec::new();
    if ck.contains("stem.proj.weight") {
        found.push((Format::Timm, "stem.proj.weight"));
    }
    if ck
        .keys()
        .any(|k| k.starts_with("blocks.") && k.ends_with(".mlp_channels.gate.proj.weight"))
    {
        found.push((Format::Timm, "blocks.N.mlp_channels.gate.proj.weight"));
    }
    if lucid_nesting(ck).is_some() {
        found.push((Format::Lucidrains, "layers.N.fn…proj_in.0.weight"));
    }
    if ck.contains("to_embed.weight") || ck.contains("to_patch_embed.1.weight") {
        found.push((Format::Lucidrains, "to_embed / to_patch_embed.1"));
    }
    if ck
        .keys()
        .any(|k| k.starts_with("blocks.") && k.ends_with(".sgu.spatial.weight"))
    {
        found.push((Format::Native, "blocks.N.sgu.spatial.weight"));
    }
    if ck.contains("embed.weight") || ck.contains("stem.weight") {
        found.push((Format::Native, "embed.weight / stem.weight"));
    }
    found
}

/// Recognizes the layout (each format needs both of its markers).
fn recognize(ck: &Checkpoint) -> Result<Format> {
    let found = markers(ck);
    let complete: Vec<Format> = [Format::Timm, Format::Lucidrains, Format::Native]
        .into_iter()
        .filter(|f| found.iter().filter(|(g, _)| g == f).count() == 2)
        .collect();
    match complete.as_slice() {
        [one] => Ok(*one),
        _ => {
            let seen: Vec<String> = found
                .iter()
                .map(|(f, m)| format!("{m} ({})", f.name()))
                .collect();
            let first: Vec<&str> = ck.keys().take(4).collect();
            Err(Error::BadTensor(format!(
                "{}: cannot tell which implementation wrote this checkpoint; recognized: {}; first tensors: {}; \
                 expected timm (stem.proj.weight + blocks.N.mlp_channels.gate.proj.weight), g-mlp-pytorch \
                 (layers.N.fn…proj_in.0.weight + to_embed/to_patch_embed.1) or native (blocks.N.sgu.spatial.weight + \
                 embed.weight/stem.weight); pass --weights-format to choose",
                ck.path().display(),
                if seen.is_empty() { "nothing".to_string() } else { seen.join(", ") },
                first.join(", ")
            )))
        }
    }
}

/// Recognizes the layout (unless forced), infers the architecture and maps every native
/// parameter to checkpoint tensors, checking names and shapes.
pub fn plan(
    ck: &Checkpoint,
    hints: &ImportHints,
) -> Result<(Format, GmlpConfig, BTreeMap<String, Rule>)> {
    let format = match hints.format {
        Some(f) => f,
        None => recognize(ck)?,
    };
    let (config, rules) = match format {
        Format::Timm => timm(ck, hints)?,
        Format::Lucidrains => lucidrains(ck, hints)?,
        Format::Native => native(ck, hints)?,
    };
    config.validate()?;
    Ok((format, config, rules))
}
