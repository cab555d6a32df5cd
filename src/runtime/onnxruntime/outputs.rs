//! [`Runtime::run_into`] and [`Runtime::on_device`] for ONNX Runtime, through ort's
//! `IoBinding`: the outputs land once, in buffers the tool owns.
//!
//! - CPU execution provider: the caller's arrays are bound as the outputs, so the nodes
//!   that compute them write straight into them. Their shapes are those the last run
//!   produced from inputs of the same shapes; a first run of a shape (or one whose output
//!   shapes follow the inputs' values, which ONNX Runtime refuses to write into arrays of
//!   other shapes) lets ONNX Runtime allocate, and copies once.
//! - CUDA execution provider: the outputs are bound to device memory, then copied once by
//!   ONNX Runtime into the caller's arrays, their shapes taken from what the run produced;
//!   [`OrtRuntime::on_device_unguarded`] leaves them on the device.
//!
//! [`Runtime::run_into`]: crate::runtime::Runtime::run_into
//! [`Runtime::on_device`]: crate::runtime::Runtime::on_device

use std::fmt::Debug;

use ndarray::{ArrayD, IxDyn};
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, Session};
use ort::value::{
    DynTensorValueType, DynValue, IntoTensorElementType, PrimitiveTensorElementType,
    TensorElementType, TensorRefMut, TensorValueType, ValueType,
};

use super::{failed, OrtRuntime, Provider};
use crate::error::{contain_panic, Error, Result};
use crate::runtime::DeviceRun;
use crate::tensor::{with_array, NamedTensor, TensorValue};

/// A host array as an owned ONNX Runtime tensor (a copy; bound inputs must own their data).
fn owned_input(name: &str, value: &TensorValue) -> Result<DynValue> {
    Ok(
        with_array!(value, a => ort::value::Tensor::from_array(a.clone())
        .map_err(|e| failed(name, e))?
        .into_dyn()),
    )
}

/// What the last run on the CPU saw: its inputs' shapes (in session input order) and the
/// shapes of the outputs it produced (in graph order), which a run with inputs of the same
/// shapes writes into.
pub(super) struct RunShapes {
    inputs: Vec<Vec<usize>>,
    outputs: Vec<Vec<usize>>,
}

/// One output as it lands: its name, element type and shape.
type Layout = (String, TensorElementType, Vec<usize>);

/// The element type of an array.
fn element_type<T: IntoTensorElementType>(_: &ArrayD<T>) -> TensorElementType {
    T::into_tensor_element_type()
}

/// A zero array of an output's element type and shape (zeroed pages are only touched
/// when the run writes them), or the error for a type the tool does not compare.
fn zeros(
    runtime: &str,
    out_name: &str,
    ty: TensorElementType,
    shape: &[usize],
) -> Result<TensorValue> {
    let shape = IxDyn(shape);
    Ok(match ty {
        TensorElementType::Float32 => TensorValue::F32(ArrayD::zeros(shape)),
        TensorElementType::Float64 => TensorValue::F64(ArrayD::zeros(shape)),
        TensorElementType::Int32 => TensorValue::I32(ArrayD::zeros(shape)),
        TensorElementType::Int64 => TensorValue::I64(ArrayD::zeros(shape)),
        _ => {
            return Err(failed(
                runtime,
                format!(
                    "output {out_name} is not float32, float64, int32 or int64, the types compared"
                ),
            ))
        }
    })
}

/// Makes `outputs` hold one array per entry of `layout`, in its order: an array already
/// in place with the entry's name, element type and shape (contiguous, so that it can be
/// bound) is kept, any other is replaced by zeros.
fn prepare(runtime: &str, outputs: &mut Vec<NamedTensor>, layout: &[Layout]) -> Result<()> {
    outputs.truncate(layout.len());
    for (i, (out_name, ty, shape)) in layout.iter().enumerate() {
        let fits = outputs.get(i).is_some_and(|o| {
            o.name == *out_name
                && o.value.shape() == shape.as_slice()
                && with_array!(&o.value, a => element_type(a) == *ty && a.is_standard_layout())
        });
        if fits {
            continue;
        }
        let fresh = NamedTensor {
            name: out_name.clone(),
            value: zeros(runtime, out_name, *ty, shape)?,
        };
        if i < outputs.len() {
            outputs[i] = fresh;
        } else {
            outputs.push(fresh);
        }
    }
    Ok(())
}

