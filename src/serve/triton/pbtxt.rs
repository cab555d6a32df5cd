//! `config.pbtxt`: a [`TritonConfig`] in the protobuf text format of Triton's
//! `ModelConfig` (model_config.proto of triton-inference-server/common).

use std::fmt::Write as _;

use super::model_config::{
    ImplicitState, StateKind, TritonConfig, TritonTensor, MAX_CANDIDATE_SEQUENCES,
};
use super::{InstanceKind, TensorRtPrecision, DEFAULT_MAX_SEQUENCE_IDLE_US};

/// A string literal of the protobuf text format.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A list of dims in the text format (`[ ]` for none).
fn dims_text(dims: &[i64]) -> String {
    if dims.is_empty() {
        return "[ ]".into();
    }
    let list: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("[ {} ]", list.join(", "))
}

/// The `input` or `output` list (`field`) of `tensors`.
fn tensor_list(out: &mut String, field: &str, tensors: &[TritonTensor]) {
    let _ = writeln!(out, "{field} [");
    for (i, t) in tensors.iter().enumerate() {
        let _ = writeln!(out, "  {{");
        let _ = writeln!(out, "    name: {}", quoted(&t.name));
        let _ = writeln!(out, "    data_type: {}", t.data_type);
        let _ = writeln!(out, "    dims: {}", dims_text(&t.dims));
        if let Some(shape) = &t.reshape {
            let _ = writeln!(out, "    reshape: {{ shape: {} }}", dims_text(shape));
        }
        let comma = if i + 1 < tensors.len() { "," } else { "" };
        let _ = writeln!(out, "  }}{comma}");
    }
    let _ = writeln!(out, "]");
}

impl TritonConfig {
    /// The configuration as `config.pbtxt` text (protobuf text format of Triton's
    /// `ModelConfig`).
    pub fn to_pbtxt(&self) -> String {
        let o = &self.options;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# Written by gmlp-onnx for Triton's ONNX Runtime backend."
        );
        let _ = writeln!(out, "name: {}", quoted(&o.name));
        let _ = writeln!(out, "platform: \"onnxruntime_onnx\"");
        let _ = writeln!(out, "max_batch_size: {}", self.max_batch_size);
        tensor_list(&mut out, "input", &self.inputs);
        tensor_list(&mut out, "output", &self.outputs);
        if self.states.is_empty() {
            if self.max_batch_size > 0 {
                let _ = writeln!(out, "dynamic_batching {{");
                let _ = writeln!(
                    out,
                    "  max_queue_delay_microseconds: {}",
                    o.max_queue_delay_us
                );
                let _ = writeln!(out, "}}");
            }
        } else {
            self.sequence_batching(&mut out);
        }
        instance_group(&mut out, o.kind, o.instance_count);
        if let Some(precision) = o.tensorrt {
            tensorrt_optimization(&mut out, precision);
        }
        out
    }

    /// The `sequence_batching` block of a model with states: the `oldest` strategy and
    /// each implicit state with its zero initial value.
    fn sequence_batching(&self, out: &mut String) {
        let o = &self.options;
        let _ = writeln!(out, "sequence_batching {{");
        let idle = o
            .max_sequence_idle_us
            .unwrap_or(DEFAULT_MAX_SEQUENCE_IDLE_US);
        let _ = writeln!(out, "  max_sequence_idle_microseconds: {idle}");
        let _ = writeln!(out, "  oldest {{");
        let _ = writeln!(
            out,
            "    max_candidate_sequences: {MAX_CANDIDATE_SEQUENCES}"
        );
        // Growing states run one request at a time (max_batch_size 1); static ones
        // wait as long as the dynamic batcher would, to batch sequences together.
        let delay = if !self.growing() {
            o.max_queue_delay_us
        } else {
            0
        };
        let _ = writeln!(out, "    max_queue_delay_microseconds: {delay}");
        let _ = writeln!(out, "  }}");
        let _ = writeln!(out, "  state [");
        for (i, s) in self.states.iter().enumerate() {
            let comma = if i + 1 < self.states.len() { "," } else { "" };
            implicit_state(out, s, comma);
        }
        let _ = writeln!(out, "  ]");
        let _ = writeln!(out, "}}");
    }
}

