//! The interface a causal token model's file offers a decoder (docs/design.md, "The causal
//! state"): how the sequence axis is emitted ([`SequenceMode`]), the names and shapes of the
//! per-block state of a `--with-past` graph, and the description of it stored in the
//! model's metadata. Decoding itself is src/generation/'s.
//!
//! At position t a causal block needs only u_s = LN_sgu(z2_s) for s ≤ t (and, for aMLP, the
//! keys and values k_s, v_s); everything else is per token. So the state of block i after
//! P tokens is `past_sgu.{i}` [batch, P, e] (+ `past_key.{i}`, `past_value.{i}`
//! [batch, P, a]); a run on T new tokens returns `present_*` = past followed by the T new
//! positions, and the position offset is P = `past_sequence`. With token shift
//! (`shift_tokens` = s), block i also needs its last s normalized inputs h = LN(x): the
//! window `past_shift.{i}` [batch, min(P, s), d] in, `present_shift.{i}` = the last
//! min(P + T, s) rows of past followed by the new ones out.
//!
//! The static form (`--with-past static`, [`SequenceMode::Static`]; docs/static-state.md)
//! keeps the same state at a fixed size instead: every state tensor is [batch, n, width]
//! (the token shift keeps all n normalized inputs too), a `position` input `[batch]` gives
//! each sequence's P, and a run writes only its T new rows into the state (`ScatterND`, or
//! `TensorScatter` at opset 24), so `present_*` can be the same buffer as `past_*`.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Task};
use crate::message::{Phrase, Setting};

/// Symbol of the number of new tokens in `input_ids` [batch, sequence].
pub const SEQUENCE: &str = "sequence";
/// Symbol of the number of tokens already in the state.
pub const PAST_SEQUENCE: &str = "past_sequence";
/// Symbol of past plus new tokens (the length of the `present_*` outputs).
pub const TOTAL_SEQUENCE: &str = "past_sequence + sequence";
/// Symbol of the rows in a token-shift window input, min(past_sequence, s).
pub const PAST_SHIFT_SEQUENCE: &str = "past_shift_sequence";
/// Symbol of the rows in a token-shift window output, min(past_sequence + sequence, s).
pub const PRESENT_SHIFT_SEQUENCE: &str = "present_shift_sequence";
/// Name of the static form's input of each sequence's position P, int64 `[batch]`.
pub const POSITION: &str = "position";

/// How the sequence axis of a token model is emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SequenceMode {
    /// `input_ids` [batch, n]: the whole sequence, every time (vision and bidirectional
    /// models, and causal ones built with `--fixed-seq`).
    Fixed,
    /// `input_ids` [batch, sequence], 1 ≤ sequence ≤ n; W and b sliced to the length
    /// (the default for causal token models).
    Variable,
    /// Variable length plus the per-block state in and out, growing with every token
    /// (`--with-past growing`): `past_*` [batch, P, width] in, `present_*` [batch, P + T,
    /// width] out. Spelled `with-past` in metadata and reports (the name of the earlier
    /// builds' only state form).
    #[serde(rename = "with-past")]
    Growing,
    /// Variable length plus fixed-size state written in place (`--with-past`, `--with-past
    /// static`): `past_*` and `present_*` [batch, n, width], a `position` `[batch]` input,
    /// the new rows scattered into the state.
    Static,
}

impl SequenceMode {
    /// The mode a build gets without `--fixed-seq` or `--with-past`: variable for causal
    /// token models, fixed otherwise.
    pub fn default_for(cfg: &GmlpConfig) -> SequenceMode {
        if cfg.causal && matches!(cfg.task, Task::Tokens { .. }) {
            SequenceMode::Variable
        } else {
            SequenceMode::Fixed
        }
    }

