//! Buffers that ONNX Runtime allocated and the tool writes and reads in place: the one
//! module of the runtime layer with `unsafe` (`runtime` denies it everywhere else). A
//! [`Buffer`] knows where its memory lives ([`Location`]) and checks it, with its length,
//! before each raw access: the location ONNX Runtime reports for the tensor
//! (`memory_info`) must be the one the buffer was made for, so that a device pointer is
//! never written as host memory or the other way round. Also here: the run of an
//! `IoBinding` without ort's per-run output wrapping ([`run_binding`]) and the locations a
//! session wants its inputs in ([`input_locations`]), which decide whether a bound input
//! may be written in place between runs.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, RunOptions, Session};
use ort::value::{PrimitiveTensorElementType, Tensor};
use ort::AsPointer;

use crate::error::{one_line, Error, Result};

mod cuda;

pub(crate) use cuda::CudaRuntime;

/// Where a tensor's memory lives, as far as writing it through a pointer is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Location {
    /// Host memory (ONNX Runtime's `Cpu` device).
    Host,
    /// The memory of CUDA device `device` (ONNX Runtime's `Cuda` device).
    Cuda {
        /// CUDA device ordinal.
        device: i32,
    },
    /// Any other memory (e.g. pinned host memory): never written through a pointer here.
    Other,
}

impl Location {
    /// The location of ONNX Runtime's allocation device `name` (`Cpu`, `Cuda`, …) with the
    /// device id `id`.
    fn named(name: &str, id: i32) -> Location {
        if name == AllocationDevice::CPU.as_str() {
            Location::Host
        } else if name == AllocationDevice::CUDA.as_str() {
            Location::Cuda { device: id }
        } else {
            Location::Other
        }
    }

    /// The location `info` describes.
    fn of(info: &MemoryInfo) -> Location {
        Location::named(info.allocation_device().as_str(), info.device_id())
    }
}

/// Whether a buffer in `held` bound as an input that the session wants in `wanted` is
/// read where it is by every run: ONNX Runtime copies a bound input to the location its
/// consumers want at bind time (ort's `IoBinding::bind_input`), so an input bound where
/// it is not wanted is a copy that later writes to the buffer never reach; such an input
/// must be bound again before each run.
pub(crate) fn stays_bound(wanted: Location, held: Location) -> bool {
    wanted == held && wanted != Location::Other
}

/// Where the buffers of one session are made, with what writes and reads them.
#[derive(Clone)]
enum Place {
    /// Host memory.
    Host,
    /// CUDA device memory, copied through the CUDA runtime ONNX Runtime loaded.
    Cuda(Arc<CudaRuntime>),
}

impl Place {
    fn location(&self) -> Location {
        match self {
            Place::Host => Location::Host,
            Place::Cuda(cuda) => Location::Cuda {
                device: cuda.device(),
            },
        }
    }
}

/// The memory a session's buffers come from: host memory (the CPU execution provider)
/// or a CUDA device's, from the session's own allocator.
pub(crate) struct Memory {
    place: Place,
    allocator: Allocator,
}

impl Memory {
    /// Host memory.
    pub(crate) fn host() -> Memory {
        Memory {
            place: Place::Host,
            allocator: Allocator::default(),
        }
    }

    /// The memory of CUDA device `device`, allocated by `session` (which runs on it).
    pub(crate) fn cuda(session: &Session, device: i32) -> Result<Memory> {
        let info = MemoryInfo::new(
            AllocationDevice::CUDA,
            device,
            AllocatorType::Device,
            MemoryType::Default,
        )
        .map_err(cuda_failed)?;
        Ok(Memory {
            allocator: Allocator::new(session, info).map_err(cuda_failed)?,
            place: Place::Cuda(Arc::new(CudaRuntime::loaded(device)?)),
        })
    }

    /// Where this memory is.
    pub(crate) fn location(&self) -> Location {
        self.place.location()
    }

