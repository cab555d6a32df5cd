//! `inspect`: parameter count from the file, operator histogram against the `onnx`
//! Python package's own reading, metadata, and external data references.

mod common;

use common::{
    gmlp, output_text as text, path_str as s, run_python as py, small_token_model as amlp,
};

use std::path::Path;

use gmlp_onnx::onnx::reader::{read_model, stored_f32_count};

fn inspect_json(path: &Path) -> serde_json::Value {
    let o = gmlp(&["inspect", s(path), "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

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