/// The element type and shape of a tensor value (or of a declared output).
fn tensor_layout(
    runtime: &str,
    out_name: &str,
    ty: &ValueType,
) -> Result<(TensorElementType, Vec<usize>)> {
    match ty {
        ValueType::Tensor { ty, shape, .. } => Ok((
            *ty,
            shape
                .iter()
                .map(|&d| usize::try_from(d).unwrap_or(0))
                .collect(),
        )),
        _ => Err(failed(
            runtime,
            format!("output {out_name} is not a tensor"),
        )),
    }
}

/// Copies an output ONNX Runtime allocated into `slot` (same type and shape): a host
/// value by a plain copy, a device value by ONNX Runtime's own transfer to the host.
fn land(runtime: &str, value: DynValue, slot: &mut TensorValue) -> Result<()> {
    let tensor = value
        .downcast::<DynTensorValueType>()
        .map_err(|e| failed(runtime, e))?;
    if tensor.memory_info().is_cpu_accessible() {
        with_array!(slot, a => a.assign(
            &tensor.try_extract_array().map_err(|e| failed(runtime, e))?
        ));
        Ok(())
    } else {
        with_array!(slot, a => copy_to_host(tensor.into_dyn(), a)).map_err(|e| failed(runtime, e))
    }
}

/// Copies a device tensor into a host array of its type and shape (ort's `copy_into`
/// checks both; ONNX Runtime moves the bytes).
fn copy_to_host<T: PrimitiveTensorElementType + Debug + Clone + 'static>(
    value: DynValue,
    a: &mut ArrayD<T>,
) -> ort::Result<()> {
    let source = value.downcast::<TensorValueType<T>>()?;
    source.copy_into(TensorRefMut::from_array_view_mut(a.view_mut())?)
}

/// The memory of CUDA device `device`, where ort-cuda's execution provider runs.
fn cuda_memory(device: i32) -> ort::Result<MemoryInfo<'static>> {
    MemoryInfo::new(
        AllocationDevice::CUDA,
        device,
        AllocatorType::Device,
        MemoryType::Default,
    )
}

/// Host memory for outputs ONNX Runtime allocates.
fn cpu_memory() -> ort::Result<MemoryInfo<'static>> {
    MemoryInfo::new(
        AllocationDevice::CPU,
        0,
        AllocatorType::Device,
        MemoryType::Default,
    )
}

impl OrtRuntime {
    /// A binding of `inputs` (matched by name to the session's inputs, each copied once
    /// into a value ONNX Runtime may keep: on CUDA, onto the device) and their shapes in
    /// session input order.
    fn bind_inputs(&self, inputs: &[NamedTensor]) -> Result<(IoBinding, Vec<Vec<usize>>)> {
        let name = self.name;
        let mut binding = self.session.create_binding().map_err(|e| failed(name, e))?;
        let mut shapes = Vec::with_capacity(inputs.len());
        for outlet in self.session.inputs() {
            let wanted = outlet.name();
            let t = inputs.iter().find(|t| t.name == wanted).ok_or_else(|| {
                Error::BadTensor(format!("no value given for model input {wanted}"))
            })?;
            let value = owned_input(name, &t.value)?;
            binding
                .bind_input(wanted, &value)
                .map_err(|e| failed(name, e))?;
            shapes.push(t.value.shape().to_vec());
        }
        Ok((binding, shapes))
    }