    /// A zeroed buffer of `shape` in this memory.
    pub(crate) fn zeros<T: PrimitiveTensorElementType + std::fmt::Debug + Copy>(
        &self,
        shape: &[usize],
    ) -> Result<Buffer<T>> {
        let tensor = Tensor::<T>::new(&self.allocator, shape.to_vec()).map_err(|e| {
            Error::RuntimeFailed {
                runtime: self.runtime(),
                reason: format!(
                    "cannot allocate a buffer of shape {shape:?}: {}",
                    one_line(e)
                ),
            }
        })?;
        let mut buffer = Buffer {
            tensor,
            place: self.place.clone(),
            len: shape.iter().product(),
        };
        buffer.zero()?;
        Ok(buffer)
    }

    /// Waits until the writes issued so far have landed (device memory).
    pub(crate) fn synchronize(&self) -> Result<()> {
        match &self.place {
            Place::Host => Ok(()),
            Place::Cuda(cuda) => cuda.synchronize(),
        }
    }

    fn runtime(&self) -> String {
        runtime_of(&self.place)
    }
}

/// The runtime's name for errors about memory in `place`.
fn runtime_of(place: &Place) -> String {
    match place {
        Place::Host => crate::runtime::RuntimeKind::OrtCpu.name(),
        Place::Cuda(_) => crate::runtime::RuntimeKind::OrtCuda.name(),
    }
}

fn cuda_failed(e: ort::Error) -> Error {
    Error::RuntimeFailed {
        runtime: crate::runtime::RuntimeKind::OrtCuda.name(),
        reason: one_line(e),
    }
}

/// A tensor ONNX Runtime allocated in one [`Memory`], of `len` elements, which the tool
/// binds to sessions and writes and reads in place.
pub(crate) struct Buffer<T: PrimitiveTensorElementType + std::fmt::Debug> {
    tensor: Tensor<T>,
    place: Place,
    len: usize,
}

impl<T: PrimitiveTensorElementType + std::fmt::Debug + Copy> Buffer<T> {
    /// The tensor, to bind as an input.
    pub(crate) fn tensor(&self) -> &Tensor<T> {
        &self.tensor
    }

    /// The tensor, to bind as an output.
    pub(crate) fn tensor_mut(&mut self) -> &mut Tensor<T> {
        &mut self.tensor
    }

    /// Checks what the raw accesses rely on: the tensor lives where the buffer was made
    /// for (ONNX Runtime's own account of it), and elements `range` lie within its `len`
    /// elements, which its shape holds.
    fn check(&self, range: std::ops::Range<usize>) -> Result<()> {
        let found = Location::of(self.tensor.memory_info());
        let wanted = self.place.location();
        if found != wanted {
            return Err(Error::Internal(format!(
                "a buffer made for {wanted:?} memory lives in {found:?} memory"
            )));
        }
        let elements = self.tensor.shape().iter().product::<i64>();
        if usize::try_from(elements).ok() != Some(self.len) || range.end > self.len {
            return Err(Error::Internal(format!(
                "elements {range:?} of a buffer of {} (shape {:?})",
                self.len,
                self.tensor.shape()
            )));
        }
        Ok(())
    }

    /// Sets every element to zero (on the device: and waits until it is).
    pub(crate) fn zero(&mut self) -> Result<()> {
        self.check(0..self.len)?;
        let bytes = self.len * std::mem::size_of::<T>();
        let ptr = self.tensor.data_ptr_mut();
        match &self.place {
            // SAFETY: checked above: host memory of `len` elements, `bytes` bytes.
            Place::Host => unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) },
            // SAFETY: checked above: memory of the runtime's device, `bytes` bytes.
            Place::Cuda(cuda) => unsafe { cuda.zero(ptr, bytes)? },
        }
        Ok(())
    }

    /// Writes `values` over the start of the buffer; on the device they have landed after
    /// [`Memory::synchronize`].
    pub(crate) fn write(&mut self, values: &[T]) -> Result<()> {
        self.check(0..values.len())?;
        let ptr = self.tensor.data_ptr_mut();
        match &self.place {
            // SAFETY: checked above: host memory holding at least `values.len()` elements.
            Place::Host => unsafe {
                std::ptr::copy_nonoverlapping(values.as_ptr(), ptr.cast::<T>(), values.len())
            },
            // SAFETY: checked above: memory of the runtime's device holding them.
            Place::Cuda(cuda) => unsafe {
                cuda.to_device(
                    ptr,
                    values.as_ptr().cast::<c_void>(),
                    std::mem::size_of_val(values),
                )?
            },
        }
        Ok(())
    }

    /// Reads `out.len()` elements from element `offset` on.
    pub(crate) fn read(&self, offset: usize, out: &mut [T]) -> Result<()> {
        self.check(offset..offset + out.len())?;
        // SAFETY: checked above that `offset` lies within the allocation (or one past it
        // for an empty `out`).
        let src = unsafe { self.tensor.data_ptr().cast::<T>().add(offset) };
        match &self.place {
            // SAFETY: checked above: host memory holding the range.
            Place::Host => unsafe {
                std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len())
            },
            // SAFETY: checked above: memory of the runtime's device holding the range.
            Place::Cuda(cuda) => unsafe {
                cuda.to_host(
                    out.as_mut_ptr().cast::<c_void>(),
                    src.cast::<c_void>(),
                    std::mem::size_of_val(out),
                )?
            },
        }
        Ok(())
    }
}

