//! [`Runtime::run_in_place`](crate::runtime::Runtime::run_in_place) for ONNX Runtime:
//! each state value becomes a tensor ONNX Runtime's CPU allocator owns, bound through
//! ort's `IoBinding` both as its `past_*` input and as its `present_*` output, so that the
//! scatter writing the new rows finds its output already holding the rest (its kernels skip
//! the copy when the two buffers are one; docs/static-state.md).

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::value::{DynValue, Tensor};

use super::{failed, host_value, native_to_host, OrtRuntime};
use crate::error::{Error, Result};
use crate::runtime::{missing_output, CarriedState, StateValue};
use crate::tensor::{with_array, NamedTensor, TensorValue};

/// A host array as an owned ONNX Runtime tensor (a copy; bound inputs must own their data).
pub(super) fn owned_input(name: &str, value: &TensorValue) -> Result<DynValue> {
    Ok(with_array!(value, a => Tensor::from_array(a.clone())
        .map_err(|e| failed(name, e))?
        .into_dyn()))
}

/// A float32 state value as a tensor ONNX Runtime's CPU allocator owns (so that it can be
/// bound as an output too): host arrays are copied in, native values kept.
fn in_place_buffer(name: &str, past: &str, value: StateValue) -> Result<DynValue> {
    match value {
        StateValue::Host(TensorValue::F32(a)) => {
            let mut t = Tensor::<f32>::new(&Allocator::default(), a.shape().to_vec())
                .map_err(|e| failed(name, e))?
                .into_dyn();
            t.try_extract_array_mut::<f32>()
                .map_err(|e| failed(name, e))?
                .assign(&a);
            Ok(t)
        }
        StateValue::Host(_) => Err(Error::BadTensor(format!("state {past} is not float32"))),
        StateValue::Native { value, .. } => value
            .downcast::<DynValue>()
            .map(|b| *b)
            .map_err(|_| Error::Internal(format!("state {past} belongs to another runtime"))),
    }
}

/// The bindable tensor `state` holds for the input `past`.
fn state_buffer<'a>(state: &'a CarriedState, past: &str) -> Result<&'a DynValue> {
    state
        .values
        .iter()
        .find(|(n, _)| n == past)
        .and_then(|(_, v)| match v {
            StateValue::Native { value, .. } => value.downcast_ref::<DynValue>(),
            StateValue::Host(_) => None,
        })
        .ok_or_else(|| Error::BadTensor(format!("no value given for model input {past}")))
}

impl OrtRuntime {
    /// [`Runtime::run_in_place`] with ONNX Runtime's I/O binding: each `past` value is a
    /// tensor bound both as its input and as its `present` output, so the scatter that
    /// writes the new rows finds its output already holding the rest and copies nothing
    /// (its kernels skip the copy when the two buffers are one).
    pub(super) fn run_in_place_unguarded(
        &mut self,
        inputs: &[NamedTensor],
        state: &mut CarriedState,
        carry: &[(String, String)],
    ) -> Result<Vec<NamedTensor>> {
        let name = self.name;
        // Every value becomes a bindable tensor first, so that an error loses nothing.
        for (past, v) in &mut state.values {
            if let StateValue::Host(_) = v {
                let host =
                    std::mem::replace(v, StateValue::Host(TensorValue::F32(Default::default())));
                let buffer = in_place_buffer(name, past, host)?;
                *v = StateValue::Native {
                    value: Box::new(buffer),
                    to_host: native_to_host,
                };
            }
        }
        let mut binding = self.session.create_binding().map_err(|e| failed(name, e))?;
        for outlet in self.session.inputs() {
            let wanted = outlet.name();
            if let Some(t) = inputs.iter().find(|t| t.name == wanted) {
                let value = owned_input(name, &t.value)?;
                binding
                    .bind_input(wanted, &value)
                    .map_err(|e| failed(name, e))?;
            } else {
                let value = state_buffer(state, wanted)?;
                binding
                    .bind_input(wanted, value)
                    .map_err(|e| failed(name, e))?;
            }
        }
        for (present, past) in carry {
            let value = state
                .values
                .iter_mut()
                .find(|(n, _)| n == past)
                .and_then(|(_, v)| match v {
                    StateValue::Native { value, .. } => value.downcast_mut::<DynValue>(),
                    StateValue::Host(_) => None,
                })
                .ok_or_else(|| missing_output(present))?;
            binding
                .bind_output(present.as_str(), value)
                .map_err(|e| failed(name, e))?;
        }
        let cpu = MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Device,
            MemoryType::Default,
        )
        .map_err(|e| failed(name, e))?;
        let rest_names: Vec<String> = self
            .session
            .outputs()
            .iter()
            .map(|o| o.name().to_string())
            .filter(|n| !carry.iter().any(|(present, _)| present == n))
            .collect();
        for out_name in &rest_names {
            binding
                .bind_output_to_device(out_name.as_str(), &cpu)
                .map_err(|e| failed(name, e))?;
        }
        let outputs = self
            .session
            .run_binding(&binding)
            .map_err(|e| failed(name, e))?;
        rest_names
            .iter()
            .map(|out_name| {
                let v = outputs.get(out_name.as_str()).ok_or_else(|| {
                    failed(name, format!("the run returned no output named {out_name}"))
                })?;
                Ok(NamedTensor {
                    name: out_name.clone(),
                    value: host_value(name, out_name, v)?,
                })
            })
            .collect()
    }
}
