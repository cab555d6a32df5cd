//! `--target` profiles: for each deployment stack, the opset, spatial form and op forms it
//! accepts. A profile only picks defaults; explicit `--opset` and `--spatial` win, and a
//! combination that undoes the one thing a profile exists for is refused.
//!
//! What each profile answers (from trying files in each consumer, see docs/model.md,
//! "Targets", and docs/compatibility.md):
//! - ONNX Runtime ≤ 1.14 reads IR ≤ 8 and opsets ≤ 18 (`ort-legacy`);
//! - candle-onnx 0.11 has no `LayerNormalization`, reads `ReduceMean`'s `axes` only as the
//!   opset-13 attribute (and silently reduces every axis when given the opset-18 input),
//!   but reads `ReduceSum`'s `axes` input (`candle`);
//! - OpenCV 4.x dnn cannot import a `Gather` feeding a `MatMul` (the Toeplitz gather
//!   form; `opencv4`);
//! - onnx2torch has no converter for Split-18, Constant-19, Gelu-20, Constant-21 or
//!   ReduceMean-18 (any profile at opset ≤ 17);
//! - `portable` combines all of these: opset 13, LayerNorm as primitive ops with
//!   sum-then-divide means, Toeplitz expanded;
//! - tract 0.23 has no `TensorScatter` (opset 24), which writes the static state in place
//!   with its write index checked on the device: `onnxruntime` (earlier `ort-gpu`) is
//!   ONNX Runtime alone, at
//!   opset 24 (measured on an H200: a CUDA-graph step 0.528 ms vs 0.911 with `ScatterND`).
//!
//! No profile restricts the storage type: OpenCV 4.14 runs our f16 files (it converts f16
//! weights to f32 on import); OpenCV 5's classic engine refuses f16 tensors into `MatMul`,
//! which docs/model.md notes for users of that engine.

use clap::ValueEnum;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Precision, SpatialForm};
use crate::gmlp::interface::{first_local_block, SequenceMode, StateStart};
use crate::message::{Phrase, Setting};
use crate::onnx::forms::{Fusions, LayerNormForm, MeanForm, OpForms, PatchForm};
use crate::onnx::ops::TENSOR_SCATTER_OPSET;
use crate::onnx::versions::ir_version_for;
use crate::spelling::spelling;

/// A named deployment profile (`--target`; each variant's first doc paragraph is its
/// `--help` line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// ONNX Runtime >= 1.15, tract, OpenVINO, onnxruntime-node, onnx.reference, OpenCV 5:
    /// opset 17, LayerNormalization.
    ///
    /// The stacks that read today's graph.
    Ort,
    /// ONNX Runtime <= 1.14: IR <= 8, opset <= 18.
    ///
    /// Today's graph, opsets above 18 refused.
    OrtLegacy,
    /// ONNX Runtime 1.31 alone, CPU or CUDA (ort-gpu, its earlier name, still accepted):
    /// opset 24, its fused kernels in every mode (the fastest static step on either);
    /// refuses what they cannot express; not tract.
    ///
    /// At opset 24 the static state is written by `TensorScatter` (in place, its write
    /// index checked on the device), every mode is spelled in ONNX Runtime's fused kernels
    /// (the static step's the fastest this tool writes on the CPU provider too), and every
    /// node of a step can run on the GPU and be captured as a CUDA graph. tract 0.23 cannot
    /// read it (no `TensorScatter`, no contrib operators).
    #[value(name = "onnxruntime", alias = "ort-gpu")]
    #[serde(rename = "onnxruntime")]
    OnnxRuntime,
    /// tract and ONNX Runtime, the static step as fast as tract runs it: opset 17, its state
    /// read as it is up to the furthest sequence's row (buffers must start zeroed; not
    /// onnxruntime-genai).
    ///
    /// Today's graph but for the static state, whose step reads the rows of each state
    /// buffer up to the furthest sequence's last one as they are instead of a copy of all
    /// n rows with the unwritten ones replaced ([`StateStart::Zeroed`]): the copy of every
    /// state every step, which the default file makes so that a buffer may start holding
    /// anything, is gone, and the rows no sequence has reached are not read at all (a step's
    /// sizes follow its position, so it is no file for a CUDA graph). Every loop this
    /// project ships (the command, the library, Python, Triton) starts a sequence on zeroed
    /// buffers; onnxruntime-genai does not on every device and refuses such a file. A
    /// vision model's patch stem is one `MatMul` on the patches ([`PatchForm::MatMul`]),
    /// which tract keeps token-major.
    Tract,
    /// Widest reach (ONNX Runtime 1.14, candle-onnx, OpenCV 4.x, onnx2torch): opset 13,
    /// LayerNorm as primitive ops, Toeplitz expanded.
    ///
    /// The means of the primitive LayerNorm are sums then divisions.
    Portable,
    /// OpenCV 4.x dnn: Toeplitz expanded (no Gather feeding a MatMul).
    ///
    /// Opset 17.
    Opencv4,
    /// candle-onnx: LayerNorm as primitive ops, means as ReduceSum then Div.
    ///
    /// Opset 17.
    Candle,
}

