//! tract (pure Rust, CPU): `model_for_path` → optimized typed plan, symbolic batch kept.

use std::path::Path;
use std::sync::Arc;

use tract_onnx::prelude::*;

use crate::error::{contain_panic, one_line, Error, Result};
use crate::runtime::Runtime;
use crate::tensor::{NamedTensor, TensorValue};

/// A model loaded and optimized by tract.
pub struct TractRuntime {
    plan: Arc<TypedRunnableModel>,
    input_names: Vec<String>,
    output_names: Vec<String>,
}

fn failed(e: impl std::fmt::Display) -> Error {
    Error::RuntimeFailed {
        runtime: "tract".into(),
        reason: one_line(format!("{e:#}")),
    }
}

impl TractRuntime {
    /// Loads and optimizes `path` (external data files are resolved beside it).
    pub fn load(path: &Path) -> Result<Self> {
        contain_panic("tract", || Self::load_unguarded(path))
    }

    fn load_unguarded(path: &Path) -> Result<Self> {
        let model = tract_onnx::onnx().model_for_path(path).map_err(failed)?;
        let input_names = model
            .input_outlets()
            .map_err(failed)?
            .iter()
            .map(|o| model.node(o.node).name.clone())
            .collect();
        let output_names = model
            .output_outlets()
            .map_err(failed)?
            .iter()
            .map(|o| {
                model
                    .outlet_label(*o)
                    .map(str::to_string)
                    .unwrap_or_else(|| model.node(o.node).name.clone())
            })
            .collect();
        let plan = model
            .into_optimized()
            .map_err(failed)?
            .into_runnable()
            .map_err(failed)?;
        Ok(TractRuntime {
            plan,
            input_names,
            output_names,
        })
    }
}

impl Runtime for TractRuntime {
    fn name(&self) -> &str {
        "tract"
    }

    fn run(&mut self, inputs: &[NamedTensor]) -> Result<Vec<NamedTensor>> {
        contain_panic("tract", || self.run_unguarded(inputs))
    }
}

impl TractRuntime {
    fn run_unguarded(&self, inputs: &[NamedTensor]) -> Result<Vec<NamedTensor>> {
        let mut values: TVec<TValue> = tvec!();
        for name in &self.input_names {
            let input = inputs.iter().find(|t| &t.name == name).ok_or_else(|| {
                Error::BadTensor(format!("no value given for model input {name}"))
            })?;
            let tensor: Tensor = match &input.value {
                TensorValue::F32(a) => a.clone().into(),
                TensorValue::F64(a) => a.clone().into(),
                TensorValue::I32(a) => a.clone().into(),
                TensorValue::I64(a) => a.clone().into(),
            };
            values.push(tensor.into_tvalue());
        }
        let outputs = self.plan.run(values).map_err(failed)?;
        outputs
            .into_iter()
            .zip(&self.output_names)
            .map(|(t, name)| {
                let value = match t.datum_type() {
                    DatumType::F32 => {
                        TensorValue::F32(t.to_plain_array_view::<f32>().map_err(failed)?.to_owned())
                    }
                    DatumType::F64 => {
                        TensorValue::F64(t.to_plain_array_view::<f64>().map_err(failed)?.to_owned())
                    }
                    DatumType::I32 => {
                        TensorValue::I32(t.to_plain_array_view::<i32>().map_err(failed)?.to_owned())
                    }
                    DatumType::I64 => {
                        TensorValue::I64(t.to_plain_array_view::<i64>().map_err(failed)?.to_owned())
                    }
                    other => {
                        return Err(failed(format!(
                            "output {name} has type {other:?}; only float32, float64, int32 and int64 outputs are compared"
                        )))
                    }
                };
                Ok(NamedTensor {
                    name: name.clone(),
                    value,
                })
            })
            .collect()
    }
}
