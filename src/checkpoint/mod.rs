//! Trained checkpoints: reading tensors from a file (`file.rs`: safetensors, memory-mapped;
//! NumPy `.npz`; PyTorch `torch.save` files through a restricted unpickler, [`pytorch`]),
//! recognizing the layout (`recognize.rs`), inferring the architecture from names and
//! shapes, and serving the values as a [`WeightSource`].
//!
//! Five layouts ([`Format`]), one module each, citing the upstream code it mirrors:
//! - native (`native.rs`): this project's own names ([`crate::gmlp::weights`]), with the
//!   configuration in the safetensors metadata when `--save-weights` wrote it;
//! - timm (`timm.rs`): `MlpMixer` gMLP vision models (`gmlp_s16_224`);
//! - g-mlp-pytorch (`lucidrains.rs`): lucidrains' `gMLP` and `gMLPVision`, with dense or
//!   circulant spatial weights, tiny attention, token shift;
//! - g-mlp-gpt (`gpt.rs`): lucidrains' causal language model, sequential or reversible, with
//!   local windows and axial folds;
//! - gmlp-tinygrad (`tinygrad.rs`): a backbone of RMSNorm blocks without embedding or head.
//!
//! Each upstream layout is an `infer` function, reading the architecture from the shapes
//! (and the hints, for what no weight shows), kept apart from a table of names: one row
//! per native module, giving its upstream name and how the values map (as they are, a
//! transposed `Linear`, a dense or circulant spatial weight; `Map` in `plan.rs`). One walk,
//! `map_names` in `plan.rs`, goes over the parameters of the inferred architecture
//! ([`crate::gmlp::weights::param_specs`]) and looks each up in the table, so a new native
//! parameter is a row in the tables of the layouts that have it, and a new layout is a
//! table and an `infer`. The native layout needs no table: its names are the native ones.
//!
//! Every tensor the model needs is checked by name and shape before anything is written;
//! values (NaN/Inf, Toeplitz structure) are checked as each tensor is produced.

mod file;
mod gpt;
mod lucidrains;
mod native;
mod pickle;
mod plan;
pub mod pytorch;
mod recognize;
mod stored_spatial;
mod timm;
mod tinygrad;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub use file::{Checkpoint, MemoryTensor, MemoryType, StoredType, TensorBytes};
pub use native::save_native;
pub use recognize::{plan, Format};
pub use stored_spatial::StoredSpatial;

use crate::error::{Error, Result};
use crate::gmlp::config::{GateAct, GmlpConfig, SpatialForm};
use crate::gmlp::weights::{stream_columns_whole, stream_whole, ParamSpec, WeightSource};
use crate::message::{Phrase, Setting};
use crate::tensor::F32Sink;

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
    /// The sequence length, for layouts whose weights do not show it (a g-mlp-gpt model
    /// whose every layer is windowed); checked against the weights where they do.
    pub seq_len: Option<usize>,
    /// The gate activation (g-mlp-pytorch's and g-mlp-gpt's `act`: no weights show it).
    pub gate_act: GateAct,
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
            seq_len: None,
            gate_act: GateAct::Identity,
            toeplitz_tolerance: TOEPLITZ_TOLERANCE,
        }
    }
}

/// How one native parameter is made from checkpoint tensors.
#[derive(Clone, Debug, PartialEq)]
pub enum Rule {
    /// The tensor's values unchanged (the shapes may differ only by reshaping).
    Same(String),
    /// A 2-D PyTorch `Linear.weight [out, in]` transposed to `[in, out]`.
    Transposed(String),
    /// A spatial weight, in the stored form, converted to the configured one.
    Spatial(StoredSpatial),
}

/// A checkpoint with its architecture and the rule for each native parameter.
#[derive(Debug)]
pub struct Import {
    /// The recognized layout.
    pub format: Format,
    /// The architecture read from the checkpoint (and the hints).
    pub config: GmlpConfig,
    /// The checkpoint.
    pub checkpoint: Arc<Checkpoint>,
    /// Native parameter name → rule.
    pub rules: BTreeMap<String, Rule>,
    /// Checkpoint tensors no rule uses (allowed only with `allow_unused`).
    pub unused: Vec<String>,
    /// Relative tolerance for accepting a dense W as Toeplitz.
    pub toeplitz_tolerance: f32,
}

/// Default relative tolerance (of max|W|) for accepting a dense W as Toeplitz.
pub const TOEPLITZ_TOLERANCE: f32 = 1e-5;

impl Import {
    /// Reads `path`, recognizes its layout (or uses `format`), infers the architecture,
    /// and checks every tensor name and shape.
    pub fn open(path: &Path, hints: &ImportHints) -> Result<Import> {
        Self::from_checkpoint(Checkpoint::open(path)?, hints)
    }

