//! The `gmlp-onnx` command line: the argument structure, one module per command, and how
//! an outcome becomes output and an exit code.
//!
//! Exit codes: 0 success / runtimes agree, 1 runtimes disagree, 2 usage or input error,
//! 3 a requested runtime is unavailable, 130 interrupted, 101 internal error (a bug: please
//! report it); standard output closed early (`| head`): ended by SIGPIPE (141 in the shell).

pub mod build;
pub mod doctor;
pub mod flags;
pub mod genai;
pub mod generate;
pub mod inspect;
pub mod presets;
pub mod progress;
#[cfg(test)]
mod reference;
pub mod triton;
pub mod validate;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use gmlp_onnx::message::Setting;
use gmlp_onnx::runtime::discovery::LibrarySource;
use gmlp_onnx::runtime::RuntimeKind;
use gmlp_onnx::{Error, Remedy};

/// What `--version` prints after the name: the package version and the commit the binary
/// was built from (build/commit.rs: its short hash, `-dirty` when the sources differed from
/// it, "commit unknown" for a build outside a git checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("GMLP_ONNX_COMMIT"),
    ")"
);

/// The command line.
#[derive(Parser)]
#[command(
    name = "gmlp-onnx",
    version = VERSION,
    about = "Compile gMLP / aMLP (Pay Attention to MLPs) to ONNX and check it in tract and ONNX Runtime"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand)]
pub enum Command {
    /// Build an ONNX model from a preset (with optional overrides) or a trained checkpoint.
    Build(Box<build::BuildArgs>),
    /// List the presets with parameter counts and FLOPs of the graphs they emit, beside the paper's.
    Presets {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run a model on several runtimes with the same inputs and compare the outputs.
    Validate(validate::ValidateArgs),
    /// Generate tokens with a causal token model (built with --with-past, or variable length).
    Generate(generate::GenerateArgs),
    /// Describe an ONNX file: opsets, inputs/outputs, parameters, operators, metadata, and each block's spatial weight W with its Toeplitz-ness.
    Inspect {
        /// The ONNX model.
        model: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Write pictures of the spatial weights W into this directory (created if missing): one PNG per block and overview.png.
        #[arg(long, value_name = "DIR")]
        plot: Option<PathBuf>,
    },
    /// Say which ONNX Runtime library each runtime would load and why, whether CUDA registers, and run a check model.
    Doctor {
        /// The ONNX Runtime library checked (--ort-lib: instead of searching) and how it runs.
        #[command(flatten)]
        ort: flags::OrtFlags,
    },
    /// Put an existing ONNX file into a Triton Inference Server model repository.
    Triton(triton::TritonArgs),
    /// Write an onnxruntime-genai model folder (og.Model(DIR)) for a static-state causal model.
    Genai(genai::GenaiArgs),
}

/// The runtimes of a comma-separated runtime list, each once, in their first order
/// (`tract,ort-cpu,tract` runs tract once).
pub fn distinct(kinds: &[RuntimeKind]) -> Vec<RuntimeKind> {
    let mut out: Vec<RuntimeKind> = Vec::new();
    for &kind in kinds {
        if !out.contains(&kind) {
            out.push(kind);
        }
    }
    out
}

/// Raised when runtimes disagree (exit code 1).
#[derive(Debug, thiserror::Error)]
#[error("runtimes disagree beyond the tolerance")]
pub struct Disagreement;

const BUG_REPORT: &str = "this is a bug, please report it with the command line that caused it";

/// Gives SIGPIPE back its default action (Rust ignores it, so that a write to a closed
/// pipe returns an error, and `println!` turns that error into a panic): when the reader
/// of our standard output goes away (`gmlp-onnx presets | head -1`), the process ends
/// quietly on the signal, exit status 141 in the shell, like `cat` or `ls`. Every output
/// file is complete (renamed into place) before anything is printed about it.
#[allow(unsafe_code)]
pub fn restore_default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called first thing in main, before any other thread exists; SIG_DFL is a
    // valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// A panic prints one line asking for a report (exit 101), unless a runtime's panic is
/// being contained; Ctrl-C, SIGTERM and SIGHUP remove the files still being written and
/// exit 130.
pub fn install_handlers() {
    std::panic::set_hook(Box::new(|info| {
        if gmlp_onnx::error::panic_is_contained() {
            return;
        }
        eprintln!(
            "gmlp-onnx: internal error: {}; {BUG_REPORT}",
            info.to_string().replace('\n', " ")
        );
    }));
    let _ = ctrlc::set_handler(|| {
        let removed = gmlp_onnx::fs::abandon_pending_files();
        eprintln!("gmlp-onnx: interrupted; removed {removed} unfinished output file(s)");
        std::process::exit(130);
    });
}

/// Runs the command line `args` (the program's name first) as the `gmlp-onnx` binary does:
/// SIGPIPE back to its default, the interrupt and panic handlers, then the command; returns
/// the exit code. The binary's `main` and the Python package's `gmlp-onnx` entry point
/// (bindings/python) both call it; a library user's process never does.
pub fn run_command<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    restore_default_sigpipe();
    install_handlers();
    // Lets the tests check the panic backstop from outside (exit 101, one line).
    if std::env::var_os("GMLP_ONNX_DEBUG_PANIC").is_some() {
        panic!("GMLP_ONNX_DEBUG_PANIC is set");
    }
    let cli = match parse(args) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    finish(match cli.command {
        Command::Build(args) => build::run(*args),
        Command::Presets { json } => presets::run(json),
        Command::Validate(args) => validate::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Inspect { model, json, plot } => inspect::run(&model, json, plot.as_deref()),
        Command::Triton(args) => triton::run(args),
        Command::Genai(args) => genai::run(args),
        Command::Doctor { ort } => doctor::run(&ort),
    })
}

