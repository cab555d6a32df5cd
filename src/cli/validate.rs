//! `gmlp-onnx validate`: run a model on several runtimes with the same inputs and compare.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use gmlp_onnx::fs::write_atomically;

use crate::cli::flags::{OrtFlags, RuntimeList, ToleranceFlags};
use gmlp_onnx::validate::histograms::write_histograms;
use gmlp_onnx::validate::{ValidateOptions, ValidationReport, MAX_BENCH_RUNS};
use gmlp_onnx::Error;

use crate::cli::progress::validate_with_spinner;
use crate::cli::{distinct, Disagreement};

#[derive(Args)]
pub struct ValidateArgs {
    /// The ONNX model.
    pub model: PathBuf,
    /// The runtimes to compare.
    #[command(flatten)]
    pub runtimes: RuntimeList,
    /// Value of the symbolic `batch` dimension of generated inputs [default: 2].
    #[arg(long)]
    pub batch: Option<usize>,
    /// Value of another symbolic dimension of generated inputs, as NAME=N (repeatable).
    #[arg(long = "dim", value_parser = parse_dim)]
    pub dims: Vec<(String, usize)>,
    /// Seed of the generated inputs.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Read the inputs from this .npz (one array per model input, by name) instead of generating them.
    #[arg(long)]
    pub inputs: Option<PathBuf>,
    /// Also compare every runtime with the reference outputs in this .npz (by output name).
    #[arg(long)]
    pub expected: Option<PathBuf>,
    /// Write the first runtime's outputs to this .npz (usable as --expected later).
    #[arg(long)]
    pub save_outputs: Option<PathBuf>,
    /// After one warm-up run, time N runs per runtime and report median and min latency (ort-cuda: also with the outputs left on the device).
    #[arg(long, default_value_t = 0)]
    pub bench: usize,
    /// The comparison's bounds.
    #[command(flatten)]
    pub tolerance: ToleranceFlags,
    /// Write the comparison as JSON to this file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// ONNX Runtime's library, threads and device.
    #[command(flatten)]
    pub ort: OrtFlags,
    /// With-past models: tokens fed by the prefill of the decoding check [default: n/2].
    #[arg(long)]
    pub decode_prefill: Option<usize>,
    /// With-past models: single steps after the prefill [default: 8].
    #[arg(long)]
    pub decode_steps: Option<usize>,
    /// With-past models: length of the final multi-token chunk [default: 4].
    #[arg(long)]
    pub decode_chunk: Option<usize>,
    /// Write a histogram of the elementwise errors |a - b| / max|b| of every compared pair and output into this directory (created if missing).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
}

fn parse_dim(s: &str) -> Result<(String, usize), String> {
    let (k, v) = s.split_once('=').ok_or("expected NAME=N")?;
    let v: usize = v.parse().map_err(|_| format!("'{v}' is not a size"))?;
    if k.is_empty() || v == 0 {
        return Err("expected NAME=N with N >= 1".into());
    }
    Ok((k.to_string(), v))
}

/// Prints the report (and writes it as JSON to `json`, and its error histograms into
/// `plot`), then PASS, or FAIL as [`Disagreement`].
pub fn finish_validation(
    report: ValidationReport,
    json: Option<&Path>,
    plot: Option<&Path>,
) -> anyhow::Result<()> {
    // The files first: printing can end the process (SIGPIPE when the reader is gone).
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&report)?;
        write_atomically(path, |w| {
            use std::io::Write;
            w.write_all(text.as_bytes()).map_err(|e| Error::io(path, e))
        })?;
    }
    let pictures = match plot {
        Some(dir) => write_histograms(dir, &report.histograms)?,
        None => Vec::new(),
    };
    print!("{}", report.render());
    for p in &pictures {
        println!("picture {} ({} x {})", p.file.display(), p.width, p.height);
    }
    if report.pairs.is_empty() {
        println!("only one runtime ran and no --expected file: nothing was compared");
    }
    if report.pass {
        println!("PASS");
        Ok(())
    } else {
        println!("FAIL");
        Err(Disagreement.into())
    }
}

/// The library's options from the flags, refusing what the library's own checks would
/// refuse, by the flags' names.
pub fn options(a: &ValidateArgs) -> anyhow::Result<ValidateOptions> {
    if a.inputs.is_some() && (a.batch.is_some() || !a.dims.is_empty() || a.seed.is_some()) {
        anyhow::bail!(Error::Conflict(
            "--batch, --dim and --seed shape generated inputs; they cannot be combined with --inputs".into()
        ));
    }
    if a.batch == Some(0) {
        anyhow::bail!(Error::OutOfRange("--batch must be at least 1".into()));
    }
    if a.bench > MAX_BENCH_RUNS {
        anyhow::bail!(Error::OutOfRange(format!(
            "--bench {} is more than {MAX_BENCH_RUNS} runs",
            a.bench
        )));
    }
    Ok(ValidateOptions {
        runtimes: distinct(&a.runtimes.runtimes),
        batch: a.batch.unwrap_or(2),
        dims: a.dims.clone(),
        seed: a.seed.unwrap_or(0),
        inputs: a.inputs.clone(),
        expected: a.expected.clone(),
        save_outputs: a.save_outputs.clone(),
        bench: a.bench,
        tolerance: a.tolerance.request()?,
        runtime: a.ort.runtime_options(),
        decode_prefill: a.decode_prefill,
        decode_steps: a.decode_steps,
        decode_chunk: a.decode_chunk,
        histograms: a.plot.is_some(),
        reference: None,
    })
}

/// Runs `validate`.
pub fn run(a: ValidateArgs) -> anyhow::Result<()> {
    let options = options(&a)?;
    let report = validate_with_spinner(
        gmlp_onnx::runtime::ModelFile::from(&a.model),
        &options,
        false,
    )
    .with_context(|| format!("validate {}", a.model.display()))?;
    finish_validation(report, a.report.as_deref(), a.plot.as_deref())
}

#[cfg(test)]
mod tests {
    use super::parse_dim;

    #[test]
    fn dimensions_parse_as_name_equals_size() {
        assert_eq!(parse_dim("sequence=7"), Ok(("sequence".to_string(), 7)));
        assert_eq!(parse_dim("n=1"), Ok(("n".to_string(), 1)));
        assert_eq!(parse_dim("sequence"), Err("expected NAME=N".to_string()));
        assert!(parse_dim("=3").is_err());
        assert!(parse_dim("n=0").is_err());
        assert_eq!(parse_dim("n=-2"), Err("'-2' is not a size".to_string()));
        assert!(parse_dim("n=99999999999999999999999").is_err());
    }
}