/// The profile used when none is named.
pub const DEFAULT_TARGET: Target = Target::Ort;

impl Target {
    /// The command-line and metadata spelling.
    pub fn name(self) -> String {
        spelling(&self)
    }

    /// The opset the profile builds at unless `--opset` says otherwise.
    pub fn default_opset(self) -> i64 {
        match self {
            Target::Portable => 13,
            Target::OnnxRuntime => TENSOR_SCATTER_OPSET,
            _ => 17,
        }
    }

    /// The op forms the profile asks for.
    pub fn forms(self) -> OpForms {
        match self {
            Target::Portable | Target::Candle => OpForms {
                layer_norm: LayerNormForm::Decomposed,
                mean: MeanForm::SumThenDivide,
                fusions: Fusions::Standard,
                patch: PatchForm::Conv,
            },
            Target::OnnxRuntime => OpForms {
                fusions: Fusions::OnnxRuntime,
                ..OpForms::default()
            },
            Target::Tract => OpForms {
                patch: PatchForm::MatMul,
                ..OpForms::default()
            },
            Target::Ort | Target::OrtLegacy | Target::Opencv4 => OpForms::default(),
        }
    }

    /// What a static state's buffers must hold before a sequence's first run in the
    /// profile's files: zeros for `tract` and `onnxruntime` (their steps read every row as it
    /// is), anything for the others.
    pub fn state_start(self) -> StateStart {
        match self {
            Target::Tract | Target::OnnxRuntime => StateStart::Zeroed,
            _ => StateStart::Any,
        }
    }

    /// Whether the profile keeps the Toeplitz gather form (else it is stored expanded).
    pub fn allows_gather(self) -> bool {
        !matches!(self, Target::Portable | Target::Opencv4)
    }

    /// The sequence axis of a model built for the profile without `--fixed-seq` or
    /// `--with-past`: [`SequenceMode::default_for`] the model, except that `portable` and
    /// `opencv4` keep causal token models at the static `[batch, n]` input (OpenCV 4 dnn and
    /// OpenCV 5's classic engine refuse the `Shape` of a dynamic input: "!isDynamicShape").
    pub fn sequence_for(self, cfg: &GmlpConfig) -> SequenceMode {
        match self {
            Target::Portable | Target::Opencv4 => SequenceMode::Fixed,
            _ => SequenceMode::default_for(cfg),
        }
    }

