//! Progress on a terminal: a byte bar while weights are written, a spinner naming the
//! validation step; both hidden off a terminal or with `--quiet`.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use gmlp_onnx::runtime::ModelFile;
use gmlp_onnx::validate::{validate_file, ValidateOptions, ValidationReport};

/// Runs [`validate_with_progress`] behind a spinner on stderr (hidden when stderr is not
/// a terminal or with `quiet`).
pub fn validate_with_spinner(
    model: ModelFile,
    options: &ValidateOptions,
    quiet: bool,
) -> gmlp_onnx::Result<ValidationReport> {
    let target = if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let spinner = ProgressBar::with_draw_target(None, target);
    spinner.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("valid template"),
    );
    spinner.enable_steady_tick(std::time::Duration::from_millis(200));
    let report = validate_file(model, options, &mut |step| {
        spinner.set_message(step.to_string())
    });
    spinner.finish_and_clear();
    report
}

/// A bar of `len` bytes labelled `what` on stderr (hidden when `quiet`), in decimal
/// units (MB, GB) like the summary line.
pub fn progress_bar(len: u64, quiet: bool, what: &str) -> ProgressBar {
    let target = if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(len), target);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {elapsed}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}
