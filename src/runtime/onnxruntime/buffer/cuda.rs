//! The five CUDA runtime calls that device-resident decoding needs beyond ONNX Runtime's
//! own API, which has no host↔device copy (ort's `copy_into` runs a one-node session per
//! copy, tens of microseconds, the cost of a whole captured step): `cudaSetDevice`,
//! `cudaMemcpy`, `cudaMemset`, `cudaDeviceSynchronize` and `cudaGetErrorString`, from the
//! `libcudart` that ONNX Runtime's CUDA execution provider has already loaded
//! (onnxruntime-gpu 1.31 links CUDA 13's `libcudart.so.13`). Considered: the `cudarc`
//! crate, which covers the whole driver and runtime API but is built per CUDA version;
//! these calls have been stable since CUDA 1.0, so `libloading` (already in the tree
//! through `ort`) suffices.
//!
//! Which library: only one already in the process is taken (`dlopen` with
//! `RTLD_NOLOAD`), so that the copies go through the very runtime whose allocations they
//! touch; none loaded (no CUDA session yet) or two different ones is an error, never a
//! library found on the search path.
//!
//! Ordering: ONNX Runtime runs on its own non-blocking stream and synchronizes it before
//! `Run` returns; these calls go to the legacy default stream of the session's device
//! (made current before each call), and the writes before a run end with one
//! `cudaDeviceSynchronize`, so no kernel reads a buffer before its new contents arrive (a
//! host-to-device `cudaMemcpy` from pageable memory may return before its DMA ends).

use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::os::unix::Library;

use crate::error::{Error, Result};
use crate::runtime::RuntimeKind;

/// `cudaMemcpyHostToDevice`.
const HOST_TO_DEVICE: c_int = 1;
/// `cudaMemcpyDeviceToHost`.
const DEVICE_TO_HOST: c_int = 2;

/// The sonames of the CUDA runtimes an ONNX Runtime build may have loaded, newest first.
const LIBRARIES: [&str; 3] = ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"];

type SetDevice = unsafe extern "C" fn(c_int) -> c_int;
type Memcpy = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> c_int;
type Memset = unsafe extern "C" fn(*mut c_void, c_int, usize) -> c_int;
type Synchronize = unsafe extern "C" fn() -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// Copies between host memory and the memory ONNX Runtime allocated on one CUDA device.
pub(crate) struct CudaRuntime {
    /// The device whose memory the copies touch (made current before each call).
    device: i32,
    set_device: SetDevice,
    memcpy: Memcpy,
    memset: Memset,
    synchronize: Synchronize,
    error_string: ErrorString,
    /// Keeps the functions above loaded.
    _library: Library,
}

/// The one name among `loaded` (the sonames found in the process), or why there is none.
fn the_loaded_one<'a>(loaded: &[&'a str]) -> Result<&'a str> {
    match loaded {
        [one] => Ok(one),
        [] => Err(unavailable(format!(
            "ONNX Runtime has loaded no CUDA runtime ({} not in the process)",
            LIBRARIES.join(", ")
        ))),
        several => Err(unavailable(format!(
            "several CUDA runtimes are loaded ({}), so the one ONNX Runtime uses is not known",
            several.join(", ")
        ))),
    }
}