    /// The state form of a plain `--with-past` (docs/static-state.md) and a one-line note
    /// on it: the static state written in place (the note names `--with-past growing`, the
    /// form earlier builds wrote), except where the file could not hold it or the profile's
    /// consumers could not read it; those get the growing state and a note why:
    /// - a block with a window or an axial fold (its state keeps only the rows its window
    ///   sees; `--with-past static` refuses it);
    /// - `portable` and `candle`: candle-onnx has no `Max`, the clamp of the static
    ///   state's position checks (it reads the growing form with LayerNorm decomposed);
    /// - `opencv4`: OpenCV 4 dnn imports neither form (the `Shape` of a dynamic input), and
    ///   the profile keeps the form earlier versions wrote.
    pub fn with_past_for(self, cfg: &GmlpConfig) -> (SequenceMode, Phrase) {
        let growing = |why: Phrase| {
            (
                SequenceMode::Growing,
                Phrase::setting(Setting::WithPast)
                    .then(" builds the growing state: ")
                    .append(why),
            )
        };
        if let Some(i) = first_local_block(cfg) {
            return growing(Phrase::text(format!(
                "block {i} has a window or an axial fold, whose state keeps only the rows its window sees"
            )));
        }
        match self {
            Target::Portable | Target::Candle => growing(Phrase::setting(Setting::Target).then(format!(
                " {} includes candle-onnx, which has no Max (the static state's position checks)",
                self.name()
            ))),
            Target::Opencv4 => growing(Phrase::setting(Setting::Target).then(
                " opencv4: OpenCV 4 dnn imports neither state form (the Shape of a dynamic input)",
            )),
            // Said once per build: earlier builds wrote the growing form here.
            Target::Ort | Target::OrtLegacy | Target::OnnxRuntime | Target::Tract => (
                SequenceMode::Static,
                Phrase::setting(Setting::WithPast)
                    .then(" builds the static state (a `position` input, n rows written in place: docs/static-state.md); ")
                    .and(Setting::GrowingState)
                    .then(" builds the growing state of earlier builds"),
            ),
        }
    }

    /// The highest opset the profile's consumers read, if it has one.
    pub fn max_opset(self) -> Option<i64> {
        match self {
            Target::OrtLegacy => Some(18),
            _ => None,
        }
    }

    /// One line on what the profile is for.
    pub fn summary(self) -> &'static str {
        match self {
            Target::Ort => {
                "ONNX Runtime >= 1.15, tract, OpenVINO, onnxruntime-node, onnx.reference, OpenCV 5"
            }
            Target::OrtLegacy => "ONNX Runtime <= 1.14 (IR <= 8, opset <= 18)",
            Target::OnnxRuntime => {
                "ONNX Runtime 1.31 alone, CPU or CUDA (opset 24: TensorScatter state, CUDA-graph ready; not tract)"
            }
            Target::Portable => {
                "widest reach: ONNX Runtime 1.14, candle-onnx, OpenCV 4.x, onnx2torch"
            }
            Target::Tract => {
                "tract and ONNX Runtime (the static step read as it is: state buffers start zeroed; not genai)"
            }
            Target::Opencv4 => "OpenCV 4.x dnn",
            Target::Candle => "candle-onnx",
        }
    }

    /// The spatial form to emit for a model whose own (preset or checkpoint) form is `own`:
    /// profiles without the gather form store Toeplitz W expanded; dense stays dense.
    pub fn spatial_for(self, own: SpatialForm) -> SpatialForm {
        if own == SpatialForm::ToeplitzGather && !self.allows_gather() {
            SpatialForm::ToeplitzExpand
        } else {
            own
        }
    }
}

/// A profile with the command line's explicit choices applied: what the graph is built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildTarget {
    /// The profile (recorded in the file's metadata).
    pub target: Target,
    /// The opset to build at.
    pub opset: i64,
    /// The op forms.
    pub forms: OpForms,
}

impl BuildTarget {
    /// The default profile at `opset` (what builds without `--target` get).
    pub fn at_opset(opset: i64) -> BuildTarget {
        BuildTarget {
            target: DEFAULT_TARGET,
            opset,
            forms: DEFAULT_TARGET.forms(),
        }
    }

    /// `target` with an explicit `--opset` (if any); refuses an opset the profile's
    /// consumers cannot read.
    pub fn resolve(target: Target, opset: Option<i64>) -> Result<BuildTarget> {
        let opset = opset.unwrap_or(target.default_opset());
        if let Some(max) = target.max_opset() {
            if opset > max {
                return Err(Error::Setting(
                    Phrase::setting(Setting::Target)
                        .then(format!(
                            " {} is for runtimes that read IR <= {} (opset <= {max}); opset {opset} needs IR {}: use ",
                            target.name(),
                            ir_version_for(max),
                            ir_version_for(opset)
                        ))
                        .and(Setting::Target)
                        .then(" ort"),
                ));
            }
        }
        Ok(BuildTarget {
            target,
            opset,
            forms: target.forms(),
        })
    }