    /// The session's output names, in graph order.
    fn output_names(&self) -> Vec<String> {
        self.session
            .outputs()
            .iter()
            .map(|o| o.name().to_string())
            .collect()
    }

    /// [`Runtime::run_into`](crate::runtime::Runtime::run_into): see the module's text.
    pub(super) fn run_into_unguarded(
        &mut self,
        inputs: &[NamedTensor],
        outputs: &mut Vec<NamedTensor>,
    ) -> Result<()> {
        let name = self.name;
        let (mut binding, input_shapes) = self.bind_inputs(inputs)?;
        let output_names = self.output_names();
        if let Provider::Cuda { device, .. } = self.provider {
            let cuda = cuda_memory(device).map_err(|e| failed(name, e))?;
            for out_name in &output_names {
                binding
                    .bind_output_to_device(out_name.as_str(), &cuda)
                    .map_err(|e| failed(name, e))?;
            }
            return self.land_all(&binding, &output_names, outputs);
        }
        let known = self
            .shapes
            .as_ref()
            .filter(|s| s.inputs == input_shapes)
            .map(|s| s.outputs.clone());
        if let Some(shapes) = known {
            let layout = self
                .session
                .outputs()
                .iter()
                .zip(shapes)
                .map(|(o, shape)| {
                    let (ty, _) = tensor_layout(name, o.name(), o.dtype())?;
                    Ok((o.name().to_string(), ty, shape))
                })
                .collect::<Result<Vec<Layout>>>()?;
            prepare(name, outputs, &layout)?;
            if self.run_bound(&mut binding, outputs)? {
                return Ok(());
            }
            binding.clear_outputs();
        }
        let cpu = cpu_memory().map_err(|e| failed(name, e))?;
        for out_name in &output_names {
            binding
                .bind_output_to_device(out_name.as_str(), &cpu)
                .map_err(|e| failed(name, e))?;
        }
        self.land_all(&binding, &output_names, outputs)?;
        self.shapes = Some(RunShapes {
            inputs: input_shapes,
            outputs: outputs.iter().map(|o| o.value.shape().to_vec()).collect(),
        });
        Ok(())
    }

    /// Binds each array of `outputs` as the output of its name and runs; `false` (the
    /// outputs' contents then unspecified) when the run failed. The shapes bound are those
    /// the last run produced from inputs of the same shapes; a graph whose output shapes
    /// follow its inputs' values (`NonZero`) may compute others, and ONNX Runtime then
    /// refuses the arrays. No check before the run can tell (the shapes come from the
    /// values), and its refusal is told apart from other failures only by its wording, so
    /// any failure here lets the caller run again with ONNX Runtime allocating: a real
    /// failure fails that run too, and is reported from it.
    fn run_bound(&mut self, binding: &mut IoBinding, outputs: &mut [NamedTensor]) -> Result<bool> {
        let name = self.name;
        for o in outputs.iter_mut() {
            with_array!(&mut o.value, a => {
                let view = TensorRefMut::from_array_view_mut(a.view_mut())
                    .map_err(|e| failed(name, e))?;
                binding
                    .bind_output(o.name.as_str(), view)
                    .map_err(|e| failed(name, e))?;
            });
        }
        match self.session.run_binding(binding) {
            Ok(_) => Ok(true),
            Err(_) => Ok(false),
        }
    }

    /// Runs `binding` (its outputs bound to a device, ONNX Runtime allocating) and copies
    /// each output once into `outputs` (arrays of the right name, type and shape reused).
    fn land_all(
        &mut self,
        binding: &IoBinding,
        output_names: &[String],
        outputs: &mut Vec<NamedTensor>,
    ) -> Result<()> {
        let name = self.name;
        let mut values = self
            .session
            .run_binding(binding)
            .map_err(|e| failed(name, e))?;
        let mut taken = Vec::with_capacity(output_names.len());
        let mut layout = Vec::with_capacity(output_names.len());
        for out_name in output_names {
            let v = values.remove(out_name.as_str()).ok_or_else(|| {
                failed(name, format!("the run returned no output named {out_name}"))
            })?;
            let (ty, shape) = tensor_layout(name, out_name, v.dtype())?;
            layout.push((out_name.clone(), ty, shape));
            taken.push(v);
        }
        prepare(name, outputs, &layout)?;
        for (v, o) in taken.into_iter().zip(outputs.iter_mut()) {
            land(name, v, &mut o.value)?;
        }
        Ok(())
    }