/// One entry of `sequence_batching`'s `state` list, followed by `comma`.
fn implicit_state(out: &mut String, s: &ImplicitState, comma: &str) {
    // The one zero slot the served graph slices off (Interface::Triton), the
    // whole fixed-size state, or position 0.
    let initial: Vec<i64> = s
        .input
        .dims
        .iter()
        .map(|&d| if d == -1 { 1 } else { d })
        .collect();
    let _ = writeln!(out, "    {{");
    let _ = writeln!(out, "      input_name: {}", quoted(&s.input.name));
    let _ = writeln!(out, "      output_name: {}", quoted(&s.output_name));
    let _ = writeln!(out, "      data_type: {}", s.input.data_type);
    let _ = writeln!(out, "      dims: {}", dims_text(&s.input.dims));
    let _ = writeln!(out, "      initial_state: {{");
    let initial_name = match s.kind {
        StateKind::Growing { .. } => "slot",
        StateKind::Fixed => "zeros",
        StateKind::Position => "start",
    };
    let _ = writeln!(out, "        name: \"{initial_name}\"");
    let _ = writeln!(out, "        data_type: {}", s.input.data_type);
    let _ = writeln!(out, "        dims: {}", dims_text(&initial));
    let _ = writeln!(out, "        zero_data: true");
    let _ = writeln!(out, "      }}");
    let _ = writeln!(out, "    }}{comma}");
}

/// The `instance_group` block: `count` instances of `kind`.
fn instance_group(out: &mut String, kind: InstanceKind, count: u32) {
    let kind = match kind {
        InstanceKind::Cpu => "KIND_CPU",
        InstanceKind::Gpu => "KIND_GPU",
    };
    let _ = writeln!(out, "instance_group [");
    let _ = writeln!(out, "  {{");
    let _ = writeln!(out, "    count: {count}");
    let _ = writeln!(out, "    kind: {kind}");
    let _ = writeln!(out, "  }}");
    let _ = writeln!(out, "]");
}

