//! `gmlp_onnx._native`: the Python bindings of gmlp-onnx (PyO3, one abi3 wheel for CPython
//! 3.9+), laid out as safetensors' and tokenizers' `bindings/python`: this crate beside the
//! library, the Python package in `python/gmlp_onnx` (its public API, stubs, `py.typed`),
//! its tests in `tests/`.
//!
//! The bindings are thin: `export` plans and runs the library's build pipeline
//! ([`gmlp_onnx::pipeline`]) from the build command's own flag definitions (keywords are
//! the flags, dashes as underscores: [`options`]); `validate` runs the library's validate
//! with the module's outputs as a [`gmlp_onnx::validate::Reference`]; `Generator` owns one
//! loaded model and drives the library's one generation loop step by step, releasing the
//! GIL during each step; `main` is the `gmlp-onnx` command itself (maturin cannot put a
//! binary and an extension into one wheel, so the wheel's `gmlp-onnx` script calls it).
//!
//! The command line's source (`src/cli`) is compiled into this crate too, so that the
//! entry point runs exactly the binary's code and the keywords are exactly its flags.

#![warn(missing_docs)]

#[path = "../../../src/cli/mod.rs"]
#[allow(dead_code, missing_docs)]
mod cli;

mod errors;
mod export;
mod generator;
mod options;
mod tensors;
mod validate;

use pyo3::prelude::*;

/// The `gmlp-onnx` command: `argv` as `sys.argv` has it (the script's path first). Runs
/// with the GIL released, as the Rust binary does (SIGPIPE at its default, the interrupt
/// handler that removes unfinished files), and returns the exit code; a panic is the
/// binary's internal error (its one line, exit 101).
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(
        || match std::panic::catch_unwind(|| cli::run_command(argv)) {
            Ok(code) => i32::from(code),
            Err(_) => 101,
        },
    )
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // ONNX Runtime is looked for as the command looks for it, this interpreter's
    // environment standing for the one the binary is installed in.
    let prefix: std::path::PathBuf = m.py().import("sys")?.getattr("prefix")?.extract()?;
    gmlp_onnx::runtime::discovery::set_installed_in(prefix);
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_function(wrap_pyfunction!(export::export, m)?)?;
    m.add_function(wrap_pyfunction!(validate::validation_inputs, m)?)?;
    m.add_function(wrap_pyfunction!(validate::validate, m)?)?;
    m.add_function(wrap_pyfunction!(validate::inspect, m)?)?;
    m.add_class::<generator::Generator>()?;
    Ok(())
}
