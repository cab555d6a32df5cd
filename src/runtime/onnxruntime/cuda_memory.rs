//! The four CUDA runtime calls that device-resident decoding needs beyond ONNX Runtime's
//! own API, which has no host↔device copy (ort's `copy_into` runs a one-node session per
//! copy, tens of microseconds, the cost of a whole captured step): `cudaMemcpy`,
//! `cudaMemset`, `cudaDeviceSynchronize` and `cudaGetErrorString`, from the `libcudart`
//! that ONNX Runtime's CUDA execution provider has already loaded (onnxruntime-gpu 1.31
//! links CUDA 13's `libcudart.so.13`). Considered: the `cudarc` crate, which covers the
//! whole driver and runtime API but is built per CUDA version; these four calls have been
//! stable since CUDA 1.0, so `libloading` (already in the tree through `ort`) suffices.
//!
//! Ordering: ONNX Runtime runs on its own non-blocking stream and synchronizes it before
//! `Run` returns; these calls go to the legacy default stream, and the writes before a run
//! end with one `cudaDeviceSynchronize`, so no kernel reads a buffer before its new
//! contents arrive (a host-to-device `cudaMemcpy` from pageable memory may return before
//! its DMA ends).

use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::Library;

use crate::error::{Error, Result};

/// `cudaMemcpyHostToDevice`.
const HOST_TO_DEVICE: c_int = 1;
/// `cudaMemcpyDeviceToHost`.
const DEVICE_TO_HOST: c_int = 2;

/// The library names tried, newest CUDA first (the one ONNX Runtime loaded is found by its
/// soname without searching).
const LIBRARIES: [&str; 3] = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"];

type Memcpy = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> c_int;
type Memset = unsafe extern "C" fn(*mut c_void, c_int, usize) -> c_int;
type Synchronize = unsafe extern "C" fn() -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// Copies between host memory and device memory that ONNX Runtime allocated.
pub(crate) struct CudaMemory {
    memcpy: Memcpy,
    memset: Memset,
    synchronize: Synchronize,
    error_string: ErrorString,
    /// Keeps the functions above loaded.
    _library: Library,
}

impl CudaMemory {
    /// Loads the CUDA runtime (after a CUDA session exists, so that it is ONNX Runtime's).
    pub(crate) fn load() -> Result<CudaMemory> {
        let mut tried = Vec::new();
        for name in LIBRARIES {
            // SAFETY: loading the CUDA runtime runs its initializers, which have no
            // preconditions; the symbols below have the CUDA runtime API's C signatures.
            match unsafe { Library::new(name) } {
                Ok(library) => unsafe {
                    let memcpy = *library
                        .get::<Memcpy>(b"cudaMemcpy\0")
                        .map_err(unavailable)?;
                    let memset = *library
                        .get::<Memset>(b"cudaMemset\0")
                        .map_err(unavailable)?;
                    let synchronize = *library
                        .get::<Synchronize>(b"cudaDeviceSynchronize\0")
                        .map_err(unavailable)?;
                    let error_string = *library
                        .get::<ErrorString>(b"cudaGetErrorString\0")
                        .map_err(unavailable)?;
                    return Ok(CudaMemory {
                        memcpy,
                        memset,
                        synchronize,
                        error_string,
                        _library: library,
                    });
                },
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(unavailable(tried.join("; ")))
    }

    /// Copies `bytes` host bytes at `host` to device memory at `device`; they are there
    /// after the next [`CudaMemory::synchronize`] (the copy from pageable memory may
    /// return before its DMA ends).
    ///
    /// # Safety
    /// `device` must be a device allocation of at least `bytes` bytes and `host` readable
    /// for `bytes` bytes.
    pub(crate) unsafe fn to_device(
        &self,
        device: *mut c_void,
        host: *const c_void,
        bytes: usize,
    ) -> Result<()> {
        self.check("cudaMemcpy to the device", unsafe {
            (self.memcpy)(device, host, bytes, HOST_TO_DEVICE)
        })
    }

    /// Waits until every copy and set issued so far has completed.
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: no arguments; waits for the device.
        self.check("cudaDeviceSynchronize", unsafe { (self.synchronize)() })
    }

    /// Copies `bytes` device bytes at `device` to host memory at `host` (returns when they
    /// have arrived).
    ///
    /// # Safety
    /// `device` must be a device allocation of at least `bytes` bytes and `host` writable
    /// for `bytes` bytes.
    pub(crate) unsafe fn to_host(
        &self,
        host: *mut c_void,
        device: *const c_void,
        bytes: usize,
    ) -> Result<()> {
        self.check("cudaMemcpy to the host", unsafe {
            (self.memcpy)(host, device, bytes, DEVICE_TO_HOST)
        })
    }

    /// Sets `bytes` device bytes at `device` to zero and waits until they are.
    ///
    /// # Safety
    /// `device` must be a device allocation of at least `bytes` bytes.
    pub(crate) unsafe fn zero(&self, device: *mut c_void, bytes: usize) -> Result<()> {
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
            runtime: "ort-cuda".into(),
            reason: format!("{what} failed: {text} (CUDA error {status})"),
        })
    }
}

fn unavailable(reason: impl std::fmt::Display) -> Error {
    Error::RuntimeUnavailable {
        runtime: "ort-cuda".into(),
        reason: format!("the CUDA runtime library (libcudart) could not be used: {reason}"),
    }
}