/// Runs `binding` on `session`. ort's `run_binding` also asks ONNX Runtime for every bound
/// output back and wraps each in a new value, every run; the buffers are the tool's
/// already, so this calls `RunWithBinding` alone.
pub(crate) fn run_binding(
    session: &mut Session,
    binding: &IoBinding,
    options: &RunOptions,
) -> ort::Result<()> {
    // SAFETY: the three pointers are live objects owned by the arguments for the whole
    // call; `&mut Session` keeps the (not thread-safe) run exclusive.
    let status = unsafe {
        (ort::api().RunWithBinding)(session.ptr().cast_mut(), options.ptr(), binding.ptr())
    };
    // SAFETY: a status returned by the call above, owned here.
    unsafe { ort::Error::result_from_status(status) }
}

/// Where `session` wants each of its inputs, in input order (ONNX Runtime's
/// `SessionGetMemoryInfoForInputs`: the memory of the inputs' consumers).
pub(crate) fn input_locations(session: &Session) -> ort::Result<Vec<Location>> {
    let count = session.inputs().len();
    let mut infos: Vec<*const ort::sys::OrtMemoryInfo> = vec![std::ptr::null(); count];
    // SAFETY: `infos` has room for one pointer per input, as the call requires; the
    // session is live for the call.
    let status = unsafe {
        (ort::api().SessionGetMemoryInfoForInputs)(session.ptr(), infos.as_mut_ptr(), count)
    };
    // SAFETY: a status returned by the call above, owned here.
    unsafe { ort::Error::result_from_status(status) }?;
    infos
        .into_iter()
        .map(|info| {
            if info.is_null() {
                return Ok(Location::Other);
            }
            let mut name: *const c_char = std::ptr::null();
            let mut id: c_int = 0;
            // SAFETY: `info` is a memory info the session owns and keeps while it lives
            // (not null, checked above); the getters write their one out-parameter.
            unsafe {
                ort::Error::result_from_status((ort::api().MemoryInfoGetName)(info, &mut name))?;
                ort::Error::result_from_status((ort::api().MemoryInfoGetId)(info, &mut id))?;
            }
            if name.is_null() {
                return Ok(Location::Other);
            }
            // SAFETY: a NUL-terminated name the memory info owns (not null, checked above).
            let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
            Ok(Location::named(&name, id))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_input_stays_bound_only_where_the_session_reads_it() {
        let (host, gpu0, gpu1) = (
            Location::Host,
            Location::Cuda { device: 0 },
            Location::Cuda { device: 1 },
        );
        assert!(stays_bound(host, host));
        assert!(stays_bound(gpu0, gpu0));
        // A device buffer read by a node on the CPU: copied to the host at bind time.
        assert!(!stays_bound(host, gpu0));
        assert!(!stays_bound(gpu0, host));
        assert!(!stays_bound(gpu1, gpu0));
        assert!(!stays_bound(Location::Other, Location::Other));
    }

    #[test]
    fn locations_follow_onnx_runtimes_device_names() {
        assert_eq!(Location::named("Cpu", 0), Location::Host);
        assert_eq!(Location::named("Cuda", 3), Location::Cuda { device: 3 });
        assert_eq!(Location::named("CudaPinned", 0), Location::Other);
    }
}