/// The parsed command line, or the exit code after printing `--help`/`--version` (0) or a
/// usage error on one line (2).
pub fn parse<I, T>(args: I) -> Result<Cli, u8>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(cli) => Ok(cli),
        Err(e) if !e.use_stderr() => {
            // --help and --version: print as clap does, exit 0.
            let _ = e.print();
            Err(0)
        }
        Err(e) => {
            // Usage errors on one line, like every other error, with exit code 2.
            eprintln!("gmlp-onnx: error: {} (see --help)", usage_line(&e));
            Err(2)
        }
    }
}

/// A clap usage error on one line, without its usage and help hints.
pub fn usage_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let message: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect();
    let message = message.join(" ");
    message
        .strip_prefix("error: ")
        .unwrap_or(&message)
        .to_string()
}

/// The exit code of a failed command: 1 runtimes disagree, 3 a runtime is unavailable,
/// 101 an internal error, 2 anything else.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<Disagreement>().is_some() {
        return 1;
    }
    match e.downcast_ref::<Error>() {
        Some(Error::RuntimeUnavailable { .. }) => 3,
        Some(Error::Internal(_)) => 101,
        _ => 2,
    }
}

/// The flags that make each [`Remedy`]: the one place where a library error's remedy
/// becomes command-line words.
pub fn remedy_flags(remedy: Remedy) -> &'static str {
    match remedy {
        Remedy::OrtLibrary => "or pass its path with --ort-lib PATH",
        Remedy::BuildCausalWithPast => "rebuild it with `build --causal --with-past`",
        Remedy::BuildStaticState => {
            "rebuild it with `build --causal --with-past` (the static state)"
        }
        Remedy::OrtRuntimeOrOrtTarget => {
            "run it with --runtimes ort-cpu or ort-cuda, or build it with --target ort for tract"
        }
        Remedy::BuildFromCheckpoint => {
            "build one first (gmlp-onnx build --weights CHECKPOINT -o model.onnx, with the flags the checkpoint needs), then inspect model.onnx"
        }
        Remedy::RebuildWithThisVersion => {
            "build it again from its checkpoint with this gmlp-onnx (build --weights CHECKPOINT, with the flags it was built with)"
        }
    }
}

