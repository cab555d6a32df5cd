//! `gmlp-onnx`: parses the command line and dispatches to the command (see [`cli`]).

#![deny(unsafe_code)]

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(cli::run_command(std::env::args_os()))
}