    /// [`Runtime::on_device`](crate::runtime::Runtime::on_device): on CUDA, `inputs`
    /// copied to the device once (ONNX Runtime copies a bound host value where the graph
    /// reads it, at bind time) and the outputs bound to device memory, which ONNX Runtime
    /// allocates at the first run and reuses after; `None` on the CPU.
    pub(super) fn on_device_unguarded(
        &mut self,
        inputs: &[NamedTensor],
    ) -> Result<Option<Box<dyn DeviceRun + '_>>> {
        let Provider::Cuda { device, .. } = self.provider else {
            return Ok(None);
        };
        let name = self.name;
        let (mut binding, _) = self.bind_inputs(inputs)?;
        binding.synchronize_inputs().map_err(|e| failed(name, e))?;
        let cuda = cuda_memory(device).map_err(|e| failed(name, e))?;
        for out_name in self.output_names() {
            binding
                .bind_output_to_device(out_name, &cuda)
                .map_err(|e| failed(name, e))?;
        }
        Ok(Some(Box::new(OrtDeviceRun {
            session: &mut self.session,
            binding,
            name,
        })))
    }
}

/// A session with its inputs on the device and its outputs bound to device memory.
struct OrtDeviceRun<'a> {
    session: &'a mut Session,
    binding: IoBinding,
    name: &'static str,
}

impl DeviceRun for OrtDeviceRun<'_> {
    fn run(&mut self) -> Result<()> {
        let name = self.name;
        contain_panic(name, || {
            // ONNX Runtime synchronizes the CUDA stream at the end of a run; the outputs'
            // devices are synchronized as well, so that the run is over when this returns.
            drop(
                self.session
                    .run_binding(&self.binding)
                    .map_err(|e| failed(name, e))?,
            );
            self.binding
                .synchronize_outputs()
                .map_err(|e| failed(name, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{ArrayD, IxDyn};
    use ort::value::Tensor;

    use super::copy_to_host;
    use crate::runtime::onnxruntime::{environment_for, find_library};

    #[test]
    #[cfg_attr(
        not(feature = "test-onnxruntime"),
        ignore = "needs ONNX Runtime's library (the test Python environment): scripts/test"
    )]
    fn a_value_onnx_runtime_holds_is_copied_into_an_array_of_its_shape_only() {
        // The transfer ort-cuda's outputs take to the host, here from host memory.
        let kind = crate::runtime::RuntimeKind::OrtCpu;
        environment_for(&find_library(None, kind).unwrap(), kind).unwrap();
        let values: Vec<f32> = (0..6).map(|v| v as f32 - 2.5).collect();
        let source = || {
            let a = ArrayD::from_shape_vec(IxDyn(&[2, 3]), values.clone()).unwrap();
            Tensor::from_array(a).unwrap().into_dyn()
        };
        let mut a = ArrayD::<f32>::zeros(IxDyn(&[2, 3]));
        copy_to_host(source(), &mut a).unwrap();
        assert_eq!(a.as_slice().unwrap(), values.as_slice());
        let mut transposed = ArrayD::<f32>::zeros(IxDyn(&[3, 2]));
        assert!(copy_to_host(source(), &mut transposed).is_err());
        assert!(transposed.iter().all(|&v| v == 0.0));
        let mut wider = ArrayD::<f64>::zeros(IxDyn(&[2, 3]));
        assert!(copy_to_host(source(), &mut wider).is_err());
    }
}