/// The flag of each [`Setting`]: the one place where a setting named by a library message
/// becomes a flag.
pub fn setting_flag(setting: Setting) -> &'static str {
    match setting {
        Setting::Causal => "--causal",
        Setting::WithPast => "--with-past",
        Setting::StaticState => "--with-past static",
        Setting::GrowingState => "--with-past growing",
        Setting::Target => "--target",
        Setting::Dtype => "--dtype",
        Setting::Spatial => "--spatial",
        Setting::AllowUnused => "--allow-unused",
        Setting::WeightsFormat => "--weights-format",
        Setting::SeqLen => "--seq-len",
        Setting::InChans => "--in-chans",
        Setting::PatchSize => "--patch-size",
        Setting::Dim => "--dim",
        Setting::DecodePhases => "--decode-prefill/--decode-steps/--decode-chunk",
        Setting::Plot => "--plot",
        Setting::TritonVersion => "--triton-version",
        Setting::TritonName => "--triton-name",
        Setting::TritonMaxSequenceIdleUs => "--triton-max-sequence-idle-us",
        Setting::TritonInstances => "--triton-instances",
        Setting::TritonTensorrt => "--triton-tensorrt",
        Setting::TritonKind => "--triton-kind",
        Setting::TritonMaxBatchSize => "--triton-max-batch-size",
        Setting::RouterServers => "--servers",
        Setting::RouterConfig => "--router-config",
        Setting::RouterPort => "--router-port",
        Setting::RouterAddress => "--router-address",
        Setting::Server => "--server",
        Setting::MaxRestarts => "--max-restarts",
    }
}

/// The command line's name for a place the ONNX Runtime library is looked for.
pub fn library_source_name(source: LibrarySource) -> &'static str {
    match source {
        LibrarySource::Explicit => "--ort-lib",
        other => other.describe(),
    }
}

/// How a front end names settings and remedies in its messages: the command line as
/// flags ([`FLAGS`]), Python as keywords.
pub struct Wording {
    /// A setting's name.
    pub setting: fn(Setting) -> &'static str,
    /// A remedy's words.
    pub remedy: fn(Remedy) -> &'static str,
}

/// The command line's wording: [`setting_flag`], [`remedy_flags`].
pub const FLAGS: Wording = Wording {
    setting: setting_flag,
    remedy: remedy_flags,
};

