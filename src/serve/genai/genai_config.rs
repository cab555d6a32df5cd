//! `genai_config.json`, as onnxruntime-genai 0.18 reads it (genai's config.cpp): the model's
//! type and token ids, the decoder's file, names and sizes, and the search defaults.
//! Only the fields a gMLP folder sets are written; genai fills in the rest.

use serde::Serialize;

use crate::gmlp::emit::{INPUT_IDS, LOGITS};
use crate::gmlp::genai::{ATTENTION_MASK, POSITION_IDS};
use crate::gmlp::genai::{PAST_KEY, PAST_VALUE, PRESENT_KEY, PRESENT_VALUE};

/// The whole file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GenaiConfig {
    /// `model`.
    pub model: ModelSection,
    /// `search`: the defaults of `og.GeneratorParams`.
    pub search: SearchSection,
}

/// `model`: what genai needs to know of the model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelSection {
    /// `decoder`, genai's generic decoder-only type (genai's models/model_type.h).
    #[serde(rename = "type")]
    pub kind: String,
    /// Token that starts a sequence (genai adds none to a prompt; the end token here).
    pub bos_token_id: i64,
    /// Token that ends a sequence.
    pub eos_token_id: i64,
    /// Token of a batch's right padding (genai gives pads position 0).
    pub pad_token_id: i64,
    /// Entries of the logits.
    pub vocab_size: usize,
    /// Positions the model holds: n.
    pub context_length: usize,
    /// `decoder`.
    pub decoder: DecoderSection,
}

/// `model.decoder`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecoderSection {
    /// ONNX Runtime session options (`provider_options` empty: the CPU).
    pub session_options: SessionOptions,
    /// The model file in the folder.
    pub filename: String,
    /// d_model.
    pub hidden_size: usize,
    /// Heads of a layer's key and value: one.
    pub num_attention_heads: usize,
    /// Same as `num_attention_heads`.
    pub num_key_value_heads: usize,
    /// Width of layer 0's key and value (genai reads each layer's from the model).
    pub head_size: usize,
    /// Layers of keys and values.
    pub num_hidden_layers: usize,
    /// Input names.
    pub inputs: DecoderInputs,
    /// Output names.
    pub outputs: DecoderOutputs,
}

/// `model.decoder.session_options`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SessionOptions {
    /// Names the session in ONNX Runtime's log.
    pub log_id: String,
    /// Execution providers besides the CPU (none: genai's device packages add theirs).
    pub provider_options: Vec<serde_json::Value>,
    /// ONNX Runtime's intra-op threads: 0, ONNX Runtime's own default (one per physical
    /// core, what `gmlp-onnx generate` runs with). Left out, genai would take half the
    /// logical CPUs (`CreateSessionOptionsFromConfig` in genai's src/models/model.cpp): one thread on
    /// 2 vCPUs, a 1.44× slower step there (BENCHMARKS.md, "onnxruntime-genai on the CPU").
    pub intra_op_num_threads: usize,
}

/// `model.decoder.inputs`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecoderInputs {
    /// Token ids.
    pub input_ids: String,
    /// The attention mask genai feeds (unused by the model).
    pub attention_mask: String,
    /// Positions of the tokens.
    pub position_ids: String,
    /// Past key names, `%d` the layer.
    pub past_key_names: String,
    /// Past value names.
    pub past_value_names: String,
}

/// `model.decoder.outputs`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecoderOutputs {
    /// Logits.
    pub logits: String,
    /// Present key names, `%d` the layer.
    pub present_key_names: String,
    /// Present value names.
    pub present_value_names: String,
}

/// `search`: defaults a generator's parameters start from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SearchSection {
    /// Prompt plus new tokens, at most n.
    pub max_length: usize,
    /// Fixed-size state: past and present share one buffer (genai also detects this from
    /// the fixed sequence dimension).
    pub past_present_share_buffer: bool,
    /// false: greedy, like `gmlp-onnx generate` without sampling options.
    pub do_sample: bool,
    /// One beam (genai refuses beams with a fixed-size state).
    pub num_beams: usize,
    /// Sequences per prompt.
    pub num_return_sequences: usize,
    /// Sampling temperature when sampling.
    pub temperature: f64,
    /// Top-k when sampling.
    pub top_k: usize,
    /// Top-p when sampling.
    pub top_p: f64,
}

impl GenaiConfig {
    /// The configuration of a folder whose model file is `filename`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        filename: &str,
        end_token: i64,
        vocab_size: usize,
        n: usize,
        d_model: usize,
        first_width: usize,
        layers: usize,
    ) -> GenaiConfig {
        let s = |v: &str| v.to_string();
        GenaiConfig {
            model: ModelSection {
                kind: s("decoder"),
                bos_token_id: end_token,
                eos_token_id: end_token,
                pad_token_id: end_token,
                vocab_size,
                context_length: n,
                decoder: DecoderSection {
                    session_options: SessionOptions {
                        log_id: s("onnxruntime-genai"),
                        provider_options: Vec::new(),
                        intra_op_num_threads: 0,
                    },
                    filename: s(filename),
                    hidden_size: d_model,
                    num_attention_heads: 1,
                    num_key_value_heads: 1,
                    head_size: first_width,
                    num_hidden_layers: layers,
                    inputs: DecoderInputs {
                        input_ids: s(INPUT_IDS),
                        attention_mask: s(ATTENTION_MASK),
                        position_ids: s(POSITION_IDS),
                        past_key_names: s(PAST_KEY),
                        past_value_names: s(PAST_VALUE),
                    },
                    outputs: DecoderOutputs {
                        logits: s(LOGITS),
                        present_key_names: s(PRESENT_KEY),
                        present_value_names: s(PRESENT_VALUE),
                    },
                },
            },
            search: SearchSection {
                max_length: n,
                past_present_share_buffer: true,
                do_sample: false,
                num_beams: 1,
                num_return_sequences: 1,
                temperature: 1.0,
                top_k: 50,
                top_p: 1.0,
            },
        }
    }

    /// The JSON text (pretty, with a final newline).
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }
}