    /// Refuses what the profile's consumers cannot run: the gather form where the profile
    /// stores W expanded (an explicit `--spatial toeplitz-gather`).
    pub fn check(&self, spatial: SpatialForm) -> Result<()> {
        let t = self.target;
        if spatial == SpatialForm::ToeplitzGather && !t.allows_gather() {
            return Err(Error::Setting(
                Phrase::setting(Setting::Target)
                    .then(format!(
                        " {} stores Toeplitz W expanded (its consumers cannot import a Gather feeding a MatMul); drop ",
                        t.name()
                    ))
                    .and(Setting::Spatial)
                    .then(" toeplitz-gather or use another target"),
            ));
        }
        Ok(())
    }

    /// Refuses `--dtype int4` and `int8-weight-only` for every profile but `ort`,
    /// `onnxruntime` and `tract`: their projections are ONNX
    /// Runtime's contrib operator `com.microsoft.MatMulNBits` (ONNX Runtime ≥ 1.17; OpenVINO
    /// reads it too, tract its 4-bit form), which ONNX Runtime ≤ 1.14, candle-onnx, OpenCV and
    /// onnx2torch do not have.
    pub fn check_dtype(&self, dtype: Precision) -> Result<()> {
        let t = self.target;
        let block = matches!(dtype, Precision::Int4 | Precision::Int8WeightOnly);
        if block && !matches!(t, Target::Ort | Target::OnnxRuntime | Target::Tract) {
            return Err(Error::Setting(
                Phrase::setting(Setting::Dtype)
                    .then(format!(
                        " {} uses ONNX Runtime's com.microsoft.MatMulNBits (ONNX Runtime >= 1.17, OpenVINO), which ",
                        dtype.name()
                    ))
                    .and(Setting::Target)
                    .then(format!(" {} consumers cannot read; use ", t.name()))
                    .and(Setting::Target)
                    .then(" ort"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--target tract`'s static step is the default file's with each state read at the rows
    /// its sequences reached instead of all n rows guarded (one `*_written_rows` Gather per
    /// state there, one `*_read_rows` Gather per state here, at the rows of one `Range`),
    /// and asks for zeroed buffers; every other node is the same operator at the same place.
    #[test]
    fn the_tract_step_is_the_default_step_reading_the_rows_reached() {
        use crate::gmlp::init::{InitScheme, SeededInit};
        use std::sync::Arc;
        let mut cfg = crate::gmlp::presets::preset("amlp-base")
            .unwrap()
            .config
            .clone();
        cfg.causal = true;
        cfg.layers = 2;
        let step = |t: Target| {
            let source = Arc::new(SeededInit {
                seed: 1,
                scheme: InitScheme::Spread,
            });
            let target = BuildTarget::resolve(t, None).unwrap();
            crate::gmlp::build_graph_in(&cfg, source, &target, SequenceMode::Static).unwrap()
        };
        let (plain, tract) = (step(Target::Ort), step(Target::Tract));
        let count = |g: &crate::onnx::graph::Graph, suffix: &str| {
            g.nodes.iter().filter(|n| n.name.ends_with(suffix)).count()
        };
        // Per block: the SGU state, the attention's keys and values.
        assert_eq!(count(&plain, "_written_rows"), 3 * cfg.layers);
        assert_eq!(count(&tract, "_written_rows"), 0);
        assert_eq!(count(&tract, "_read_rows"), 3 * cfg.layers);
        let ranges = tract.nodes.iter().filter(|n| n.op_type == "Range").count();
        assert_eq!(ranges, 1);
        // Every other node of the tract step is the default step's, by name and operator
        // (the rows reached are made once, by nodes named `read_*`).
        let plain_nodes: std::collections::HashMap<_, _> = plain
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.op_type.as_str()))
            .collect();
        for n in &tract.nodes {
            let local = n.name.rsplit('/').next().unwrap_or_default();
            if local.starts_with("read_") || local.ends_with("_read_rows") {
                continue;
            }
            assert_eq!(
                plain_nodes.get(n.name.as_str()),
                Some(&n.op_type.as_str()),
                "{}",
                n.name
            );
        }
        assert_eq!(tract.opset, plain.opset);
        assert!(tract.nodes.len() < plain.nodes.len());
        assert_eq!(Target::Tract.state_start(), StateStart::Zeroed);
        assert_eq!(Target::Ort.state_start(), StateStart::Any);
    }

    #[test]
    fn opencv_profiles_keep_causal_token_models_static() {
        let causal = crate::gmlp::presets::preset("amlp-base")
            .unwrap()
            .config
            .clone();
        let mut causal = causal;
        causal.causal = true;
        for &t in Target::value_variants() {
            let expected = match t {
                Target::Portable | Target::Opencv4 => SequenceMode::Fixed,
                _ => SequenceMode::Variable,
            };
            assert_eq!(t.sequence_for(&causal), expected, "{}", t.name());
        }
    }

    #[test]
    fn a_plain_with_past_is_static_unless_the_model_or_the_profile_cannot_take_it() {
        let mut causal = crate::gmlp::presets::preset("amlp-base")
            .unwrap()
            .config
            .clone();
        causal.causal = true;
        for &t in Target::value_variants() {
            let (mode, note) = t.with_past_for(&causal);
            match t {
                Target::Ort | Target::OrtLegacy | Target::OnnxRuntime | Target::Tract => {
                    assert_eq!(mode, SequenceMode::Static, "{}", t.name());
                    assert_eq!(
                        note.settings().collect::<Vec<_>>(),
                        [Setting::WithPast, Setting::GrowingState]
                    );
                    assert!(
                        note.to_string().contains(
                            "SequenceMode::Growing builds the growing state of earlier builds"
                        ),
                        "{note}"
                    );
                }
                Target::Portable | Target::Candle | Target::Opencv4 => {
                    assert_eq!(mode, SequenceMode::Growing, "{}", t.name());
                    assert!(
                        note.to_string().contains(&format!("target {}", t.name())),
                        "{note}"
                    );
                    assert_eq!(
                        note.settings().collect::<Vec<_>>(),
                        [Setting::WithPast, Setting::Target]
                    );
                }
            }
        }
        let mut windowed = causal.clone();
        windowed.block.token_mixing = vec![
            crate::gmlp::config::TokenMixing::GLOBAL,
            crate::gmlp::config::TokenMixing {
                window: Some(4),
                fold: 1,
            },
        ];
        let (mode, note) = Target::Ort.with_past_for(&windowed);
        assert_eq!(mode, SequenceMode::Growing);
        assert!(note.to_string().contains("block 1 has a window"), "{note}");
        assert!(SequenceMode::Static.check(&windowed).is_err());
    }

    #[test]
    fn the_default_profile_is_todays_graph() {
        let b = BuildTarget::resolve(DEFAULT_TARGET, None).unwrap();
        assert_eq!(b, BuildTarget::at_opset(17));
        assert_eq!(b.forms, OpForms::default());
        assert_eq!(
            Target::Ort.spatial_for(SpatialForm::ToeplitzGather),
            SpatialForm::ToeplitzGather
        );
    }

    #[test]
    fn portable_is_opset_13_decomposed_and_expanded() {
        let b = BuildTarget::resolve(Target::Portable, None).unwrap();
        assert_eq!((b.opset, ir_version_for(b.opset)), (13, 7));
        assert_eq!(b.forms.layer_norm, LayerNormForm::Decomposed);
        assert_eq!(b.forms.mean, MeanForm::SumThenDivide);
        assert_eq!(
            Target::Portable.spatial_for(SpatialForm::ToeplitzGather),
            SpatialForm::ToeplitzExpand
        );
        assert_eq!(
            Target::Portable.spatial_for(SpatialForm::Dense),
            SpatialForm::Dense
        );
        assert!(b.check(SpatialForm::ToeplitzGather).is_err());
        assert!(b.check(SpatialForm::ToeplitzExpand).is_ok());
        assert!(b.check(SpatialForm::Dense).is_ok());
        // An explicit opset wins; the op forms stay.
        let b21 = BuildTarget::resolve(Target::Portable, Some(21)).unwrap();
        assert_eq!((b21.opset, b21.forms), (21, b.forms));
    }

    #[test]
    fn ort_legacy_refuses_opsets_that_need_ir_9() {
        for opset in 13..=18 {
            let b = BuildTarget::resolve(Target::OrtLegacy, Some(opset)).unwrap();
            assert!(ir_version_for(b.opset) <= 8);
        }
        let err = BuildTarget::resolve(Target::OrtLegacy, Some(19)).unwrap_err();
        assert!(
            matches!(&err, Error::Setting(p) if p.settings().eq([Setting::Target, Setting::Target])),
            "{err:?}"
        );
    }
}
