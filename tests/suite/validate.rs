//! `validate` beyond seeded inputs: `.npz` inputs and expected outputs (written by
//! NumPy and by the Python ONNX Runtime, independent of this crate), malformed files,
//! the JSON report, execution-provider placement from ONNX Runtime's profiler, bench.
//!
//! Longer than ~500 lines: one module for `validate`, its cases sharing the Python
//! ONNX Runtime and NumPy helpers.

use gmlp_onnx::runtime::onnxruntime::parse_profile;
use gmlp_onnx::runtime::{Placement, RuntimeKind};
use gmlp_onnx::validate::check_placement;

#[test]
fn profile_parsing_and_the_cuda_placement_rule() {
    // The shape of ONNX Runtime's profile, with a node run twice and one on CUDA.
    let profile = r#"[
      {"cat": "Session", "name": "model_run", "args": {}},
      {"cat": "Node", "name": "a_kernel_time", "args": {"op_name": "MatMul", "provider": "CUDAExecutionProvider", "node_index": "0"}},
      {"cat": "Node", "name": "a_kernel_time", "args": {"op_name": "MatMul", "provider": "CUDAExecutionProvider", "node_index": "0"}},
      {"cat": "Node", "name": "b_kernel_time", "args": {"op_name": "Shape", "provider": "CPUExecutionProvider", "node_index": "1"}},
      {"cat": "Node", "name": "b_fence_before", "args": {}}
    ]"#;
    let p = parse_profile(RuntimeKind::OrtCuda, profile).unwrap();
    let want: Placement = [
        ("CPUExecutionProvider".to_string(), 1),
        ("CUDAExecutionProvider".to_string(), 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(p, want);
    check_placement(RuntimeKind::OrtCuda, Some(&p)).unwrap();
    let cpu_only = parse_profile(
        RuntimeKind::OrtCuda,
        r#"[{"cat": "Node", "name": "b", "args": {"op_name": "Add", "provider": "CPUExecutionProvider"}}]"#,
    )
    .unwrap();
    check_placement(RuntimeKind::OrtCpu, Some(&cpu_only)).unwrap();
    let e = check_placement(RuntimeKind::OrtCuda, Some(&cpu_only)).unwrap_err();
    assert!(
        matches!(&e, gmlp_onnx::Error::RuntimeUnavailable { runtime, .. } if runtime == "ort-cuda"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "runtime ort-cuda is unavailable: no node ran on CUDAExecutionProvider according to ONNX Runtime's profile (CPUExecutionProvider 1), so CUDA did not really run"
    );
    assert!(check_placement(RuntimeKind::OrtCuda, None).is_err());
    assert!(parse_profile(RuntimeKind::OrtCuda, "{not json").is_err());
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use crate::common::{
        assert_fails, gmlp, output_text as text, path_str as s, read_json, run_python as py,
        small_token_model as token_model, small_vision_model as vision_model, validate_report,
        validate_with_report, Amlp, Build,
    };
    use std::process::Command;

    #[test]
    fn numpy_inputs_and_python_onnxruntime_outputs_check_tract() {
        let dir = tempfile::tempdir().unwrap();
        let model = vision_model(dir.path());
        let inputs = dir.path().join("in.npz");
        let expected = dir.path().join("py_out.npz");
        // Inputs from NumPy (batch 3, not the default 2), reference outputs from the
        // Python ONNX Runtime package: neither goes through this crate.
        py(
            "import sys, numpy as np, onnxruntime as ort\n\
         x = np.random.default_rng(7).uniform(-1, 1, (3, 3, 32, 32)).astype(np.float32)\n\
         np.savez(sys.argv[2], pixel_values=x)\n\
         s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n\
         np.savez(sys.argv[3], logits=s.run(['logits'], {'pixel_values': x})[0])\n",
            &[&model, &inputs, &expected],
        );
        let json = validate_report(
            &model,
            &[
                "--runtimes",
                "tract",
                "--inputs",
                s(&inputs),
                "--expected",
                s(&expected),
            ],
        );
        assert_eq!(
            json["inputs"],
            serde_json::json!([{"name": "pixel_values", "shape": [3, 3, 32, 32], "dtype": "float32"}])
        );
        assert_eq!(json["schema"], "gmlp-onnx.validate/1");
        assert_eq!(json["inputs_source"], s(&inputs));
        assert_eq!(json["seed"], serde_json::Value::Null);
        assert_eq!(json["pairs"][0]["reference"], "expected");
        assert_eq!(json["pairs"][0]["other"], "tract");
        assert_eq!(json["pairs"][0]["outputs"][0]["output"], "logits");
        assert_eq!(json["pairs"][0]["outputs"][0]["elements"], 3000);
        assert_eq!(json["pairs"][0]["pass"], true);
    }

    #[test]
    fn saved_outputs_catch_a_perturbed_expected_file() {
        let dir = tempfile::tempdir().unwrap();
        let model = token_model(dir.path());
        let saved = dir.path().join("ort.npz");
        let o = gmlp(&[
            "validate",
            s(&model),
            "--runtimes",
            "ort-cpu",
            "--save-outputs",
            s(&saved),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        // tract against ONNX Runtime's saved outputs: agrees.
        let o = gmlp(&[
            "validate",
            s(&model),
            "--runtimes",
            "tract",
            "--expected",
            s(&saved),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        // NumPy changes one logit by 1% of the largest magnitude: caught, exit 1.
        let perturbed = dir.path().join("bad.npz");
        py(
            "import sys, numpy as np\n\
         z = dict(np.load(sys.argv[1]))\n\
         l = z['logits']; assert l.dtype == np.float32 and l.shape == (2, 32, 300), (l.dtype, l.shape)\n\
         l[1, 5, 7] += 0.01 * np.abs(l).max()\n\
         np.savez(sys.argv[2], **z)\n",
            &[&saved, &perturbed],
        );
        let (o, json) = validate_with_report(&model, &["--expected", s(&perturbed)]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert_eq!(json["pass"], false);
        let pairs = json["pairs"].as_array().unwrap();
        assert_eq!(
            pairs.len(),
            3,
            "tract/ort-cpu, expected/tract, expected/ort-cpu"
        );
        assert_eq!(pairs[0]["pass"], true);
        for (p, other) in pairs[1..].iter().zip(["tract", "ort-cpu"]) {
            assert_eq!(
                (&p["reference"], &p["other"]),
                (&"expected".into(), &other.into())
            );
            assert_eq!(p["pass"], false);
            assert_eq!(p["outputs"][0]["output"], "logits");
            assert_eq!(p["outputs"][0]["pass"], false);
            assert_eq!(p["outputs"][0]["mismatched"], 1);
            assert!(p["outputs"][0]["max_rel"].as_f64().unwrap() > 0.009);
        }
        // An array that is not an output of the model is an input error.
        let wrong = dir.path().join("wrong.npz");
        py(
            "import sys, numpy as np\nnp.savez(sys.argv[1], scores=np.zeros((2, 32, 300), np.float32))\n",
            &[&wrong],
        );
        assert_fails(
            &gmlp(&["validate", s(&model), "--expected", s(&wrong)]),
            2,
            &["array 'scores' is not an output of the model (outputs: logits)"],
        );
        // A reference of the wrong shape is an input error too, naming the output.
        py(
            "import sys, numpy as np\nnp.savez(sys.argv[1], logits=np.zeros((2, 31, 300), np.float32))\n",
            &[&wrong],
        );
        assert_fails(
            &gmlp(&[
                "validate",
                s(&model),
                "--runtimes",
                "tract",
                "--expected",
                s(&wrong),
            ]),
            2,
            &["output logits: shapes differ"],
        );
    }

    #[test]
    fn inputs_that_do_not_fit_the_model_are_refused_naming_the_input() {
        let dir = tempfile::tempdir().unwrap();
        let model = token_model(dir.path());
        let f = dir.path().join("in.npz");
        let check = |script: &str, needles: &[&str]| {
            py(
                &format!("import sys, numpy as np\np = sys.argv[1]\n{script}\n"),
                &[&f],
            );
            assert_fails(
                &gmlp(&[
                    "validate",
                    s(&model),
                    "--runtimes",
                    "tract",
                    "--inputs",
                    s(&f),
                ]),
                2,
                needles,
            );
        };
        check(
            "np.savez(p, input_ids=np.zeros((2, 32), np.int32))",
            &["input input_ids: the model declares int64, the file holds int32"],
        );
        check(
            "np.savez(p, input_ids=np.zeros((2, 33), np.int64))",
            &["input input_ids: the model declares shape [batch, 32], the file holds shape [2, 33]"],
        );
        check(
            "np.savez(p, input_ids=np.zeros((2, 32, 1), np.int64))",
            &["input input_ids", "[2, 32, 1]"],
        );
        check(
            "np.savez(p, ids=np.zeros((2, 32), np.int64))",
            &["array 'ids' is not an input of the model (inputs: input_ids)"],
        );
        check(
            "np.savez(p, input_ids=np.zeros((2, 32), np.float16))",
            &["array 'input_ids'", "dtype '<f2' is not supported"],
        );
        check(
            "np.savez(p, input_ids=np.asfortranarray(np.zeros((2, 32), np.int64)))",
            &["Fortran-order"],
        );
        check("np.savez(p)", &["the archive holds no array"]);
        // --batch and friends describe generated inputs only.
        py(
            "import sys, numpy as np\nnp.savez(sys.argv[1], input_ids=np.zeros((2, 32), np.int64))",
            &[&f],
        );
        assert_fails(
            &gmlp(&["validate", s(&model), "--inputs", s(&f), "--batch", "3"]),
            2,
            &["cannot be combined with --inputs"],
        );
    }

    #[test]
    fn malformed_npz_files_are_refused_without_panic() {
        let dir = tempfile::tempdir().unwrap();
        let model = vision_model(dir.path());
        let f = dir.path().join("bad.npz");
        let run = |flag: &str| gmlp(&["validate", s(&model), "--runtimes", "tract", flag, s(&f)]);
        // Garbage.
        std::fs::write(&f, [0x5au8; 300]).unwrap();
        assert_fails(
            &run("--inputs"),
            2,
            &["bad.npz", "not a readable .npz (zip) archive"],
        );
        assert_fails(
            &run("--expected"),
            2,
            &["not a readable .npz (zip) archive"],
        );
        // Missing file.
        let missing = dir.path().join("missing.npz");
        assert_fails(
            &gmlp(&["validate", s(&model), "--inputs", s(&missing)]),
            2,
            &["missing.npz"],
        );
        // A real archive cut short.
        py(
            "import sys, numpy as np\nnp.savez(sys.argv[1], pixel_values=np.ones((2, 3, 32, 32), np.float32))",
            &[&f],
        );
        let bytes = std::fs::read(&f).unwrap();
        std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
        assert_fails(&run("--inputs"), 2, &["not a readable .npz (zip) archive"]);
        // Entries that are not .npy arrays, or .npy entries that are not arrays.
        py(
            "import sys, zipfile\nwith zipfile.ZipFile(sys.argv[1], 'w') as z: z.writestr('notes.txt', 'hello')",
            &[&f],
        );
        assert_fails(
            &run("--inputs"),
            2,
            &["entry 'notes.txt' is not a .npy array"],
        );
        py(
            "import sys, zipfile\nwith zipfile.ZipFile(sys.argv[1], 'w') as z: z.writestr('pixel_values.npy', b'hello world, not numpy')",
            &[&f],
        );
        assert_fails(&run("--inputs"), 2, &["array 'pixel_values'", "bad magic"]);
        // A pickled object array (np.save of dtype=object).
        py(
            "import sys, numpy as np\nnp.savez(sys.argv[1], pixel_values=np.array([{'a': 1}], dtype=object))",
            &[&f],
        );
        assert_fails(&run("--inputs"), 2, &["dtype '|O' is not supported"]);
        // A hostile header claiming a huge shape over 64 bytes of data, stored and deflated.
        for compression in ["ZIP_STORED", "ZIP_DEFLATED"] {
            py(
                &format!(
                    "import sys, zipfile\n\
                 h = \"{{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1048576, 3, 32), }}\"\n\
                 h = h + ' ' * (118 - len(h)) + '\\n'\n\
                 npy = b'\\x93NUMPY\\x01\\x00' + len(h).to_bytes(2, 'little') + h.encode() + bytes(64)\n\
                 with zipfile.ZipFile(sys.argv[1], 'w', zipfile.{compression}) as z: z.writestr('pixel_values.npy', npy)\n"
                ),
                &[&f],
            );
            assert_fails(&run("--inputs"), 2, &["array 'pixel_values'", "overflows"]);
        }
        py(
            "import sys, zipfile\n\
         h = \"{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }\"\n\
         h = h + ' ' * (118 - len(h)) + '\\n'\n\
         npy = b'\\x93NUMPY\\x01\\x00' + len(h).to_bytes(2, 'little') + h.encode() + bytes(64)\n\
         with zipfile.ZipFile(sys.argv[1], 'w') as z: z.writestr('pixel_values.npy', npy)\n",
            &[&f],
        );
        assert_fails(
            &run("--inputs"),
            2,
            &["the member declares 64 bytes of data, shape [100000, 100000] of dtype <f4 needs 40000000000"],
        );
        // A header length past the end of the entry.
        py(
            "import sys, zipfile\n\
         npy = b'\\x93NUMPY\\x01\\x00' + (60000).to_bytes(2, 'little') + b'{}'\n\
         with zipfile.ZipFile(sys.argv[1], 'w') as z: z.writestr('pixel_values.npy', npy)\n",
            &[&f],
        );
        assert_fails(&run("--inputs"), 2, &["header runs past the end"]);
    }

    #[test]
    fn any_onnx_model_with_int32_and_float64_inputs_validates() {
        // A model this crate did not write (onnx.helper), with a symbolic dimension N,
        // float64 and int32 inputs and outputs.
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("mixed.onnx");
        py(
            "import sys, onnx\nfrom onnx import helper as h, TensorProto as T\n\
         g = h.make_graph([\n\
           h.make_node('Mul', ['x', 'x'], ['sq']),\n\
           h.make_node('Cast', ['ids'], ['idsf'], to=T.DOUBLE),\n\
           h.make_node('Add', ['sq', 'idsf'], ['y']),\n\
           h.make_node('Mul', ['ids', 'ids'], ['ids2'])],\n\
           'mixed',\n\
           [h.make_tensor_value_info('x', T.DOUBLE, ['N', 4]), h.make_tensor_value_info('ids', T.INT32, ['N', 4])],\n\
           [h.make_tensor_value_info('y', T.DOUBLE, ['N', 4]), h.make_tensor_value_info('ids2', T.INT32, ['N', 4])])\n\
         m = h.make_model(g, opset_imports=[h.make_opsetid('', 17)], ir_version=9)\n\
         onnx.checker.check_model(m)\n\
         onnx.save(m, sys.argv[1])\n",
            &[&model],
        );
        let o = gmlp(&["validate", s(&model)]);
        assert_fails(
            &o,
            2,
            &["input x: symbolic dimension 'N' needs a value (--dim N=N)"],
        );
        let json = validate_report(&model, &["--dim", "N=5"]);
        assert_eq!(
            json["inputs"],
            serde_json::json!([
                {"name": "x", "shape": [5, 4], "dtype": "float64"},
                {"name": "ids", "shape": [5, 4], "dtype": "int32"}
            ])
        );
        assert_eq!(json["pairs"][0]["outputs"].as_array().unwrap().len(), 2);
        // From NumPy, with the expected outputs computed by NumPy.
        let inputs = dir.path().join("in.npz");
        let expected = dir.path().join("out.npz");
        py(
            "import sys, numpy as np\n\
         x = np.linspace(-2, 2, 12).reshape(3, 4); ids = np.arange(12, dtype=np.int32).reshape(3, 4)\n\
         np.savez(sys.argv[1], ids=ids, x=x)\n\
         np.savez(sys.argv[2], y=x * x + ids, ids2=ids * ids)\n",
            &[&inputs, &expected],
        );
        let json = validate_report(
            &model,
            &["--inputs", s(&inputs), "--expected", s(&expected)],
        );
        let ids2 = json["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["reference"] == "expected" && p["other"] == "ort-cpu")
            .flat_map(|p| p["outputs"].as_array().unwrap())
            .find(|o| o["output"] == "ids2")
            .unwrap_or_else(|| panic!("{json}"));
        assert_eq!(ids2["max_abs"], 0.0);
        // Mismatched symbolic dimension across inputs.
        py(
            "import sys, numpy as np\nnp.savez(sys.argv[1], x=np.zeros((3, 4)), ids=np.zeros((2, 4), np.int32))\n",
            &[&inputs],
        );
        assert_fails(
            &gmlp(&["validate", s(&model), "--inputs", s(&inputs)]),
            2,
            &["dimension 'N' is 2 here but 3 in input x"],
        );
    }

    /// The text form of `validate` (the one test of it; the other tests read the report):
    /// for a static-state model with `--bench 2`, every line says what the report of the
    /// same run holds, in order: the inputs; each runtime's load and first run, placement
    /// and bench; the bound; a line per pair and output; the decoding check; then PASS.
    #[test]
    fn validate_text_says_what_the_report_holds() {
        let dir = tempfile::tempdir().unwrap();
        let model = Build::amlp(2, Amlp::Tiny)
            .args(&["--causal", "--with-past"])
            .write(&dir.path().join("s.onnx"));
        let (o, json) = validate_with_report(&model, &["--bench", "2"]);
        assert!(o.status.success(), "{}", text(&o));
        let f = |v: &serde_json::Value| v.as_f64().unwrap();
        let name = |v: &serde_json::Value| v["name"].as_str().unwrap().to_string();
        let pair = |p: &serde_json::Value| {
            let side = |k: &str| p[k].as_str().unwrap().to_string();
            format!("{} vs {}", side("reference"), side("other"))
        };
        let mut expected = Vec::new();
        for i in json["inputs"].as_array().unwrap() {
            let shape: Vec<u64> = serde_json::from_value(i["shape"].clone()).unwrap();
            let dtype = i["dtype"].as_str().unwrap();
            expected.push(format!("input  {} {dtype} {shape:?}", name(i)));
        }
        for r in json["runtimes"].as_array().unwrap() {
            let n = name(r);
            expected.push(format!(
                "ran    {n:<9} load {:>9.1} ms, first run {:>9.1} ms (includes warm-up)",
                f(&r["load_ms"]),
                f(&r["first_run_ms"])
            ));
            if let Some(p) = r["providers"].as_object() {
                let list: Vec<String> = p.iter().map(|(k, v)| format!("{k} {v}")).collect();
                expected.push(format!(
                    "placed {n:<9} nodes per provider: {}",
                    list.join(", ")
                ));
            }
            let b = &r["bench"];
            expected.push(format!(
                "bench  {n:<9} median {:.3} ms, min {:.3} ms over 2 runs",
                f(&b["median_ms"]),
                f(&b["min_ms"])
            ));
        }
        assert_eq!(
            json["tolerance"],
            serde_json::json!({"rtol": 1e-4, "atol": 1e-6})
        );
        expected.push(
            "bound  max|a - b| <= atol 1e-6 + rtol 1e-4 * max|reference| (model precision f32)"
                .into(),
        );
        for p in json["pairs"].as_array().unwrap() {
            for d in p["outputs"].as_array().unwrap() {
                assert_eq!(d["pass"], true);
                expected.push(format!(
                    "agree   {}: {} max_abs {:.3e} max_rel {:.3e} cosine {:.9} mismatched {}/{} (bound {:.3e})",
                    pair(p),
                    d["output"].as_str().unwrap(),
                    f(&d["max_abs"]),
                    f(&d["max_rel"]),
                    f(&d["cosine"]),
                    d["mismatched"],
                    d["elements"],
                    f(&d["bound"])
                ));
            }
        }
        let decoding = &json["decoding"];
        assert_eq!(
            decoding["plan"],
            serde_json::json!({"prefill": 4, "steps": 2, "chunk": 2})
        );
        expected.push(
            "decode prefill 4 + 2 single steps + a chunk of 2 (batch 2), present fed back as past"
                .into(),
        );
        let worst = |diffs: &serde_json::Value| {
            diffs
                .as_array()
                .unwrap()
                .iter()
                .fold(0f64, |m, d| m.max(f(&d["max_rel"])))
        };
        for r in decoding["runtimes"].as_array().unwrap() {
            assert_eq!(r["pass"], true);
            expected.push(format!(
                "agree   {} stepwise vs whole sequence: {} comparisons, worst max_rel {:.3e}; prefill {:.1} ms, step median {:.2} ms{}",
                name(r),
                r["against_whole"].as_array().unwrap().len(),
                worst(&r["against_whole"]),
                f(&r["prefill_ms"]),
                f(&r["step_median_ms"]),
                if r["state_in_place"] == true { "; state written in place" } else { "" }
            ));
        }
        for p in decoding["pairs"].as_array().unwrap() {
            assert_eq!(p["pass"], true);
            expected.push(format!(
                "agree   {} stepwise logits and states: worst max_rel {:.3e}",
                pair(p),
                worst(&p["outputs"])
            ));
        }
        assert_eq!(decoding["greedy_tokens_agree"], true);
        let new = decoding["runtimes"][0]["greedy_tokens"][0]
            .as_array()
            .unwrap()
            .len();
        expected.push(format!(
            "same    greedy continuation ({new} tokens per sequence) in every runtime"
        ));
        expected.push("PASS".into());
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(out.lines().collect::<Vec<_>>(), expected, "{out}");
    }

    #[test]
    fn report_names_runtimes_with_placement_and_bench() {
        let dir = tempfile::tempdir().unwrap();
        let model = vision_model(dir.path());
        let report = dir.path().join("r.json");
        let child = Command::new(env!("CARGO_BIN_EXE_gmlp-onnx"))
            .args([
                "validate",
                s(&model),
                "--bench",
                "3",
                "--report",
                s(&report),
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let json = read_json(&report);
        assert_eq!(json["schema"], "gmlp-onnx.validate/1");
        assert_eq!(json["seed"], 0);
        let rts = json["runtimes"].as_array().unwrap();
        assert_eq!(rts.len(), 2);
        assert_eq!(rts[0]["name"], "tract");
        assert_eq!(rts[0]["providers"], serde_json::Value::Null);
        assert_eq!(rts[1]["name"], "ort-cpu");
        let providers = rts[1]["providers"].as_object().unwrap();
        assert_eq!(
            providers.keys().collect::<Vec<_>>(),
            ["CPUExecutionProvider"]
        );
        // Every node of the optimized graph, counted once: at least the model's MatMuls.
        assert!(
            providers["CPUExecutionProvider"].as_u64().unwrap() >= 4,
            "{providers:?}"
        );
        for r in rts {
            let b = &r["bench"];
            assert_eq!(b["runs"], 3);
            let (median, min) = (
                b["median_ms"].as_f64().unwrap(),
                b["min_ms"].as_f64().unwrap(),
            );
            assert!(min > 0.0 && median >= min, "{b}");
        }
        // No profile file of that process is left behind in the temp directory.
        let prefix = format!("gmlp-onnx-profile-{pid}-");
        let leftovers: Vec<_> = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_failing_onnxruntime_run_is_one_line_and_leaves_no_profile() {
        // Declared [N, 4] but reshaped to a fixed [3, 4]: any N other than 3 fails at run time.
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("reshape.onnx");
        py(
            "import sys, onnx, numpy as np\nfrom onnx import helper as h, TensorProto as T, numpy_helper as nh\n\
         g = h.make_graph([h.make_node('Reshape', ['x', 's'], ['y'])], 'r',\n\
           [h.make_tensor_value_info('x', T.FLOAT, ['N', 4])], [h.make_tensor_value_info('y', T.FLOAT, [3, 4])],\n\
           [nh.from_array(np.array([3, 4], np.int64), 's')])\n\
         onnx.save(h.make_model(g, opset_imports=[h.make_opsetid('', 17)], ir_version=9), sys.argv[1])\n",
            &[&model],
        );
        let child = Command::new(env!("CARGO_BIN_EXE_gmlp-onnx"))
            .args([
                "validate",
                s(&model),
                "--runtimes",
                "ort-cpu",
                "--dim",
                "N=5",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let o = child.wait_with_output().unwrap();
        assert_fails(&o, 2, &["runtime ort-cpu failed", "Reshape"]);
        let prefix = format!("gmlp-onnx-profile-{pid}-");
        assert!(!std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().starts_with(&prefix)));
        let o = gmlp(&[
            "validate",
            s(&model),
            "--runtimes",
            "ort-cpu",
            "--dim",
            "N=3",
        ]);
        assert!(o.status.success(), "{}", text(&o));
    }
}