impl CudaRuntime {
    /// The CUDA runtime ONNX Runtime loaded (call it after a CUDA session exists), for
    /// the memory of `device`.
    pub(crate) fn loaded(device: i32) -> Result<CudaRuntime> {
        let present: Vec<(&str, Library)> = LIBRARIES
            .iter()
            .filter_map(|&name| {
                // SAFETY: RTLD_NOLOAD opens nothing new: it only returns a handle to a
                // library already loaded (whose initializers have run), or fails.
                let library =
                    unsafe { Library::open(Some(name), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
                library.ok().map(|l| (name, l))
            })
            .collect();
        let names: Vec<&str> = present.iter().map(|(name, _)| *name).collect();
        let name = the_loaded_one(&names)?;
        let library = present
            .into_iter()
            .find_map(|(n, l)| (n == name).then_some(l))
            .ok_or_else(|| Error::Internal("the loaded CUDA runtime vanished".into()))?;
        // SAFETY: the symbols are the CUDA runtime API's, with these C signatures since
        // CUDA 1.0; the copies of the function pointers live no longer than `_library`.
        let runtime = unsafe {
            CudaRuntime {
                device,
                set_device: *library
                    .get::<SetDevice>(b"cudaSetDevice\0")
                    .map_err(unavailable)?,
                memcpy: *library
                    .get::<Memcpy>(b"cudaMemcpy\0")
                    .map_err(unavailable)?,
                memset: *library
                    .get::<Memset>(b"cudaMemset\0")
                    .map_err(unavailable)?,
                synchronize: *library
                    .get::<Synchronize>(b"cudaDeviceSynchronize\0")
                    .map_err(unavailable)?,
                error_string: *library
                    .get::<ErrorString>(b"cudaGetErrorString\0")
                    .map_err(unavailable)?,
                _library: library,
            }
        };
        runtime.make_current()?;
        Ok(runtime)
    }

    /// The device whose memory this runtime copies.
    pub(crate) fn device(&self) -> i32 {
        self.device
    }

    /// Makes the device current on this thread (the default stream and
    /// `cudaDeviceSynchronize` are per device).
    fn make_current(&self) -> Result<()> {
        // SAFETY: a plain call with an integer argument (an invalid device is an error).
        self.check("cudaSetDevice", unsafe { (self.set_device)(self.device) })
    }

    /// Copies `bytes` host bytes at `host` to device memory at `device`; they are there
    /// after the next [`CudaRuntime::synchronize`] (the copy from pageable memory may
    /// return before its DMA ends).
    ///
    /// # Safety
    /// `device` must be an allocation on this runtime's device of at least `bytes` bytes
    /// and `host` readable for `bytes` bytes.
    pub(crate) unsafe fn to_device(
        &self,
        device: *mut c_void,
        host: *const c_void,
        bytes: usize,
    ) -> Result<()> {
        self.make_current()?;
        self.check("cudaMemcpy to the device", unsafe {
            (self.memcpy)(device, host, bytes, HOST_TO_DEVICE)
        })
    }

    /// Waits until every copy and set issued so far has completed.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.make_current()?;
        // SAFETY: no arguments; waits for the device.
        self.check("cudaDeviceSynchronize", unsafe { (self.synchronize)() })
    }

    /// Copies `bytes` device bytes at `device` to host memory at `host` (returns when they
    /// have arrived).
    ///
    /// # Safety
    /// `device` must be an allocation on this runtime's device of at least `bytes` bytes
    /// and `host` writable for `bytes` bytes.
    pub(crate) unsafe fn to_host(
        &self,
        host: *mut c_void,
        device: *const c_void,
        bytes: usize,
    ) -> Result<()> {
        self.make_current()?;
        self.check("cudaMemcpy to the host", unsafe {
            (self.memcpy)(host, device, bytes, DEVICE_TO_HOST)
        })
    }

    /// Sets `bytes` device bytes at `device` to zero and waits until they are.
    ///
    /// # Safety
    /// `device` must be an allocation on this runtime's device of at least `bytes` bytes.
    pub(crate) unsafe fn zero(&self, device: *mut c_void, bytes: usize) -> Result<()> {
        self.make_current()?;
        self.check("cudaMemset", unsafe { (self.memset)(device, 0, bytes) })?;
        self.check("cudaDeviceSynchronize", unsafe { (self.synchronize)() })
    }

    fn check(&self, what: &str, status: c_int) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: cudaGetErrorString returns a static C string for every status.
        let text = unsafe { CStr::from_ptr((self.error_string)(status)) }.to_string_lossy();
        Err(Error::RuntimeFailed {
            runtime: RuntimeKind::OrtCuda.name(),
            reason: format!(
                "{what} on device {} failed: {text} (CUDA error {status})",
                self.device
            ),
        })
    }
}

fn unavailable(reason: impl std::fmt::Display) -> Error {
    Error::RuntimeUnavailable {
        runtime: RuntimeKind::OrtCuda.name(),
        reason: format!("the CUDA runtime library (libcudart) could not be used: {reason}"),
        remedy: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_one_loaded_cuda_runtime_is_taken() {
        assert_eq!(
            the_loaded_one(&["libcudart.so.13"]).unwrap(),
            "libcudart.so.13"
        );
        assert!(matches!(
            the_loaded_one(&[]),
            Err(Error::RuntimeUnavailable { .. })
        ));
        assert!(matches!(
            the_loaded_one(&["libcudart.so.13", "libcudart.so.12"]),
            Err(Error::RuntimeUnavailable { .. })
        ));
    }

    #[test]
    fn a_process_without_cuda_gets_an_error_not_a_library_from_the_search_path() {
        // No CUDA session exists in the unit tests, so no libcudart is loaded, even
        // where one is installed.
        let Err(Error::RuntimeUnavailable {
            runtime, reason, ..
        }) = CudaRuntime::loaded(0)
        else {
            panic!("a CUDA runtime was found although none is loaded");
        };
        assert_eq!(runtime, "ort-cuda");
        // The rendering of the family.
        assert!(reason.contains("has loaded no CUDA runtime"), "{reason}");
    }
}
