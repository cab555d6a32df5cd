//! The trained fixtures (fixtures/NAME, made by scripts/make_fixtures.py with the upstream
//! libraries): meta.json (the flags a user passes, the input's name), io.safetensors (the
//! inputs and the library's own outputs) and the checkpoints.

use std::path::{Path, PathBuf};

use gmlp_onnx::checkpoint::ImportHints;
use gmlp_onnx::tensor::{NamedTensor, TensorValue};
use ndarray::{Array2, ArrayD};
use safetensors::SafeTensors;

use super::{safetensors_tensor, Build};

/// max|ours − theirs| / max|theirs| allowed where a file built from a trained fixture is
/// compared with the outputs its library stored (PyTorch's; tinygrad's for fixtures/tiny_*).
/// Measured: 1.3e-7 to 3.7e-7 (docs/checkpoints.md).
pub const PYTORCH_RTOL: f64 = 1e-4;

/// One trained fixture, its meta.json parsed and its io.safetensors read.
pub struct Fixture {
    /// The folder's name under fixtures/.
    pub name: String,
    /// fixtures/NAME.
    pub dir: PathBuf,
    /// meta.json.
    pub meta: serde_json::Value,
    io: Vec<u8>,
}

impl Fixture {
    /// fixtures/NAME (panics naming what is missing).
    pub fn open(name: &str) -> Fixture {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(name);
        let read = |file: &str| {
            std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("fixtures/{name}/{file}: {e}"))
        };
        let meta = serde_json::from_slice(&read("meta.json"))
            .unwrap_or_else(|e| panic!("fixtures/{name}/meta.json: {e}"));
        let io = read("io.safetensors");
        Fixture {
            name: name.to_string(),
            dir,
            meta,
            io,
        }
    }

    /// fixtures/NAME/model.safetensors.
    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join("model.safetensors")
    }

    /// The tensor `key` of io.safetensors, `None` when the file has none of that name.
    pub fn try_tensor(&self, key: &str) -> Option<TensorValue> {
        let st = SafeTensors::deserialize(&self.io)
            .unwrap_or_else(|e| panic!("fixtures/{}/io.safetensors: {e}", self.name));
        safetensors_tensor(&st, key)
    }

    /// The tensor `key` of io.safetensors.
    pub fn tensor(&self, key: &str) -> TensorValue {
        self.try_tensor(key)
            .unwrap_or_else(|| panic!("fixtures/{}/io.safetensors has no {key}", self.name))
    }

    /// The f32 tensor `key` of io.safetensors.
    pub fn f32(&self, key: &str) -> ArrayD<f32> {
        match self.tensor(key) {
            TensorValue::F32(a) => a,
            other => panic!("{}: {key} is {other:?}, not f32", self.name),
        }
    }

    /// The int64 matrix `key` of io.safetensors (token ids, [batch, sequence]).
    pub fn ids(&self, key: &str) -> Array2<i64> {
        match self.tensor(key) {
            TensorValue::I64(a) => a
                .into_dimensionality()
                .unwrap_or_else(|e| panic!("{}: {key}: {e}", self.name)),
            other => panic!("{}: {key} is {other:?}, not int64", self.name),
        }
    }

    /// The model's input named by meta.json, as a feed.
    pub fn inputs(&self) -> Vec<NamedTensor> {
        let name = self.meta["input_name"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: meta.json has no input_name", self.name));
        vec![NamedTensor {
            name: name.to_string(),
            value: self.tensor(name),
        }]
    }

    /// The library's logits for [`Fixture::inputs`].
    pub fn logits(&self) -> ArrayD<f32> {
        self.f32("logits")
    }

    /// The classifiers' labels of the held-out examples, `None` for token models.
    pub fn labels(&self) -> Option<Vec<i64>> {
        self.try_tensor("labels").map(|v| match v {
            TensorValue::I64(a) => a.iter().copied().collect(),
            other => panic!("{}: labels are {other:?}, not int64", self.name),
        })
    }

    /// The import hints a user passes for this fixture: the flags the weights cannot show.
    pub fn hints(&self) -> ImportHints {
        let flags = &self.meta["flags"];
        ImportHints {
            causal: flags["causal"].as_bool().unwrap_or(false),
            shift_tokens: flags["shift_tokens"].as_u64().unwrap_or(0) as usize,
            in_chans: flags["in_chans"].as_u64().map(|c| c as usize),
            ..ImportHints::default()
        }
    }

    /// The build flags a user passes for this fixture: those its meta.json records.
    pub fn flags(&self) -> Vec<String> {
        let mut out = Vec::new();
        let flags = self.meta["flags"]
            .as_object()
            .unwrap_or_else(|| panic!("{}: meta.json has no flags", self.name));
        for (key, value) in flags {
            out.push(format!("--{}", key.replace('_', "-")));
            match value {
                serde_json::Value::Bool(true) => {}
                serde_json::Value::String(s) => out.push(s.clone()),
                other => out.push(other.to_string()),
            }
        }
        out
    }

    /// `gmlp-onnx build --weights fixtures/NAME/CHECKPOINT`, the fixture's flags, then
    /// `extra`, written quietly to OUT; asserts success.
    pub fn build(&self, checkpoint: &str, extra: &[&str], out: &Path) {
        let flags = self.flags();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Build::weights(&self.dir.join(checkpoint))
            .args(&flags)
            .args(extra)
            .write(out);
    }
}
