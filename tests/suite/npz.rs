//! The `.npz` reader and writer against NumPy itself, both directions, every dtype.

use crate::common::run_python as py;

use gmlp_onnx::npz::{read_npz, save_npz};
use gmlp_onnx::tensor::{NamedTensor, TensorValue};
use ndarray::{ArrayD, IxDyn};

fn tensors() -> Vec<NamedTensor> {
    let t = |name: &str, value| NamedTensor {
        name: name.into(),
        value,
    };
    vec![
        t(
            "f32",
            TensorValue::F32(
                ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.5, -2.25, 0.0, 1e-30, 3e30, -0.5])
                    .unwrap(),
            ),
        ),
        t(
            "blocks.0/f64",
            TensorValue::F64(ArrayD::from_shape_vec(IxDyn(&[3]), vec![0.1, -1e300, 7.0]).unwrap()),
        ),
        t(
            "i32",
            TensorValue::I32(
                ArrayD::from_shape_vec(IxDyn(&[1, 2, 2]), vec![i32::MIN, -1, 0, i32::MAX]).unwrap(),
            ),
        ),
        t(
            "i64",
            TensorValue::I64(ArrayD::from_shape_vec(IxDyn(&[]), vec![i64::MIN + 1]).unwrap()),
        ),
        t(
            "empty",
            TensorValue::F32(ArrayD::from_shape_vec(IxDyn(&[0, 4]), vec![]).unwrap()),
        ),
    ]
}

#[test]
fn numpy_reads_what_we_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.npz");
    save_npz(&path, &tensors()).unwrap();
    let out = py(
        "import sys, numpy as np\n\
         z = np.load(sys.argv[1])\n\
         assert z['f32'].dtype == np.float32 and z['f32'].tolist() == [[1.5, -2.25, 0.0], [np.float32(1e-30).item(), np.float32(3e30).item(), -0.5]], z['f32']\n\
         assert z['blocks.0/f64'].dtype == np.float64 and z['blocks.0/f64'].tolist() == [0.1, -1e300, 7.0]\n\
         assert z['i32'].dtype == np.int32 and z['i32'].tolist() == [[[-2**31, -1], [0, 2**31 - 1]]]\n\
         assert z['i64'].dtype == np.int64 and z['i64'].shape == () and int(z['i64']) == -2**63 + 1\n\
         assert z['empty'].shape == (0, 4)\n\
         print(sorted(z.files))\n",
        &[&path],
    );
    assert_eq!(out.trim(), "['blocks.0/f64', 'empty', 'f32', 'i32', 'i64']");
}

#[test]
fn we_read_what_numpy_writes_stored_and_compressed() {
    let dir = tempfile::tempdir().unwrap();
    for (name, func) in [("s.npz", "savez"), ("c.npz", "savez_compressed")] {
        let path = dir.path().join(name);
        py(
            &format!(
                "import sys, numpy as np\n\
                 np.{func}(sys.argv[1], f32=np.array([[1.5, -2.25, 0.0], [1e-30, 3e30, -0.5]], np.float32),\n\
                   **{{'blocks.0/f64': np.array([0.1, -1e300, 7.0])}},\n\
                   i32=np.array([[[-2**31, -1], [0, 2**31 - 1]]], np.int32), i64=np.array(-2**63 + 1),\n\
                   empty=np.zeros((0, 4), np.float32))\n"
            ),
            &[&path],
        );
        let mut got = read_npz(&path).unwrap();
        got.sort_by(|a, b| a.name.cmp(&b.name));
        let mut want = tensors();
        want.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(got, want, "{func}");
    }
}