    /// The spelling in metadata and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            SequenceMode::Fixed => "fixed",
            SequenceMode::Variable => "variable",
            SequenceMode::Growing => "with-past",
            SequenceMode::Static => "static",
        }
    }

    /// How a file's doc string describes a causal model emitted in this mode.
    pub fn causal_description(self) -> &'static str {
        match self {
            SequenceMode::Fixed => ", causal",
            SequenceMode::Variable => ", causal, any length up to n",
            SequenceMode::Growing => ", causal, with past state",
            SequenceMode::Static => ", causal, with static state",
        }
    }

    /// Whether the graph carries state (`past_*` inputs, `present_*` outputs).
    pub fn has_state(self) -> bool {
        matches!(self, SequenceMode::Growing | SequenceMode::Static)
    }

    /// Refuses a mode the model cannot have: a variable length or state for a vision or
    /// bidirectional model (position i of a bidirectional model depends on positions
    /// after it, so a prefix is not a shorter input).
    pub fn check(self, cfg: &GmlpConfig) -> Result<()> {
        let mode = match self {
            SequenceMode::Fixed => return Ok(()),
            SequenceMode::Variable => Phrase::text("a variable sequence length"),
            SequenceMode::Growing | SequenceMode::Static => Phrase::setting(Setting::WithPast),
        };
        let refused = |why: &str| Err(Error::Setting(mode.clone().then(why)));
        match cfg.task {
            Task::Tokens { .. } => {}
            Task::Vision { .. } => {
                return refused(" applies to causal token models, and this is a vision model")
            }
            Task::Backbone { .. } => {
                return refused(
                    " applies to causal token models, and this is a backbone without embedding (inputs_embeds of n tokens)",
                )
            }
        }
        if !cfg.causal {
            return Err(Error::Setting(
                mode.then(" needs a causal model (")
                    .and(Setting::Causal)
                    .then(
                        "): in a bidirectional model every position depends on the tokens after it",
                    ),
            ));
        }
        if self == SequenceMode::Static {
            if let Some(i) = first_local_block(cfg) {
                return Err(static_local_mixing_refused(i));
            }
        }
        Ok(())
    }
}

/// Name of the bound step's greedy tokens, `ArgMax(logits)` over the vocabulary, int64
/// [batch, sequence] (every row's first largest logit) ([`Interface::BoundStep`]).
pub const NEXT_INPUT_IDS: &str = "next_input_ids";
/// Name of the bound step's next positions, `position + 1`, int64 \[batch\]
/// ([`Interface::BoundStep`]).
pub const NEXT_POSITION: &str = "next_position";

/// Name of the served static state's next position, `position` + the request's token
/// count, int64 [batch, 1] ([`Interface::Triton`]).
pub const TRITON_NEXT_POSITION: &str = "triton_next_position";

/// What a graph offers at its interface beyond the model's own inputs and outputs: chosen
/// when it is emitted, so that nothing is added to a graph afterwards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Interface {
    /// The file's: the inputs, the logits (or last hidden state) and the `present_*` state.
    #[default]
    File,
    /// A static-state step as ONNX Runtime's bound session runs it (src/generation/resident.rs):
    /// the file's interface and [`NEXT_INPUT_IDS`] and [`NEXT_POSITION`], so that a run
    /// leaves the next greedy step's inputs where that step reads them. Held in memory,
    /// never written.
    BoundStep,
    /// The interface Triton r24.10 keeps a sequence's state through (docs/serving.md,
    /// "With-past models"): in a growing state every `past_*` carries one leading slot
    /// along its rows (Triton's first state has one row, of zeros), sliced off before the
    /// model reads it and put back in front of its `present_*`; in a static state,
    /// `position` is declared [batch, 1] (a Triton state of dims `[ ]` gets no bytes) and
    /// [`TRITON_NEXT_POSITION`] gives the next request's. Stateless graphs are the file's.
    Triton,
    /// onnxruntime-genai's decoder (docs/genai.md; its names in gmlp/genai.rs), for a
    /// static state: each state tensor is one key or value of a genai layer, declared
    /// `[batch, 1, n, width]` and written in place by its scatter (the graph reads it
    /// through a `[batch, n, width]` view), a spare of a layer without a partner passed
    /// through unread; `position` is `position_ids[:, 0]`, and `attention_mask` is
    /// declared and unread.
    Genai {
        /// Whether the vocabulary gets one more id, the end token genai needs and the model
        /// has none of: its logit is −∞ (never picked), and an `input_ids` entry at or past
        /// it (genai's pads) reads the last real embedding row.
        added_end_token: bool,
    },
}

impl Interface {
    /// Whether the file's decoding description (metadata `gmlp_onnx.decoding`) still
    /// describes the graph emitted with this interface: not genai's, whose inputs and
    /// state are genai's (a folder's model is no static-state file of this tool).
    pub fn keeps_decoding_description(self) -> bool {
        !matches!(self, Interface::Genai { .. })
    }

