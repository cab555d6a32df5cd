//! onnxruntime-genai's decoder interface (docs/genai.md), which a static-state graph is
//! emitted with for a genai folder ([`crate::gmlp::Interface::Genai`]): genai's input names
//! and which state tensor of the file becomes which key or value of a genai layer.
//!
//! genai's `DefaultKeyValueCache` (genai's models/kv_cache.cpp) keeps,
//! per layer L, a key `past_key_values.L.key` and a value `past_key_values.L.value` of
//! rank 4 `[batch, heads, max_length, head_size]`; the key and the value of one layer must
//! have the same shape, while the head size may differ between layers (it reads each
//! layer's from the model's declared inputs). A gMLP/aMLP block's state is one to three
//! tensors `[batch, n, width]` (`sgu`, and for aMLP `key`, `value`; `shift` with token
//! shift), so the tensors are paired by width, in graph order, each as one head of its
//! width: aMLP's keys and values pair within their block, the gates' `sgu` states pair
//! across blocks. A tensor left without a partner gets a spare one that the model never
//! reads (it passes through unchanged, in place when genai shares past and present).

use serde::{Deserialize, Serialize};

use crate::gmlp::config::GmlpConfig;
use crate::gmlp::interface::{mode_state, SequenceMode, StateTensor};

/// genai's input of each token's position (`decoder.inputs.position_ids`), int64
/// [batch, sequence]: the graph's `position` is its first column.
pub const POSITION_IDS: &str = "position_ids";
/// genai's attention mask input (`decoder.inputs.attention_mask`), int64
/// [batch, total_sequence]: declared as genai feeds it, and unread (the state's rows and
/// the causal weights already say which tokens count).
pub const ATTENTION_MASK: &str = "attention_mask";

/// Name template of genai's past keys (`decoder.inputs.past_key_names`).
pub const PAST_KEY: &str = "past_key_values.%d.key";
/// Name template of genai's past values (`decoder.inputs.past_value_names`).
pub const PAST_VALUE: &str = "past_key_values.%d.value";
/// Name template of genai's present keys (`decoder.outputs.present_key_names`).
pub const PRESENT_KEY: &str = "present.%d.key";
/// Name template of genai's present values (`decoder.outputs.present_value_names`).
pub const PRESENT_VALUE: &str = "present.%d.value";

/// What fills the key or the value of a genai layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Slot {
    /// The built file's state tensor of this name (`past_sgu.0`, …; present likewise).
    State {
        /// The built file's `past_*` input.
        past: String,
        /// The built file's `present_*` output.
        present: String,
    },
    /// A spare of the partner's shape, passed through and never read.
    Spare,
}

/// One genai layer: a key and a value of shape `[batch, 1, n, width]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenaiLayer {
    /// Layer index L in genai's names.
    pub index: usize,
    /// head_size: the width of both tensors.
    pub width: usize,
    /// What the key holds.
    pub key: Slot,
    /// What the value holds.
    pub value: Slot,
}

impl GenaiLayer {
    /// genai's names of the key and value inputs and outputs:
    /// `[(past key, present key, slot), (past value, present value, slot)]`.
    pub fn tensors(&self) -> [(String, String, &Slot); 2] {
        let name = |template: &str| template.replace("%d", &self.index.to_string());
        [
            (name(PAST_KEY), name(PRESENT_KEY), &self.key),
            (name(PAST_VALUE), name(PRESENT_VALUE), &self.value),
        ]
    }
}

/// The genai layers of `cfg`'s static state ([`pair_states`] of its state tensors).
pub fn genai_layers(cfg: &GmlpConfig) -> Vec<GenaiLayer> {
    pair_states(&mode_state(cfg, SequenceMode::Static))
}

/// The genai layers of a static-state file's `state` (in graph order): each tensor is
/// paired with the next unpaired one of the same width; one left over gets a
/// [`Slot::Spare`]. Every state tensor appears exactly once.
pub fn pair_states(state: &[StateTensor]) -> Vec<GenaiLayer> {
    let mut layers: Vec<GenaiLayer> = Vec::new();
    // Index in `layers` of the layer still waiting for a value, by width.
    let mut waiting: Vec<(usize, usize)> = Vec::new();
    for s in state {
        let slot = Slot::State {
            past: s.past.clone(),
            present: s.present.clone(),
        };
        match waiting.iter().position(|&(w, _)| w == s.width) {
            Some(k) => {
                let (_, layer) = waiting.remove(k);
                layers[layer].value = slot;
            }
            None => {
                waiting.push((s.width, layers.len()));
                layers.push(GenaiLayer {
                    index: layers.len(),
                    width: s.width,
                    key: slot,
                    value: Slot::Spare,
                });
            }
        }
    }
    layers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(kind: &str, block: usize, width: usize) -> StateTensor {
        StateTensor {
            block,
            past: format!("past_{kind}.{block}"),
            present: format!("present_{kind}.{block}"),
            width,
            window: None,
        }
    }

    fn past(slot: &Slot) -> &str {
        match slot {
            Slot::State { past, .. } => past,
            Slot::Spare => "spare",
        }
    }

    #[test]
    fn amlp_keys_pair_in_their_block_gates_across_blocks_and_a_lone_one_gets_a_spare() {
        let mut s = Vec::new();
        for b in 0..3 {
            s.extend([
                state("sgu", b, 96),
                state("key", b, 16),
                state("value", b, 16),
            ]);
        }
        let layers = pair_states(&s);
        let pairs: Vec<(usize, &str, &str)> = layers
            .iter()
            .map(|l| (l.width, past(&l.key), past(&l.value)))
            .collect();
        assert_eq!(
            pairs,
            vec![
                (96, "past_sgu.0", "past_sgu.1"),
                (16, "past_key.0", "past_value.0"),
                (16, "past_key.1", "past_value.1"),
                (96, "past_sgu.2", "spare"),
                (16, "past_key.2", "past_value.2"),
            ]
        );
        assert_eq!(
            layers.iter().map(|l| l.index).collect::<Vec<_>>(),
            (0..5).collect::<Vec<_>>()
        );
        let names = layers[4].tensors();
        assert_eq!(names[0].2, &layers[4].key);
        assert_eq!(names[0].0, "past_key_values.4.key");
        assert_eq!(names[1].1, "present.4.value");
    }

    #[test]
    fn an_even_gmlp_needs_no_spare() {
        let s: Vec<_> = (0..4).map(|b| state("sgu", b, 8)).collect();
        let layers = pair_states(&s);
        assert_eq!(layers.len(), 2);
        assert!(layers.iter().all(|l| l.value != Slot::Spare));
    }
}
