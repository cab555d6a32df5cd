//! The network's input and its embedding: `input_ids` through the token embedding table
//! (fixed length n, or a variable length with the positions and state of a causal
//! model, growing or static), or `pixel_values` through the patch stem (a Conv with stride p, tokens in
//! row-major patch order, as timm's `PatchEmbed` and g-mlp-pytorch's `to_patch_embed`),
//! or, for a backbone, `inputs_embeds` as they are.

use super::context::Emitter;
use super::sequence::{FixedPositions, Sequence};
use super::{BATCH, INPUTS_EMBEDS, INPUT_IDS, PIXEL_VALUES};
use crate::error::Result;
use crate::gmlp::config::Task;
use crate::gmlp::emit::sequence::SequenceAxis;
use crate::gmlp::emit::static_state::GenaiInterface;
use crate::gmlp::interface::{Interface, SequenceMode, SEQUENCE};
use crate::onnx::graph::{Dim, ElemType, Value};

impl Emitter {
    /// The embedded input `[batch, n, d]`, for token models the embedding table (the tied
    /// output head reuses it), and the [`Sequence`] the blocks see: token models take
    /// `input_ids` and the inputs of `mode` (read in the vocabulary for genai's added end
    /// token); vision models and backbones have a fixed length.
    pub(crate) fn embed(&mut self, mode: SequenceMode) -> Result<(Value, Option<Value>, Sequence)> {
        let batch = Dim::Symbol(BATCH.into());
        match self.cfg.task.clone() {
            Task::Tokens { seq_len, .. } => {
                let seq = match mode {
                    SequenceMode::Fixed => Dim::Fixed(seq_len),
                    _ => Dim::Symbol(SEQUENCE.into()),
                };
                let mut ids =
                    self.g
                        .input(INPUT_IDS, ElemType::I64, vec![batch.clone(), seq.clone()])?;
                if let Interface::Genai {
                    added_end_token: true,
                } = self.interface
                {
                    ids = GenaiInterface::ids_in_vocabulary(self, &ids)?;
                }
                let declared = SequenceAxis::declare_sequence_inputs(self, mode, &batch)?;
                let table = self.param("embed.weight")?;
                let x = self.scoped("embed", |s| s.g.gather("gather", &table, &ids, 0))?;
                let sequence = SequenceAxis::start_sequence(self, declared, &ids, &seq)?;
                Ok((x, Some(table), sequence))
            }
            Task::Vision {
                image_size,
                patch_size,
                in_chans,
                ..
            } => {
                let pixels = self.g.input(
                    PIXEL_VALUES,
                    ElemType::F32,
                    vec![
                        batch.clone(),
                        Dim::Fixed(in_chans),
                        Dim::Fixed(image_size),
                        Dim::Fixed(image_size),
                    ],
                )?;
                let w = self.param("stem.weight")?;
                let b = self.param("stem.bias")?;
                let elem = self.cfg.dtype.elem();
                let x = self.scoped("stem", |s| {
                    let pixels = s.cast_to("input_to_f16", &pixels, elem)?;
                    s.g.patch_tokens(&pixels, &w, &b, patch_size)
                })?;
                Ok((x, None, Sequence::Fixed(FixedPositions::default())))
            }
            Task::Backbone { seq_len } => {
                let d = self.cfg.d_model;
                let embeds = self.g.input(
                    INPUTS_EMBEDS,
                    ElemType::F32,
                    vec![batch, Dim::Fixed(seq_len), Dim::Fixed(d)],
                )?;
                let elem = self.cfg.dtype.elem();
                let x = self.cast_to("inputs_to_f16", &embeds, elem)?;
                Ok((x, None, Sequence::Fixed(FixedPositions::default())))
            }
        }
    }
}