    /// Refuses an interface the graph's `mode` does not have: the bound step's outputs
    /// advance a static state's `position`, and genai's interface is a static state's.
    pub fn check(self, mode: SequenceMode) -> Result<()> {
        match (self, mode) {
            (Interface::File | Interface::Triton, _)
            | (Interface::BoundStep | Interface::Genai { .. }, SequenceMode::Static) => Ok(()),
            (Interface::BoundStep, _) => Err(Error::Internal(format!(
                "the bound step's outputs advance a static state, and this graph's sequence is {}",
                mode.as_str()
            ))),
            (Interface::Genai { .. }, _) => Err(Error::Internal(format!(
                "genai's interface shares a static state in place, and this graph's sequence is {}",
                mode.as_str()
            ))),
        }
    }
}

/// The refusal of a static state for a model whose block `i` mixes tokens locally.
pub fn static_local_mixing_refused(i: usize) -> Error {
    Error::Setting(
        Phrase::setting(Setting::StaticState)
            .then(format!(
                " does not support local token mixing (block {i} has a window or an axial fold, whose state keeps only the rows its window sees); use "
            ))
            .and(Setting::GrowingState),
    )
}

/// The first block whose token mixing is local (a window or an axial fold, g-mlp-gpt's
/// `window` / `attn_layers` folds), if any: its state keeps only the rows its window sees,
/// which the static state's fixed [batch, n, ·] rows cannot hold.
pub fn first_local_block(cfg: &GmlpConfig) -> Option<usize> {
    (0..cfg.layers).find(|&i| !cfg.block.mixing(i).is_global())
}

/// One state tensor of a `--with-past` graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateTensor {
    /// Block index i.
    pub block: usize,
    /// Graph input: `past_sgu.{i}`, `past_key.{i}`, `past_value.{i}` or `past_shift.{i}`.
    pub past: String,
    /// Graph output: `present_sgu.{i}`, ...
    pub present: String,
    /// Channels per token (e for the gate, a for keys and values, d for the token-shift
    /// window); the shape is [batch, past_sequence, width], float32 (or
    /// [batch, min(past_sequence, window), width] for a window).
    pub width: usize,
    /// For a window state (the token shift's s, a local window's (2w − 1)·e rows, a
    /// fold's `fold − 1`): the most positions it keeps; `None` for state that grows with
    /// every token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
}

impl StateTensor {
    /// The kind of state: `sgu`, `key`, `value`, `shift` or `fold` (from the name).
    pub fn kind(&self) -> &str {
        let rest = self.past.strip_prefix("past_").unwrap_or(&self.past);
        rest.split('.').next().unwrap_or(rest)
    }

    /// The symbol of the rows of the `past_*` input: `past_sequence` for state that
    /// grows, `past_shift_sequence` for the token-shift window, `past_window_K` for a
    /// window of K rows (local mixing).
    pub fn past_rows_symbol(&self) -> String {
        match self.window {
            None => PAST_SEQUENCE.to_string(),
            Some(_) if self.kind() == "shift" => PAST_SHIFT_SEQUENCE.to_string(),
            Some(k) => format!("past_window_{k}"),
        }
    }

    /// The symbol of the rows of the `present_*` output of a window state.
    pub fn present_rows_symbol(&self) -> String {
        match self.window {
            None => TOTAL_SEQUENCE.to_string(),
            Some(_) if self.kind() == "shift" => PRESENT_SHIFT_SEQUENCE.to_string(),
            Some(k) => format!("present_window_{k}"),
        }
    }
}

/// The state of block `i`: what a `--with-past` graph takes and returns for it, part by
/// part: the spatial projection's u = LN(z2) (`sgu`), the tiny attention's keys and values
/// (`key`, `value`; a local attention uses its keys as values and has no `value`), the token shift's last s normalized inputs (`shift`), and an axial
/// fold's last `fold − 1` block outputs for its causal convolution (`fold`). A block with
/// a local window w (and fold e) keeps only the last (2w − 1)·e rows its window can still
/// see; when every block is windowed, block 0's `sgu` state still grows, so that the graph
/// knows the position P from its length.
pub fn block_state(cfg: &GmlpConfig, i: usize) -> Vec<StateTensor> {
    let one = |kind: &str, width: usize, window: Option<usize>| StateTensor {
        block: i,
        past: format!("past_{kind}.{i}"),
        present: format!("present_{kind}.{i}"),
        width,
        window,
    };
    let mixing = cfg.block.mixing(i);
    let every_block_windowed = (0..cfg.layers).all(|k| cfg.block.mixing(k).window.is_some());
    let window = mixing.window.map(|w| (2 * w - 1) * mixing.fold);
    let sgu_window = if i == 0 && every_block_windowed {
        None
    } else {
        window
    };
    let mut out = vec![one("sgu", cfg.gate_dim(), sgu_window)];
    if let Some(a) = cfg.attn_dim {
        out.push(one("key", a, window));
        // g-mlp-gpt's LocalAttention uses its keys as values: no value state.
        if mixing.window.is_none() {
            out.push(one("value", a, window));
        }
    }
    if cfg.shift_tokens > 0 {
        out.push(one("shift", cfg.d_model, Some(cfg.shift_tokens)));
    }
    if mixing.fold > 1 {
        out.push(one("fold", cfg.d_model, Some(mixing.fold - 1)));
    }
    out
}

