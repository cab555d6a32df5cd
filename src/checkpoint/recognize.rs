//! Which implementation wrote a checkpoint: each layout has two markers (tensor names), and
//! a checkpoint is recognized only when exactly one layout shows both; the error lists what
//! was seen. Then the layout's own module reads the architecture and the rules.

use std::collections::BTreeMap;

use clap::ValueEnum;

use crate::checkpoint::file::Checkpoint;
use crate::checkpoint::gpt::{self, gpt_buffers, gpt_layers};
use crate::checkpoint::lucidrains::{self, lucid_nesting};
use crate::checkpoint::{native, timm, tinygrad, ImportHints, Rule};
use crate::error::{Error, Result};
use crate::gmlp::config::GmlpConfig;
use crate::message::{Phrase, Setting};

/// A checkpoint layout (`--weights-format`; each variant's doc is its `--help` line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// This project's own names (see docs/checkpoints.md).
    Native,
    /// timm's gMLP (MlpMixer with SpatialGatingBlock).
    Timm,
    /// g-mlp-pytorch (gMLP, gMLPVision).
    Lucidrains,
    /// g-mlp-gpt (gMLPGPT, causal language model).
    GmlpGpt,
    /// gmlp-tinygrad (gMLP backbone: inputs_embeds → last_hidden_state).
    Tinygrad,
}

impl Format {
    /// The layout's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Native => "native",
            Format::Timm => "timm",
            Format::Lucidrains => "lucidrains (g-mlp-pytorch)",
            Format::GmlpGpt => "g-mlp-gpt",
            Format::Tinygrad => "gmlp-tinygrad",
        }
    }

    /// Checkpoint tensors of this layout that are constant buffers, not parameters
    /// (g-mlp-gpt's registered causal masks): expected, and not used.
    pub fn buffers(self, ck: &Checkpoint) -> Vec<String> {
        match self {
            Format::GmlpGpt => gpt_buffers(ck),
            _ => Vec::new(),
        }
    }
}

/// Which layout markers a checkpoint has, for recognition and for the error message.
pub(super) fn markers(ck: &Checkpoint) -> Vec<(Format, &'static str)> {
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
    if gpt_layers(ck).is_some() {
        found.push((
            Format::GmlpGpt,
            "net.layers.N.0.fn.fn.proj_in.0.weight / net.blocks.N.f.net…",
        ));
    }
    if ck.contains("to_logits.1.weight") && ck.contains("to_embed.weight") {
        found.push((Format::GmlpGpt, "to_embed + to_logits.1"));
    }
    if ck
        .keys()
        .any(|k| k.starts_with("layers.") && k.ends_with(".spatial_gating_unit.gating_matrix"))
    {
        found.push((
            Format::Tinygrad,
            "layers.N.spatial_gating_unit.gating_matrix",
        ));
    }
    if ck
        .keys()
        .any(|k| k.starts_with("layers.") && k.ends_with(".channel_proj.weight"))
    {
        found.push((Format::Tinygrad, "layers.N.channel_proj.weight"));
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
pub(super) fn recognize(ck: &Checkpoint) -> Result<Format> {
    let found = markers(ck);
    let complete: Vec<Format> = [
        Format::Timm,
        Format::Lucidrains,
        Format::GmlpGpt,
        Format::Tinygrad,
        Format::Native,
    ]
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
            Err(Error::UnknownLayout(
                Phrase::text(format!(
                    "{}: cannot tell which implementation wrote this checkpoint; recognized: {}; first tensors: {}; \
                     expected timm (stem.proj.weight + blocks.N.mlp_channels.gate.proj.weight), g-mlp-pytorch \
                     (layers.N.fn…proj_in.0.weight + to_embed/to_patch_embed.1), g-mlp-gpt (net.layers.N.0.fn.fn.proj_in.0.weight \
                     or net.blocks.N.f.net… + to_embed + to_logits.1), gmlp-tinygrad (layers.N.channel_proj.weight + \
                     layers.N.spatial_gating_unit.gating_matrix) or native (blocks.N.sgu.spatial.weight + \
                     embed.weight/stem.weight); pass ",
                    ck.path().display(),
                    if seen.is_empty() { "nothing".to_string() } else { seen.join(", ") },
                    first.join(", ")
                ))
                .and(Setting::WeightsFormat)
                .then(" to choose"),
            ))
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
        Format::Timm => timm::timm(ck, hints)?,
        Format::Lucidrains => lucidrains::lucidrains(ck, hints)?,
        Format::GmlpGpt => gpt::gpt(ck, hints)?,
        Format::Tinygrad => tinygrad::tinygrad(ck, hints)?,
        Format::Native => native::native(ck, hints)?,
    };
    config.validate()?;
    Ok((format, config, rules))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A checkpoint in memory holding a one-element f32 tensor under each name.
    fn checkpoint(names: &[&str]) -> Checkpoint {
        let data = 1f32.to_le_bytes();
        let views: Vec<(String, safetensors::tensor::TensorView)> = names
            .iter()
            .map(|n| {
                let view =
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1], &data)
                        .unwrap();
                (n.to_string(), view)
            })
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap();
        Checkpoint::from_bytes(Path::new("t.safetensors"), bytes).unwrap()
    }

    #[test]
    fn each_layout_is_recognized_by_its_two_markers() {
        let timm = checkpoint(&["stem.proj.weight", "blocks.0.mlp_channels.gate.proj.weight"]);
        assert_eq!(recognize(&timm).unwrap(), Format::Timm);
        let lucid = checkpoint(&["layers.0.fn.fn.fn.proj_in.0.weight", "to_embed.weight"]);
        assert_eq!(recognize(&lucid).unwrap(), Format::Lucidrains);
        let old_lucid = checkpoint(&["layers.3.fn.fn.proj_in.0.weight", "to_patch_embed.1.weight"]);
        assert_eq!(recognize(&old_lucid).unwrap(), Format::Lucidrains);
        let native = checkpoint(&["blocks.0.sgu.spatial.weight", "embed.weight"]);
        assert_eq!(recognize(&native).unwrap(), Format::Native);
    }

    #[test]
    fn one_marker_or_two_layouts_are_not_enough_and_the_error_says_what_was_seen() {
        let half = checkpoint(&["stem.proj.weight", "other"]);
        // The rendering of the family: what was recognized, and the first tensors.
        let err = recognize(&half).unwrap_err().to_string();
        assert!(err.contains("recognized: stem.proj.weight (timm)"), "{err}");
        assert!(
            err.contains("first tensors: other, stem.proj.weight"),
            "{err}"
        );
        let both = checkpoint(&[
            "stem.proj.weight",
            "blocks.0.mlp_channels.gate.proj.weight",
            "blocks.0.sgu.spatial.weight",
            "embed.weight",
        ]);
        assert!(recognize(&both).is_err());
        let nothing = checkpoint(&["x"]);
        let err = recognize(&nothing).unwrap_err();
        assert!(
            matches!(&err, Error::UnknownLayout(p) if p.settings().eq([Setting::WeightsFormat])),
            "{err:?}"
        );
        // The layer index must be a number for the g-mlp-pytorch nesting marker.
        assert!(lucid_nesting(&checkpoint(&["layers.x.fn.fn.proj_in.0.weight"])).is_none());
    }
}