/// The `optimization` block that runs the model through TensorRT at `precision`.
fn tensorrt_optimization(out: &mut String, precision: TensorRtPrecision) {
    let mode = match precision {
        TensorRtPrecision::Fp16 => "FP16",
        TensorRtPrecision::Fp32 => "FP32",
    };
    let _ = writeln!(out, "optimization {{");
    let _ = writeln!(out, "  execution_accelerators {{");
    let _ = writeln!(out, "    gpu_execution_accelerator [");
    let _ = writeln!(out, "      {{");
    let _ = writeln!(out, "        name: \"tensorrt\"");
    let _ = writeln!(
        out,
        "        parameters {{ key: \"precision_mode\" value: \"{mode}\" }}"
    );
    let _ = writeln!(out, "      }}");
    let _ = writeln!(out, "    ]");
    let _ = writeln!(out, "  }}");
    let _ = writeln!(out, "}}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::message::Setting;
    use crate::onnx::dtype::DataType;
    use crate::serve::triton::testing::{model, names_settings, tensor, token_model};
    use crate::serve::triton::{plan, TritonOptions};

    #[test]
    fn a_token_model_gets_a_batched_config_without_the_batch_dimension() {
        let config = plan(&token_model(), &TritonOptions::new("tiny")).unwrap();
        let expected = r#"# Written by gmlp-onnx for Triton's ONNX Runtime backend.
name: "tiny"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "input_ids"
    data_type: TYPE_INT64
    dims: [ 12 ]
  }
]
output [
  {
    name: "logits"
    data_type: TYPE_FP32
    dims: [ 12, 50 ]
  }
]
dynamic_batching {
  max_queue_delay_microseconds: 100
}
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
"#;
        assert_eq!(config.to_pbtxt(), expected);
    }

    #[test]
    fn without_batching_the_batch_dimension_stays_and_no_dynamic_batcher_is_written() {
        let mut options = TritonOptions::new("tiny");
        options.max_batch_size = Some(0);
        let text = plan(&token_model(), &options).unwrap().to_pbtxt();
        assert!(text.contains("dims: [ -1, 12 ]"), "{text}");
        assert!(text.contains("dims: [ -1, 12, 50 ]"), "{text}");
        assert!(!text.contains("dynamic_batching"), "{text}");
    }

    #[test]
    fn gpu_instances_with_tensorrt_fp16() {
        let mut options = TritonOptions::new("tiny");
        options.kind = InstanceKind::Gpu;
        options.instance_count = 2;
        options.tensorrt = Some(TensorRtPrecision::Fp16);
        let text = plan(&token_model(), &options).unwrap().to_pbtxt();
        assert!(text.contains("count: 2\n    kind: KIND_GPU"), "{text}");
        assert!(text.contains("name: \"tensorrt\""), "{text}");
        assert!(
            text.contains("key: \"precision_mode\" value: \"FP16\""),
            "{text}"
        );
        options.kind = InstanceKind::Cpu;
        let e = plan(&token_model(), &options).unwrap_err();
        assert!(
            names_settings(&e, &[Setting::TritonTensorrt, Setting::TritonKind]),
            "{e:?}"
        );
    }

    #[test]
    fn static_state_models_batch_sequences_and_keep_their_position_as_a_state() {
        let m = model(
            &[
                tensor("input_ids", DataType::Int64, &["batch", "sequence"]),
                tensor("position", DataType::Int64, &["batch"]),
                tensor("past_sgu.0", DataType::Float, &["batch", "32", "16"]),
            ],
            &[
                tensor("logits", DataType::Float, &["batch", "sequence", "50"]),
                tensor("present_sgu.0", DataType::Float, &["batch", "32", "16"]),
            ],
        );
        let config = plan(&m, &TritonOptions::new("lm")).unwrap();
        assert_eq!(
            config.max_batch_size,
            crate::serve::triton::DEFAULT_MAX_BATCH_SIZE
        );
        assert_eq!(config.states[1].kind, StateKind::Fixed);
        assert_eq!(config.states[1].input.dims, vec![32, 16]);
        // The client sends input_ids only; the position is a state of its own.
        let names: Vec<&str> = config.inputs.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["input_ids"]);
        assert_eq!(config.states[0].kind, StateKind::Position);
        assert!(config.counts_positions() && !config.growing());
        let text = config.to_pbtxt();
        assert!(
            text.contains(
                "input_name: \"position\"\n      output_name: \"triton_next_position\"\n      data_type: TYPE_INT64\n      dims: [ 1 ]\n      initial_state: {\n        name: \"start\"\n        data_type: TYPE_INT64\n        dims: [ 1 ]\n        zero_data: true"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "name: \"zeros\"\n        data_type: TYPE_FP32\n        dims: [ 32, 16 ]"
            ),
            "{text}"
        );
        assert!(text.contains("max_queue_delay_microseconds: 100"), "{text}");
        assert!(
            text.contains("max_sequence_idle_microseconds: 60000000"),
            "{text}"
        );
        let mut options = TritonOptions::new("lm");
        options.max_batch_size = Some(16);
        options.max_sequence_idle_us = Some(2_500_000);
        let config = plan(&m, &options).unwrap();
        assert_eq!(config.max_batch_size, 16);
        assert!(config
            .to_pbtxt()
            .contains("max_sequence_idle_microseconds: 2500000"));
        options.max_batch_size = Some(0);
        let e = plan(&m, &options).unwrap_err();
        assert!(matches!(e, Error::OutOfRange(_)), "{e:?}");
    }

    #[test]
    fn a_position_the_server_cannot_count_is_refused() {
        let past = tensor("past_sgu.0", DataType::Float, &["batch", "32", "16"]);
        let outputs = [
            tensor("logits", DataType::Float, &["batch", "sequence", "50"]),
            tensor("present_sgu.0", DataType::Float, &["batch", "32", "16"]),
        ];
        let ids = tensor("input_ids", DataType::Int64, &["batch", "sequence"]);
        for (position, tokens) in [
            // Not int64.
            (tensor("position", DataType::Int32, &["batch"]), ids.clone()),
            // Not [batch].
            (
                tensor("position", DataType::Int64, &["batch", "1"]),
                ids.clone(),
            ),
            // No input_ids whose length advances it.
            (
                tensor("position", DataType::Int64, &["batch"]),
                tensor("tokens", DataType::Int64, &["batch", "sequence"]),
            ),
        ] {
            let m = model(&[tokens, position, past.clone()], &outputs);
            let e = plan(&m, &TritonOptions::new("lm")).unwrap_err();
            assert!(matches!(e, Error::Unservable(_)), "{e:?}");
        }
        // A stateless model has no sequence to be idle.
        let mut options = TritonOptions::new("tiny");
        options.max_sequence_idle_us = Some(1_000_000);
        let e = plan(&token_model(), &options).unwrap_err();
        assert!(
            names_settings(&e, &[Setting::TritonMaxSequenceIdleUs]),
            "{e:?}"
        );
        options.max_sequence_idle_us = Some(0);
        assert!(options.check().is_err());
    }

    #[test]
    fn names_are_quoted_for_the_text_format() {
        assert_eq!(quoted(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