/// The state tensors of a graph emitted in `mode`, in graph order: [`block_state`] of
/// every block for `with-past`; for `static` the same tensors, each keeping all n rows
/// (no window); none otherwise.
pub fn mode_state(cfg: &GmlpConfig, mode: SequenceMode) -> Vec<StateTensor> {
    let all = (0..cfg.layers).flat_map(|i| block_state(cfg, i));
    match mode {
        SequenceMode::Growing => all.collect(),
        SequenceMode::Static => all.map(|s| StateTensor { window: None, ..s }).collect(),
        SequenceMode::Fixed | SequenceMode::Variable => Vec::new(),
    }
}

/// What a static state's buffers must hold before a sequence's first run (the metadata's
/// `state_start`; docs/static-state.md, "Unwritten rows").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StateStart {
    /// Anything, NaN included: the graph reads every row after a sequence's last written
    /// one as that row (static_state.rs's read of the written rows), so no answer depends
    /// on what the buffer held.
    #[default]
    Any,
    /// Zeros (or any finite values): the graph reads every row, those after a sequence's
    /// last one with a weight of 0, which a NaN there would turn into NaN (`--target
    /// onnxruntime`'s fused step, which saves the copy of every state every step). Every loop
    /// the project ships starts a sequence on zeroed buffers.
    Zeroed,
}

impl StateStart {
    fn is_any(&self) -> bool {
        *self == StateStart::Any
    }
}

