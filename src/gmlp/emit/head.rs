//! The output head on the final normalized tokens: the vocabulary projection of a token
//! model (tied to the embedding, `logits = h · Eᵀ + bias`, as the paper's MLM models; or
//! its own weight, g-mlp-pytorch's `to_logits.1`), or a vision model's mean over tokens
//! and linear classifier (timm's `head`, g-mlp-pytorch's `to_logits.2`). Its nodes are in
//! the [`HEAD_SCOPE`] scope, which the paper's FLOP counts leave out.

use super::context::Emitter;
use super::linear::WeightForm;
use super::stack::Stacked;
use super::HEAD_SCOPE;
use crate::error::{Error, Result};
use crate::gmlp::config::Task;
use crate::gmlp::emit::block::BlockNorm;
use crate::onnx::graph::Value;

impl Emitter {
    /// The model's output from the stack's result: the final norm (adding the last
    /// block's branch where the fused spelling left it pending) and the head, or the
    /// residual stream itself for a backbone (gmlp-tinygrad has neither).
    pub(crate) fn output(&mut self, stacked: Stacked, embedding: Option<Value>) -> Result<Value> {
        let Stacked { x, pending } = stacked;
        if let Task::Backbone { .. } = self.cfg.task {
            return match pending {
                None => Ok(x),
                Some(branch) => {
                    let y = self.branch_value(branch)?;
                    self.g.add("residual", &x, &y)
                }
            };
        }
        let h = match pending {
            None => BlockNorm::norm(self, "final_norm", &x, "norm", self.cfg.norm_eps)?,
            Some(branch) => BlockNorm::skip_norm(self, "final_norm", &x, &branch, "norm")?.0,
        };
        self.head(&h, embedding)
    }

    /// Logits from the final normalized tokens `h`; `embedding` is the token table.
    fn head(&mut self, h: &Value, embedding: Option<Value>) -> Result<Value> {
        let tied = matches!(
            self.cfg.task,
            Task::Tokens {
                tied_embedding: true,
                ..
            }
        );
        self.scoped(HEAD_SCOPE, |s| match (&s.cfg.task, embedding) {
            (Task::Tokens { .. }, Some(table)) if tied => {
                // Output projection tied to the embedding: logits = h · Eᵀ + bias.
                // Quantized models: a quantized copy of the table for the head.
                let logits = match s.head_form() {
                    WeightForm::Float => {
                        let table_t = s.g.transpose("embed_transpose", &table, &[1, 0])?;
                        s.g.matmul("vocab_projection", h, &table_t)?
                    }
                    WeightForm::DynamicInt8 => {
                        s.tied_head_int8("vocab_projection", h, "embed.weight")?
                    }
                    WeightForm::Block { bits, block_size } => s.tied_head_block(
                        "vocab_projection",
                        h,
                        "embed.weight",
                        (bits, block_size),
                    )?,
                };
                let bias = s.param("head.bias")?;
                s.g.add("vocab_bias", &logits, &bias)
            }
            (Task::Tokens { .. }, _) => {
                let form = s.head_form();
                s.dense(
                    "vocab_projection",
                    h,
                    "head.weight",
                    Some("head.bias"),
                    None,
                    form,
                )
            }
            (Task::Backbone { .. }, _) => Err(Error::Internal("a backbone has no head".into())),
            (Task::Vision { .. }, _) => {
                let pooled = s.g.mean("token_mean", h, &[1], false)?;
                // The small classifier stays f32 in quantized models too.
                s.dense(
                    "classifier",
                    &pooled,
                    "head.weight",
                    Some("head.bias"),
                    None,
                    WeightForm::Float,
                )
            }
        })
    }
}