    /// Recognizes and checks an already opened checkpoint, as [`Import::open`] does.
    pub fn from_checkpoint(checkpoint: Checkpoint, hints: &ImportHints) -> Result<Import> {
        let checkpoint = Arc::new(checkpoint);
        let path = checkpoint.path().to_path_buf();
        let (format, config, rules) = plan(&checkpoint, hints)?;
        let mut used = std::collections::BTreeSet::new();
        for rule in rules.values() {
            match rule {
                Rule::Same(k) | Rule::Transposed(k) => {
                    used.insert(k.clone());
                }
                Rule::Spatial(s) => used.extend(s.keys()),
            }
        }
        used.extend(format.buffers(&checkpoint));
        let unused: Vec<String> = checkpoint
            .keys()
            .filter(|k| !used.contains(*k))
            .map(str::to_string)
            .collect();
        if !unused.is_empty() && !hints.allow_unused {
            let shown: Vec<&str> = unused.iter().take(5).map(String::as_str).collect();
            return Err(Error::Setting(
                Phrase::text(format!(
                    "{}: {} unexpected tensor(s) for a {} checkpoint: {}{} (pass ",
                    path.display(),
                    unused.len(),
                    format.name(),
                    shown.join(", "),
                    if unused.len() > 5 { ", ..." } else { "" }
                ))
                .and(Setting::AllowUnused)
                .then(" to skip them knowingly)"),
            ));
        }
        Ok(Import {
            format,
            config,
            checkpoint,
            rules,
            unused,
            toeplitz_tolerance: hints.toeplitz_tolerance,
        })
    }

    /// A [`WeightSource`] serving this checkpoint's values for `config` (the imported
    /// architecture, possibly with another spatial form).
    pub fn weights(&self, config: &GmlpConfig) -> ImportedWeights {
        ImportedWeights {
            checkpoint: self.checkpoint.clone(),
            rules: self.rules.clone(),
            config: config.clone(),
            toeplitz_tolerance: self.toeplitz_tolerance,
        }
    }
}

/// Parameter values taken from a checkpoint by the rules of an [`Import`].
pub struct ImportedWeights {
    checkpoint: Arc<Checkpoint>,
    rules: BTreeMap<String, Rule>,
    config: GmlpConfig,
    toeplitz_tolerance: f32,
}

impl WeightSource for ImportedWeights {
    fn values(&self, spec: &ParamSpec) -> Result<Vec<f32>> {
        let rule = self.rules.get(&spec.name).ok_or_else(|| {
            Error::BadTensor(format!("no checkpoint tensor is mapped to {}", spec.name))
        })?;
        let ck = &self.checkpoint;
        let values = match rule {
            Rule::Same(key) => ck.f32(key)?,
            Rule::Transposed(key) => ck.f32_transposed(key)?,
            Rule::Spatial(stored) => {
                stored.values(ck, &self.config, &spec.name, self.toeplitz_tolerance)?
            }
        };
        if values.len() != spec.len() {
            return Err(Error::BadTensor(format!(
                "{}: the checkpoint gives {} values, the model needs {:?}",
                spec.name,
                values.len(),
                spec.shape
            )));
        }
        Ok(values)
    }

    fn columns(&self, spec: &ParamSpec, start: usize, end: usize) -> Result<Vec<f32>> {
        match self.rules.get(&spec.name) {
            // Columns of a transposed weight are rows of the stored one.
            Some(Rule::Transposed(key)) if spec.shape.len() == 2 => {
                let values = self.checkpoint.f32_transposed_rows(key, start, end)?;
                if values.len() != spec.shape[0] * (end - start) {
                    return Err(Error::BadTensor(format!(
                        "{}: the checkpoint gives {} values for columns {start}..{end}, the model needs {:?}",
                        spec.name,
                        values.len(),
                        spec.shape
                    )));
                }
                Ok(values)
            }
            _ => Ok(crate::gmlp::quantize::column_range(
                self.values(spec)?,
                spec.shape.get(1).copied().unwrap_or(1),
                start,
                end,
            )),
        }
    }

    fn stream(&self, spec: &ParamSpec, sink: &mut F32Sink<'_>) -> Result<()> {
        let ck = &self.checkpoint;
        match self.rules.get(&spec.name) {
            Some(Rule::Same(key)) if self.stored_len(key) == Some(spec.len()) => {
                ck.stream_f32(key, sink)
            }
            Some(Rule::Transposed(key)) if self.transposed_fits(key, spec) => {
                let rows = spec.shape[1];
                ck.stream_transposed_rows(key, (0, rows), sink)
            }
            // Spatial layouts, and counts `values` refuses with its own message.
            _ => stream_whole(self, spec, sink),
        }
    }

    fn stream_columns(
        &self,
        spec: &ParamSpec,
        start: usize,
        end: usize,
        sink: &mut F32Sink<'_>,
    ) -> Result<()> {
        match self.rules.get(&spec.name) {
            Some(Rule::Transposed(key)) if self.transposed_fits(key, spec) => self
                .checkpoint
                .stream_transposed_rows(key, (start, end), sink),
            _ => stream_columns_whole(self, spec, start, end, sink),
        }
    }
}

impl ImportedWeights {
    /// The element count of the checkpoint tensor `key`, by its shape.
    fn stored_len(&self, key: &str) -> Option<usize> {
        self.checkpoint.shape(key).map(|s| s.iter().product())
    }

    /// Whether the checkpoint tensor `key` is `[rows, cols]` where `spec` is `[cols, rows]`.
    fn transposed_fits(&self, key: &str, spec: &ParamSpec) -> bool {
        matches!(self.checkpoint.shape(key), Some(&[rows, cols]) if spec.shape == [cols, rows])
    }
}