/// One cause's message, its settings and remedy (if any) said in `wording`.
fn cause_text(cause: &(dyn std::error::Error + 'static), wording: &Wording) -> String {
    let Some(error) = cause.downcast_ref::<Error>() else {
        return cause.to_string();
    };
    if let Error::Setting(message) | Error::UnknownLayout(message) = error {
        return message.render(wording.setting);
    }
    match error.remedy() {
        Some((problem, remedy)) => format!("{problem}; {}", (wording.remedy)(remedy)),
        None => cause.to_string(),
    }
}

/// The error and its causes on one line, `: `-separated; a cause that its parent's
/// message already ends with (an I/O error shown as `PATH: OS error`) is not repeated.
fn error_line(e: &anyhow::Error) -> String {
    error_line_in(e, &FLAGS)
}

/// [`error_line`] with the settings and remedies said in `wording`.
pub fn error_line_in(e: &anyhow::Error, wording: &Wording) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause_text(cause, wording);
        if !parts.last().is_some_and(|p| p.ends_with(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ").replace('\n', " ")
}

/// Prints the outcome of a command (errors on one line) and returns its exit code.
pub fn finish(result: anyhow::Result<()>) -> u8 {
    let Err(e) = result else {
        return 0;
    };
    let code = exit_code(&e);
    if e.downcast_ref::<Disagreement>().is_some() {
        eprintln!("gmlp-onnx: error: {e}");
    } else if let Some(Error::Internal(detail)) = e.downcast_ref::<Error>() {
        eprintln!(
            "gmlp-onnx: internal error: {}; {BUG_REPORT}",
            detail.replace('\n', " ")
        );
    } else {
        eprintln!("gmlp-onnx: error: {}", error_line(&e));
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_os_error_is_printed_once_and_context_is_kept() {
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let e = anyhow::Error::from(Error::io("m.onnx", missing)).context("validate m.onnx");
        assert_eq!(error_line(&e), "validate m.onnx: m.onnx: No such file");
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_line(&plain), "outer: inner");
    }

    #[test]
    fn a_runtime_list_names_each_runtime_once_and_ort_is_ort_cpu() {
        let cli = Cli::try_parse_from([
            "gmlp-onnx",
            "validate",
            "m.onnx",
            "--runtimes",
            "tract,ort,ort-cuda,ort-cpu,tract",
        ])
        .unwrap();
        let Command::Validate(a) = cli.command else {
            panic!("validate expected");
        };
        assert_eq!(
            distinct(&a.runtimes.runtimes),
            [
                RuntimeKind::Tract,
                RuntimeKind::OrtCpu,
                RuntimeKind::OrtCuda
            ]
        );
        let cli = Cli::try_parse_from(["gmlp-onnx", "validate", "m.onnx"]).unwrap();
        let Command::Validate(a) = cli.command else {
            panic!("validate expected");
        };
        assert_eq!(
            a.runtimes.runtimes,
            [RuntimeKind::Tract, RuntimeKind::OrtCpu]
        );
    }

    #[test]
    fn exit_codes_follow_the_kind_of_failure() {
        let code = |e: anyhow::Error| exit_code(&e);
        assert_eq!(code(Disagreement.into()), 1);
        assert_eq!(code(Error::InvalidArgument("x".into()).into()), 2);
        assert_eq!(code(Error::BadTensor("x".into()).into()), 2);
        let unavailable = Error::RuntimeUnavailable {
            runtime: "ort-cuda".into(),
            reason: "no GPU".into(),
            remedy: None,
        };
        assert_eq!(code(unavailable.into()), 3);
        assert_eq!(code(Error::Internal("shape mismatch".into()).into()), 101);
        let wrapped = anyhow::Error::from(Error::Internal("x".into())).context("validate m.onnx");
        assert_eq!(code(wrapped), 101);
    }

    #[test]
    fn every_setting_a_message_names_is_a_flag_of_some_command() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let mut longs: Vec<String> = Vec::new();
        for command in cli.get_subcommands() {
            for arg in command.get_arguments() {
                longs.extend(arg.get_long().map(|l| format!("--{l}")));
            }
        }
        for setting in Setting::ALL {
            let said = setting_flag(setting);
            for flag in said.split('/') {
                let flag = flag.split(' ').next().unwrap_or_default();
                assert!(longs.iter().any(|l| l == flag), "{setting:?}: {flag}");
            }
            assert!(!setting.describe().contains("--"), "{setting:?}");
        }
        let m = gmlp_onnx::message::Phrase::setting(Setting::TritonVersion).then(" must be >= 1");
        assert_eq!(
            error_line(&Error::Setting(m.clone()).into()),
            "--triton-version must be >= 1"
        );
        assert_eq!(
            Error::Setting(m).to_string(),
            "TritonOptions::version must be >= 1"
        );
    }

    #[test]
    fn a_library_remedy_is_said_as_the_flags_that_make_it() {
        let unavailable = Error::RuntimeUnavailable {
            runtime: "ort-cpu".into(),
            reason: "libonnxruntime.so not found".into(),
            remedy: Some(Remedy::OrtLibrary),
        };
        assert_eq!(
            unavailable.to_string(),
            "runtime ort-cpu is unavailable: libonnxruntime.so not found; or name the library file (OrtOptions::library)"
        );
        let e = anyhow::Error::from(unavailable).context("validate m.onnx");
        assert_eq!(
            error_line(&e),
            "validate m.onnx: runtime ort-cpu is unavailable: libonnxruntime.so not found; or pass its path with --ort-lib PATH"
        );
        assert_eq!(exit_code(&e), 3);
        let rebuild = Error::NeedsRebuild {
            reason: "m.onnx carries no state".into(),
            remedy: Remedy::BuildStaticState,
        };
        assert!(!rebuild.to_string().contains("--"), "{rebuild}");
        assert_eq!(
            error_line(&rebuild.into()),
            "m.onnx carries no state; rebuild it with `build --causal --with-past` (the static state)"
        );
        for remedy in [
            Remedy::OrtLibrary,
            Remedy::BuildCausalWithPast,
            Remedy::BuildStaticState,
            Remedy::OrtRuntimeOrOrtTarget,
            Remedy::BuildFromCheckpoint,
            Remedy::RebuildWithThisVersion,
        ] {
            assert!(!remedy.describe().contains("--"), "{remedy:?}");
            assert!(remedy_flags(remedy).contains("--"), "{remedy:?}");
        }
    }
}
