//! `inspect`: parameter count from the file, operator histogram against the `onnx`
//! Python package's own reading, metadata, and external data references.

use crate::common::{
    gmlp, inspect_json, output_text as text, path_str as s, run_python as py,
    small_token_model as amlp, Amlp, Build,
};

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
    // The text form.
    let o = gmlp(&["inspect", s(&path)]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains(&format!("parameters  {stored} (")), "{out}");
    assert!(
        out.contains("input       input_ids int64 [batch, 32]"),
        "{out}"
    );
    assert!(out.contains("opsets      ai.onnx 17"), "{out}");
    assert!(out.contains("ir_version  8\n"), "{out}");
    assert!(out.contains("target      ort\n"), "{out}");
    assert!(out.contains("Softmax 1"), "{out}");
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
    let o = gmlp(&["inspect", s(&ext)]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "external    ext.weights ({tensors} tensors) MISSING"
        )),
        "{}",
        text(&o)
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
    let o = gmlp(&["inspect", s(&int8_path)]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains(&format!(
            "parameters  {} (",
            f32_json["parameters"].as_u64().unwrap()
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "values of quantized copies of embed.weight, {} quantization scales",
            py_view["int8_scales"]
        )),
        "{out}"
    );
}