/// What the metadata key `gmlp_onnx.decoding` holds for a variable-length or with-past model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodingInfo {
    /// `variable`, `with-past` or `static`.
    pub mode: SequenceMode,
    /// Largest past_sequence + sequence (n).
    pub max_sequence: usize,
    /// State tensors in graph order (empty for `variable`).
    pub state: Vec<StateTensor>,
    /// Bytes of state per token per block (f32), for one example.
    pub state_bytes_per_token_per_block: usize,
    /// Bytes of the token-shift window per block (f32, one example) once it is full;
    /// 0 without token shift.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub window_bytes_per_block: usize,
    /// What the static state's buffers must hold before a sequence's first run (not
    /// written when anything will do, as in files before 0.6.0).
    #[serde(default, skip_serializing_if = "StateStart::is_any")]
    pub state_start: StateStart,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl DecodingInfo {
    /// The description of `cfg` emitted in `mode` (None for fixed models).
    pub fn of(cfg: &GmlpConfig, mode: SequenceMode) -> Option<DecodingInfo> {
        if mode == SequenceMode::Fixed {
            return None;
        }
        let state = mode_state(cfg, mode);
        // The largest block (every block of the paper's models is the same).
        let blocks: Vec<Vec<StateTensor>> = match mode {
            SequenceMode::Static => (0..cfg.layers)
                .map(|i| state.iter().filter(|s| s.block == i).cloned().collect())
                .collect(),
            _ => (0..cfg.layers).map(|i| block_state(cfg, i)).collect(),
        };
        let per_token: usize = blocks
            .iter()
            .map(|b| {
                b.iter()
                    .filter(|s| s.window.is_none())
                    .map(|s| s.width * 4)
                    .sum()
            })
            .max()
            .unwrap_or(0);
        // Only a with-past graph has the window (files without state keep their bytes).
        let window: usize = match mode {
            SequenceMode::Growing => blocks
                .iter()
                .map(|b| {
                    b.iter()
                        .filter_map(|s| s.window.map(|w| w * s.width * 4))
                        .sum()
                })
                .max()
                .unwrap_or(0),
            _ => 0,
        };
        Some(DecodingInfo {
            mode,
            max_sequence: cfg.seq_len(),
            state,
            state_bytes_per_token_per_block: per_token,
            window_bytes_per_block: window,
            state_start: StateStart::Any,
        })
    }

    /// As JSON.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string(self)
            .map_err(|e| Error::InvalidConfig(format!("decoding info to JSON: {e}")))
    }

    /// From the JSON stored in a model, if it is one.
    pub fn parse(json: &str) -> Option<DecodingInfo> {
        serde_json::from_str(json).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gmlp::presets::preset;

    #[test]
    fn modes_default_and_refuse_what_cannot_decode() {
        let mut cfg = preset("amlp-base").unwrap().config;
        assert_eq!(SequenceMode::default_for(&cfg), SequenceMode::Fixed);
        let err = SequenceMode::Growing.check(&cfg).unwrap_err();
        assert!(matches!(err, Error::Setting(_)), "{err:?}");
        cfg.causal = true;
        assert_eq!(SequenceMode::default_for(&cfg), SequenceMode::Variable);
        SequenceMode::Growing.check(&cfg).unwrap();
        cfg.shift_tokens = 1;
        SequenceMode::Growing.check(&cfg).unwrap();
        SequenceMode::Variable.check(&cfg).unwrap();
        let mut vision = preset("gmlp-ti16").unwrap().config;
        vision.causal = true;
        assert_eq!(SequenceMode::default_for(&vision), SequenceMode::Fixed);
        assert!(SequenceMode::Variable.check(&vision).is_err());
    }

    #[test]
    fn the_bound_step_and_genai_interfaces_are_a_static_states_only() {
        let genai = Interface::Genai {
            added_end_token: true,
        };
        for interface in [Interface::BoundStep, genai] {
            interface.check(SequenceMode::Static).unwrap();
            for mode in [
                SequenceMode::Fixed,
                SequenceMode::Variable,
                SequenceMode::Growing,
            ] {
                let err = interface.check(mode).unwrap_err();
                assert!(matches!(err, Error::Internal(_)), "{interface:?} {mode:?}");
            }
        }
        for mode in [SequenceMode::Growing, SequenceMode::Static] {
            Interface::Triton.check(mode).unwrap();
            Interface::File.check(mode).unwrap();
        }
        assert!(!genai.keeps_decoding_description());
        assert!([Interface::File, Interface::BoundStep, Interface::Triton]
            .iter()
            .all(|i| i.keeps_decoding_description()));
    }

    #[test]
    fn state_names_and_bytes_follow_the_block() {
        let mut cfg = preset("amlp-base").unwrap().config;
        cfg.causal = true;
        cfg.layers = 2;
        let info = DecodingInfo::of(&cfg, SequenceMode::Growing).unwrap();
        let names: Vec<&str> = info.state.iter().map(|s| s.past.as_str()).collect();
        assert_eq!(
            names,
            [
                "past_sgu.0",
                "past_key.0",
                "past_value.0",
                "past_sgu.1",
                "past_key.1",
                "past_value.1"
            ]
        );
        assert_eq!(info.state[4].present, "present_key.1");
        // e = 1536 and a = 64: (1536 + 2·64)·4 bytes.
        assert_eq!(info.state_bytes_per_token_per_block, 6656);
        assert_eq!(info.max_sequence, 512);
        let back = DecodingInfo::parse(&info.to_json().unwrap()).unwrap();
        assert_eq!(back, info);
        assert!(DecodingInfo::of(&cfg, SequenceMode::Fixed).is_none());
        let variable = DecodingInfo::of(&cfg, SequenceMode::Variable).unwrap();
        assert!(variable.state.is_empty());
        // Without token shift the JSON has no window fields (files built before them
        // keep their bytes).
        assert!(!info.to_json().unwrap().contains("window"));
    }

    #[test]
    fn token_shift_adds_a_window_per_block() {
        let mut cfg = preset("amlp-base").unwrap().config;
        cfg.causal = true;
        cfg.layers = 2;
        cfg.shift_tokens = 2;
        let info = DecodingInfo::of(&cfg, SequenceMode::Growing).unwrap();
        let shift: Vec<&StateTensor> = info.state.iter().filter(|s| s.window.is_some()).collect();
        assert_eq!(shift.len(), 2);
        assert_eq!(shift[1].past, "past_shift.1");
        assert_eq!(shift[1].present, "present_shift.1");
        assert_eq!((shift[1].width, shift[1].window), (512, Some(2)));
        // The window does not grow with the tokens: 2 rows of d = 512 floats.
        assert_eq!(info.state_bytes_per_token_per_block, 6656);
        assert_eq!(info.window_bytes_per_block, 2 * 512 * 4);
        let back = DecodingInfo::parse(&info.to_json().unwrap()).unwrap();
        assert_eq!(back, info);
        let variable = DecodingInfo::of(&cfg, SequenceMode::Variable).unwrap();
        assert_eq!(variable.window_bytes_per_block, 0);
    }
}
