//! `inspect`: parameter count from the file, operator histogram against the `onnx`
//! Python package's own reading, metadata, and external data references; the text form.

use std::path::Path;

use crate::common::{
    gmlp, inspect_json, output_text as text, path_str as s, small_token_model as amlp, Amlp, Build,
    Fixture,
};

/// `gmlp-onnx inspect PATH` without `--json`: its standard output, as lines (the command
/// must succeed).
fn text_lines(path: &Path) -> Vec<String> {
    let o = gmlp(&["inspect", s(path)]);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Asserts that every line of `expected` is a line of `lines`.
fn assert_has_lines(lines: &[String], expected: &[String]) {
    for want in expected {
        assert!(
            lines.contains(want),
            "{want:?} is not a line of:\n{}",
            lines.join("\n")
        );
    }
}

/// The text form of `inspect` (the one test of it; the other tests read `--json`): each line
/// of a summary says what the JSON of the same file holds (opsets, inputs and outputs,
/// parameters, FLOPs in their unit, operators, configuration, spatial weight, every
/// metadata property), and the sections other files add: a static state, a growing state
/// with a token-shift window, an int4 file's stored and quantized lines, a missing
/// external data file.
#[test]
fn inspect_text_shows_every_section_of_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let path = amlp(dir.path());
    let json = inspect_json(&path);
    let lines = text_lines(&path);
    let number = |key: &str| json[key].as_u64().unwrap();
    let ops: Vec<String> = json["ops"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(op, n)| format!("{op} {n}"))
        .collect();
    let mut expected = vec![
        format!("model       {}", path.display()),
        "ir_version  8".to_string(),
        "opsets      ai.onnx 17".to_string(),
        format!("producer    gmlp-onnx {}", env!("CARGO_PKG_VERSION")),
        "target      ort".to_string(),
        "input       input_ids int64 [batch, 32]".to_string(),
        "output      logits float32 [batch, 32, 300]".to_string(),
        format!(
            "parameters  {} (2.72M) in {} initializers, {} bytes (10.9 MB); all initializers {} bytes",
            number("parameters"),
            number("initializers"),
            number("parameter_bytes"),
            number("initializer_bytes")
        ),
        format!(
            "flops       {} per example (166.99 MFLOPs)",
            number("flops_per_example")
        ),
        format!("nodes       {}: {}", number("nodes"), ops.join(", ")),
        format!("config      {}", json["config"]),
    ];
    for (key, value) in json["metadata"].as_object().unwrap() {
        if key != "gmlp_onnx.config" {
            expected.push(format!("metadata    {key} = {}", value.as_str().unwrap()));
        }
    }
    assert_has_lines(&lines, &expected);
    let w = &json["spatial"][0];
    let spatial = format!(
        "spatial     block 0: W [32, 32] toeplitz-gather float32, reads all; Toeplitz-ness {:.3}, i.i.d. random ~{:.3}; ",
        w["toeplitz_ness"].as_f64().unwrap(),
        w["random_level"].as_f64().unwrap()
    );
    assert!(
        lines.iter().any(|l| l.starts_with(&spatial)),
        "{spatial:?} in {lines:#?}"
    );
    assert_eq!(lines.len(), expected.len() + 1, "{lines:#?}");

    // Static state: n rows per sequence, written in place (d = 16, a = 4, n = 8).
    let static_path = Build::amlp(2, Amlp::Tiny)
        .args(&["--causal", "--with-past"])
        .write(&dir.path().join("static.onnx"));
    assert_has_lines(
        &text_lines(&static_path),
        &[
            "input       position int64 [batch]".to_string(),
            "sequence    static, up to 8 positions (position + sequence), one position per sequence".to_string(),
            "state       per block: past_sgu.0 [batch, 8, 16], past_key.0 [batch, 8, 4], past_value.0 [batch, 8, 4]; fixed size, written in place: 1536 bytes per sequence for all 2 blocks (f32)".to_string(),
        ],
    );
    // Growing state with g-mlp-pytorch's token shift (d = 24, e = 48, a = 8, shift 2).
    let shift = dir.path().join("shift.onnx");
    Fixture::open("lucid_shift_causal").build(
        "model.safetensors",
        &["--with-past", "growing"],
        &shift,
    );
    assert_has_lines(
        &text_lines(&shift),
        &[
            "sequence    with-past, up to 32 positions (past_sequence + sequence)".to_string(),
            "state       per block: past_sgu.0 [batch, past_sequence, 48], past_key.0 [batch, past_sequence, 8], past_value.0 [batch, past_sequence, 8], past_shift.0 [batch, min(past_sequence, 2), 24]; 256 bytes per token per block (f32), 512 bytes per token for all 2 blocks, plus the token-shift window: 192 bytes per block once full".to_string(),
        ],
    );
    // int4: what is stored besides the parameters, and how each group is quantized.
    let int4 = Build::amlp(1, Amlp::Tiny)
        .args(&["--causal", "--dtype", "int4"])
        .write(&dir.path().join("int4.onnx"));
    let q = inspect_json(&int4);
    assert_has_lines(
        &text_lines(&int4),
        &[
            format!(
                "stored      {} values: {} quantized weight values, {} values of quantized copies of embed.weight, {} quantization scales and zero points",
                q["stored_values"], q["quantized_values"], q["quantized_copy_values"], q["quantization_scale_values"]
            ),
            "quantized   projections 4-bit (com.microsoft.MatMulNBits, blocks of 32 along K, accuracy_level 4): blocks.*.proj_in.weight, blocks.*.attn.qkv.weight, blocks.*.attn.out.weight; output projections 8-bit (com.microsoft.MatMulNBits, blocks of 128 along K, accuracy_level 4): blocks.*.proj_out.weight; head 8-bit (com.microsoft.MatMulNBits, blocks of 128 along K, accuracy_level 4): embed.weight".to_string(),
        ],
    );
    // External data that is not beside the model.
    let external = Build::amlp(1, Amlp::Tiny)
        .args(&["--external-data"])
        .write(&dir.path().join("e.onnx"));
    std::fs::remove_file(dir.path().join("e.onnx.data")).unwrap();
    assert_has_lines(
        &text_lines(&external),
        &["external    e.onnx.data (21 tensors) MISSING".to_string()],
    );
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;
    use crate::common::run_python as py;
    use gmlp_onnx::onnx::reader::{read_model, stored_f32_count};

    #[test]
    fn inspect_reports_parameters_ops_and_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let path = amlp(dir.path());
        let json = inspect_json(&path);
        let model = read_model(&path).unwrap();
        let stored = stored_f32_count(&model);
        assert!(stored > 0);
        assert_eq!(json["parameters"], stored);
        assert_eq!(json["parameter_bytes"], 4 * stored);
        // ONNX's release table pairs opset 17 with IR 8.
        assert_eq!(json["ir_version"], 8);
        assert_eq!(json["target"], "ort");
        assert_eq!(json["metadata"]["gmlp_onnx.target"], "ort");
        assert_eq!(
            json["opsets"],
            serde_json::json!([{"domain": "", "version": 17}])
        );
        assert_eq!(json["inputs"][0]["name"], "input_ids");
        assert_eq!(json["inputs"][0]["dtype"], "int64");
        assert_eq!(json["inputs"][0]["shape"], serde_json::json!(["batch", 32]));
        assert_eq!(
            json["outputs"][0]["shape"],
            serde_json::json!(["batch", 32, 300])
        );
        assert_eq!(json["config"]["layers"], 1);
        assert_eq!(json["config"]["attn_dim"], 64);
        assert_eq!(
            json["flops_per_example"].as_u64().unwrap().to_string(),
            json["metadata"]["gmlp_onnx.flops_per_example"]
                .as_str()
                .unwrap()
        );
        assert_eq!(json["external_data"], serde_json::json!([]));
        // The op histogram and parameter count as the onnx package reads the same file.
        let py_view = py(
            "import sys, json, collections, onnx, numpy as np\n\
             m = onnx.load(sys.argv[1])\n\
             ops = collections.Counter(n.op_type for n in m.graph.node)\n\
             params = sum(int(np.prod(t.dims)) for t in m.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)\n\
             print(json.dumps({'ops': ops, 'params': params, 'nodes': len(m.graph.node)}))\n",
            &[&path],
        );
        let py_view: serde_json::Value = serde_json::from_str(&py_view).unwrap();
        assert_eq!(json["ops"], py_view["ops"]);
        assert_eq!(json["parameters"], py_view["params"]);
        assert_eq!(json["nodes"], py_view["nodes"]);
        assert_eq!(json["ops"]["Softmax"], 1);
    }

    #[test]
    fn inspect_lists_external_data_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = amlp(dir.path());
        let ext = dir.path().join("ext.onnx");
        py(
            "import sys, onnx\n\
             m = onnx.load(sys.argv[1])\n\
             onnx.save_model(m, sys.argv[2], save_as_external_data=True, all_tensors_to_one_file=True, location='ext.weights', size_threshold=1024)\n",
            &[&path, &ext],
        );
        let json = inspect_json(&ext);
        let original = inspect_json(&path);
        assert_eq!(json["parameters"], original["parameters"]);
        let files = json["external_data"].as_array().unwrap();
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(files[0]["location"], "ext.weights");
        assert_eq!(files[0]["exists"], true);
        let tensors = files[0]["tensors"].as_u64().unwrap();
        assert!(tensors > 0 && tensors <= json["initializers"].as_u64().unwrap());
        std::fs::remove_file(dir.path().join("ext.weights")).unwrap();
        assert_eq!(
            inspect_json(&ext)["external_data"],
            serde_json::json!([{"location": "ext.weights", "tensors": tensors, "exists": false}])
        );
    }

    /// An int8 file has its f32 file's parameter count (as the onnx package counts the f32
    /// file's float initializers), whether it is ours or ONNX Runtime's `quantize_dynamic` of
    /// the f32 file; the int8 copy of the tied embedding (the vocabulary head) and the scales
    /// are stored values, not parameters.
    #[test]
    fn int8_files_count_the_parameters_of_their_f32_file() {
        let dir = tempfile::tempdir().unwrap();
        let f32_path = amlp(dir.path());
        let int8_path = dir.path().join("t8.onnx");
        Build::amlp(1, Amlp::Short)
            .args(&["--init", "spread", "--dtype", "int8"])
            .write(&int8_path);
        let qd_path = dir.path().join("qd.onnx");
        // The onnx package's reading of the files: parameters of the f32 file, and of the int8
        // file every initializer, the head's int8 copy and the scales by the names our build uses.
        let py_view = py(
            "import sys, json, onnx, numpy as np\n\
             from onnxruntime.quantization import quantize_dynamic, QuantType\n\
             size = lambda t: int(np.prod(t.dims))\n\
             f = onnx.load(sys.argv[1])\n\
             q = onnx.load(sys.argv[2])\n\
             quantize_dynamic(sys.argv[1], sys.argv[3], weight_type=QuantType.QInt8, per_channel=True)\n\
             print(json.dumps({\n\
               'f32_params': sum(size(t) for t in f.graph.initializer if t.data_type == onnx.TensorProto.FLOAT),\n\
               'int8_stored': sum(size(t) for t in q.graph.initializer),\n\
               'int8_copy': sum(size(t) for t in q.graph.initializer if t.name == 'embed.weight.transposed.int8'),\n\
               'int8_scales': sum(size(t) for t in q.graph.initializer if t.name.endswith('.scale')),\n\
               'int8_tensors': sum(1 for t in q.graph.initializer if t.data_type == onnx.TensorProto.INT8),\n\
             }))\n",
            &[&f32_path, &int8_path, &qd_path],
        );
        let py_view: serde_json::Value = serde_json::from_str(&py_view).unwrap();
        let f32_json = inspect_json(&f32_path);
        let int8_json = inspect_json(&int8_path);
        let qd_json = inspect_json(&qd_path);
        assert_eq!(f32_json["parameters"], py_view["f32_params"]);
        assert!(py_view["int8_tensors"].as_u64().unwrap() >= 6, "{py_view}");
        assert_eq!(int8_json["parameters"], f32_json["parameters"]);
        assert_eq!(int8_json["stored_values"], py_view["int8_stored"]);
        assert_eq!(
            int8_json["metadata"]["gmlp_onnx.stored_params"],
            py_view["int8_stored"].to_string()
        );
        assert_eq!(int8_json["quantized_copy_values"], py_view["int8_copy"]);
        assert_eq!(
            int8_json["quantized_copies_of"],
            serde_json::json!(["embed.weight"])
        );
        assert_eq!(
            int8_json["quantization_scale_values"],
            py_view["int8_scales"]
        );
        assert_eq!(qd_json["parameters"], f32_json["parameters"]);
        assert!(
            qd_json["quantized_values"].as_u64().unwrap() > 0,
            "{qd_json}"
        );
        // A file without integer weights has nothing but parameters.
        assert_eq!(f32_json["stored_values"], f32_json["parameters"]);
        assert_eq!(f32_json["quantized_values"], 0);
    }
}
