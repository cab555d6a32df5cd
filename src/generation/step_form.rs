//! Which static step a decoding file runs, and what the fused one would gain on it
//! (docs/static-state.md, "The onnxruntime step"). A static-state file built for the
//! default target runs the portable step, which every runtime reads; `--target onnxruntime`
//! writes the same network's step in ONNX Runtime's fused kernels, the fastest form there
//! and one tract cannot read. A decoder never rewrites the user's file: it says which form
//! the file has ([`StepForm::of`]), and on request measures the fused form of the same
//! configuration beside it ([`fused_twin`]: a step's time does not depend on the weights'
//! values, so the twin has seeded ones and is built in memory).

use std::path::Path;
use std::sync::Arc;

use clap::ValueEnum;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::generation::model::DecodingFile;
use crate::gmlp::export::export_for;
use crate::gmlp::init::{InitScheme, SeededInit};
use crate::gmlp::interface::{DecodingInfo, SequenceMode};
use crate::gmlp::metadata::{parse_config, CONFIG_KEY, DECODING_KEY, TARGET_KEY};
use crate::gmlp::targets::{BuildTarget, Target};
use crate::gmlp::{fused_gap, fused_kernels_apply, GmlpConfig};
use crate::onnx::proto::ModelProto;
use crate::onnx::reader::metadata_value;
use crate::onnx::writer::encode_model_to_vec;

/// The static step a file runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepForm {
    /// ONNX Runtime's fused kernels (`--target onnxruntime`): SkipLayerNormalization, the
    /// joined projections, TensorScatter, Attention.
    Fused,
    /// The portable step every runtime reads, of a configuration whose step
    /// `--target onnxruntime` writes fused.
    PortableFusable,
    /// The portable step, of a configuration the fused step does not cover (RMSNorm, token
    /// shift, windows, a reversible stack, int8 spatial weights, …).
    Portable,
}

impl StepForm {
    /// The form of a static-state file of this tool, from its metadata (the configuration,
    /// the target, the opset); `None` for any other file.
    pub fn of(model: &ModelProto) -> Option<StepForm> {
        let cfg = metadata_value(model, CONFIG_KEY).and_then(parse_config)?;
        let target = Target::from_str(metadata_value(model, TARGET_KEY)?, false).ok()?;
        let opset = model
            .opset_import
            .iter()
            .find(|o| o.domain().is_empty())
            .map(|o| o.version())?;
        let mode = SequenceMode::Static;
        let info = DecodingInfo::parse(metadata_value(model, DECODING_KEY)?)?;
        if info.mode != mode {
            return None;
        }
        Some(if fused_kernels_apply(&cfg, mode, opset, target.forms()) {
            StepForm::Fused
        } else if fused_applies(&cfg) {
            StepForm::PortableFusable
        } else {
            StepForm::Portable
        })
    }

    /// The form's name, as `generate --json` and Python's `Generator.step_form` give it.
    pub fn name(self) -> &'static str {
        match self {
            StepForm::Fused => "fused",
            StepForm::PortableFusable => "portable-fusable",
            StepForm::Portable => "portable",
        }
    }

    /// The form in words, for a report.
    pub fn describe(self) -> &'static str {
        match self {
            StepForm::Fused => "the fused static step (ONNX Runtime's kernels)",
            StepForm::PortableFusable | StepForm::Portable => "the portable static step",
        }
    }
}

/// Whether `--target onnxruntime` writes `cfg`'s static step in the fused kernels.
fn fused_applies(cfg: &GmlpConfig) -> bool {
    let target = Target::OnnxRuntime;
    fused_kernels_apply(
        cfg,
        SequenceMode::Static,
        target.default_opset(),
        target.forms(),
    )
}

/// The fused static step of the configuration `model` records, with seeded weights, as a
/// decoding file held in memory under the name `label` (nothing is written; ONNX Runtime
/// loads it from memory as it loads every static state it binds). Refused for a file whose
/// step is fused already or whose configuration the fused step does not cover.
pub fn fused_twin(model: &ModelProto, label: &Path) -> Result<DecodingFile> {
    match StepForm::of(model) {
        Some(StepForm::PortableFusable) => {}
        Some(StepForm::Fused) => {
            return Err(Error::Conflict(
                "the file runs the fused static step already: there is no fused form to compare"
                    .into(),
            ))
        }
        Some(StepForm::Portable) => {
            let gap = metadata_value(model, CONFIG_KEY)
                .and_then(parse_config)
                .and_then(|cfg| {
                    let target = Target::OnnxRuntime;
                    fused_gap(&cfg, SequenceMode::Static, target.default_opset())
                })
                .unwrap_or_else(|| "this configuration".into());
            return Err(Error::Unsupported(format!(
                "the fused static step (--target onnxruntime) does not cover {gap}"
            )));
        }
        None => {
            return Err(Error::Conflict(
                "only a static-state file (--with-past static) has a fused step to compare".into(),
            ))
        }
    }
    let cfg = metadata_value(model, CONFIG_KEY)
        .and_then(parse_config)
        .ok_or_else(|| Error::Internal("a static-state file without its configuration".into()))?;
    let weights = Arc::new(SeededInit {
        seed: 0,
        scheme: InitScheme::Paper,
    });
    let target = BuildTarget::resolve(Target::OnnxRuntime, None)?;
    let built = export_for(
        &cfg,
        weights,
        "seeded (the fused twin of a file)",
        None,
        &target,
        SequenceMode::Static,
    )?;
    let bytes = encode_model_to_vec(&built.graph, &built.info)?;
    DecodingFile::from_bytes(label, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::reader::read_model;

    /// The form read back from files built for each target, and the twin's form.
    #[test]
    fn the_form_follows_the_target_and_the_twin_is_fused() {
        let dir = tempfile::tempdir().unwrap();
        let portable = crate::runtime::testing::write_tiny(dir.path(), SequenceMode::Static);
        let model = read_model(&portable).unwrap();
        assert_eq!(StepForm::of(&model), Some(StepForm::PortableFusable));
        let twin = fused_twin(&model, &dir.path().join("twin.onnx")).unwrap();
        assert_eq!(StepForm::of(twin.decoded()), Some(StepForm::Fused));
        assert!(matches!(
            fused_twin(twin.decoded(), &dir.path().join("again.onnx")),
            Err(Error::Conflict(_))
        ));
        let growing = crate::runtime::testing::write_tiny(dir.path(), SequenceMode::Growing);
        assert_eq!(StepForm::of(&read_model(&growing).unwrap()), None);
        assert!(!dir.path().join("twin.onnx").exists(), "nothing written");
    }

    #[test]
    fn the_names_are_the_json_names() {
        for form in [
            StepForm::Fused,
            StepForm::PortableFusable,
            StepForm::Portable,
        ] {
            let json = serde_json::to_string(&form).unwrap();
            assert_eq!(json, format!("\"{}\"", form.name()));
        }
    }
}
