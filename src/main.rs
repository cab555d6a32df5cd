//! `gmlp-onnx`: parses the command line and dispatches to the command (see [`cli`]).

#![deny(unsafe_code)]

mod cli;

use std::process::ExitCode;

use cli::Command;

fn main() -> ExitCode {
    cli::restore_default_sigpipe();
    cli::install_handlers();
    // Lets the tests check the panic backstop from outside (exit 101, one line).
    if std::env::var_os("GMLP_ONNX_DEBUG_PANIC").is_some() {
        panic!("GMLP_ONNX_DEBUG_PANIC is set");
    }
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    cli::finish(match cli.command {
        Command::Build(args) => cli::build::run(*args),
        Command::Presets { json } => cli::presets::run(json),
        Command::Validate(args) => cli::validate::run(args),
        Command::Generate(args) => cli::generate::run(args),
        Command::Inspect { model, json, plot } => cli::inspect::run(&model, json, plot.as_deref()),
        Command::Triton(args) => cli::triton::run(args),
        Command::Genai(args) => cli::genai::run(args),
        Command::Doctor { ort } => cli::doctor::run(&ort),
    })
}
