//! `gmlp-onnx generate`: text generation with a causal token model on any runtime, by the
//! library's one generation loop ([`Generator`]). A `--with-past` model runs the prompt
//! once and then one token per step, its state fed back (a static state stays where the
//! runtime keeps it: on ort-cuda, on the device, each step a replayed CUDA graph); a
//! variable-length model without state re-runs the whole prefix for every token (slower,
//! the comparison the state is for). `--prompts-file` decodes several prompts as one batch
//! (see [`batch`]). `--server` runs the same generation on a Triton server or the router
//! in front of several (see [`server`]).

use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use gmlp_onnx::generation::SamplingError;
use gmlp_onnx::generation::{check_vocabulary, Decoder, DecodingFile, DecodingModel, StateWrites};
use gmlp_onnx::generation::{fused_twin, Generator, Sampling, StepForm, StopReason};
use gmlp_onnx::runtime::{RuntimeKind, RuntimeOptions};
use gmlp_onnx::Error;

use crate::cli::flags::OrtFlags;
use crate::cli::{distinct, Disagreement};

mod batch;
mod server;

#[derive(Args)]
pub struct GenerateArgs {
    /// A causal token model built with --with-past (or with a variable length).
    #[arg(required_unless_present = "server")]
    pub model: Option<PathBuf>,
    /// Prompt as comma-separated token ids.
    #[arg(
        long,
        conflicts_with_all = ["prompt_text", "prompts_file"],
        required_unless_present_any = ["prompt_text", "prompts_file"]
    )]
    pub prompt_ids: Option<String>,
    /// Prompt as text, for byte-level vocabularies (256 tokens: one token per UTF-8 byte).
    #[arg(long, conflicts_with = "prompts_file")]
    pub prompt_text: Option<String>,
    /// Several prompts decoded together as one batch, one per line as comma-separated
    /// token ids (blank lines skipped); of different lengths with a static-state model
    /// (each sequence at its own position), of one length otherwise.
    #[arg(long)]
    pub prompts_file: Option<PathBuf>,
    /// Let ONNX Runtime copy a static-state model's state every step instead of writing
    /// it in place (for measuring what writing in place saves).
    #[arg(long)]
    pub copy_state: bool,
    /// A static-state file of the portable step: also run the fused step of its configuration (what `build --target onnxruntime` writes; a twin with seeded weights, built in memory, since a step's time does not depend on the weights' values) on each ONNX Runtime runtime, after the file, and report both median steps (3 runs of up to 32 steps each, alternating).
    #[arg(long, conflicts_with = "copy_state")]
    pub fused_gain: bool,
    /// Tokens to generate [default: until the model's n positions are full].
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Sampling temperature; 0 = greedy [default: 0, or 1 with --top-k].
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Sample among the k most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sample among the fewest most likely tokens whose probabilities add up to p (after --top-k; 0 < p <= 1).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Stop a sequence at this token (included in its tokens) [default: the model's own end token (build --eos-token-id), else none].
    #[arg(long, value_name = "ID")]
    pub eos_token_id: Option<i64>,
    /// Seed of the sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Runtime.
    #[arg(long, value_enum, default_value = "ort-cpu")]
    pub runtime: RuntimeKind,
    /// Run each of these runtimes (comma-separated) and fail if their tokens differ.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub compare: Option<Vec<RuntimeKind>>,
    /// ONNX Runtime's library, threads and device.
    #[command(flatten)]
    pub ort: OrtFlags,
    /// Generate on a Triton server, or on the router in front of several (http://HOST:PORT), instead of in-process: KServe v2 HTTP, tokens only, the state kept by the server; a sequence whose request fails starts again under a new sequence id with its tokens so far as the prompt.
    #[arg(long, value_name = "URL", conflicts_with_all = ["model", "runtime", "compare", "copy_state", "fused_gain"])]
    pub server: Option<String>,
    /// --server: the model's name on the server [default: the server's only model].
    #[arg(long, requires = "server")]
    pub triton_name: Option<String>,
    /// --server: how many times one sequence may start again before the generation fails [default: 8].
    #[arg(long, requires = "server")]
    pub max_restarts: Option<u32>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// No progress line.
    #[arg(long, short)]
    pub quiet: bool,
}

/// What one runtime generated, with its timings (`generate --json` prints a list of
/// them): the one report of a single prompt and of a batch, which differ only in
/// [`Sequences`].
#[derive(Serialize)]
pub(crate) struct GenerationReport {
    pub(crate) runtime: String,
    pub(crate) mode: &'static str,
    pub(crate) state_in_place: bool,
    /// The sequences' prompts, tokens and stop reasons.
    #[serde(flatten)]
    pub(crate) sequences: Sequences,
    /// Time to the first new token: the prompt's run and the first pick.
    pub(crate) prefill_ms: f64,
    pub(crate) steps: usize,
    pub(crate) steps_ms: f64,
    /// A step feeds the previous token and picks the next.
    pub(crate) step_median_ms: Option<f64>,
    /// New tokens of all sequences per second of steps.
    pub(crate) step_tokens_per_s: Option<f64>,
    /// What the runtime did differently from running the file as it is (tract's
    /// dequantized 8-bit `MatMulNBits`, ort-cuda's CUDA graphs), also printed on stderr.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) note: Option<String>,
    /// The static step the file runs (static-state files only): `fused`,
    /// `portable-fusable` (`--target onnxruntime` would write it fused) or `portable`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) step_form: Option<StepForm>,
    /// `--fused-gain`: the fused twin's median step on this runtime, measured after the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fused_step_median_ms: Option<f64>,
    /// `--fused-gain`: the file's median step over the fused twin's (above 1: the fused
    /// step is faster), each the median of three runs of up to 32 steps, the two
    /// alternating.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fused_gain: Option<f64>,
}

impl GenerationReport {
    /// The line saying which static step ran and what the fused one gains (or how to
    /// measure it), for ONNX Runtime's runs of a static-state file.
    pub(crate) fn form_line(&self) -> Option<String> {
        let form = self.step_form?;
        let on_ort = self.runtime != RuntimeKind::Tract.name();
        Some(match (form, self.fused_step_median_ms, self.fused_gain) {
            (StepForm::PortableFusable, Some(fused), Some(gain)) => format!(
                "form:    {}; the fused one (build --target onnxruntime): median step {fused:.2} ms here, {gain:.2}x as fast (3 runs each side by side, a twin with seeded weights)",
                form.describe()
            ),
            (StepForm::PortableFusable, _, _) if on_ort => format!(
                "form:    {}; --fused-gain measures the fused one (build --target onnxruntime), which tract cannot read",
                form.describe()
            ),
            _ => format!("form:    {}", form.describe()),
        })
    }
}

/// A [`GenerationReport`]'s sequences: one prompt's fields as they are, a batch's as
/// lists with one entry per sequence.
#[derive(Serialize)]
#[serde(untagged)]
pub(crate) enum Sequences {
    /// `--prompt-ids` / `--prompt-text`.
    One {
        prompt_tokens: usize,
        tokens: Vec<i64>,
        /// Why the sequence stopped: `end_token` (its last token) or `max_new_tokens`.
        stopped: StopReason,
        prefill_tokens_per_s: f64,
    },
    /// `--prompts-file`.
    Batch {
        batch: usize,
        prompt_tokens: Vec<usize>,
        tokens: Vec<Vec<i64>>,
        stopped: Vec<StopReason>,
    },
}

impl Sequences {
    /// Each sequence's tokens.
    pub(crate) fn tokens(&self) -> &[Vec<i64>] {
        match self {
            Sequences::One { tokens, .. } => std::slice::from_ref(tokens),
            Sequences::Batch { tokens, .. } => tokens,
        }
    }
}

/// How `generate` opens a runtime: ONNX Runtime with the given library and threads; tract
/// runs the 8-bit `MatMulNBits` nodes it cannot read (the output projections and vocabulary
/// head of int4 files, every projection of int8-weight-only ones) as `MatMul`s on the file's
/// dequantized weights, which [`announce_note`] says.
pub(crate) fn runtime_options(a: &GenerateArgs) -> RuntimeOptions {
    let mut options = a.ort.runtime_options();
    options.tract.dequantize_nbits = true;
    options
}

/// The decoder's runtime note on stderr (one line, also with `--quiet`: it says what ran),
/// returned for the JSON result.
pub(crate) fn announce_note(decoder: &Decoder) -> Option<String> {
    let note = decoder.runtime_note()?;
    eprintln!("note: {}: {note}", decoder.runtime_name());
    Some(note)
}

/// The runtimes to generate on: those of `--compare` (each once), else `--runtime`.
fn runtimes(a: &GenerateArgs) -> Vec<RuntimeKind> {
    match &a.compare {
        Some(list) => distinct(list),
        None => vec![a.runtime],
    }
}

/// Comma-separated token ids (`what` names their origin in messages).
fn parse_ids(list: &str, what: &str) -> Result<Vec<i64>, Error> {
    list.split(',')
        .map(|s| {
            s.trim().parse::<i64>().map_err(|_| {
                Error::InvalidArgument(format!("{what}: '{}' is not a token id", s.trim()))
            })
        })
        .collect()
}

fn parse_prompt(a: &GenerateArgs, vocab: usize) -> anyhow::Result<Vec<i64>> {
    let ids: Vec<i64> = match (&a.prompt_ids, &a.prompt_text) {
        (Some(list), _) => parse_ids(list, "--prompt-ids")?,
        (None, Some(text)) => {
            if vocab != 256 {
                anyhow::bail!(Error::Conflict(format!(
                    "--prompt-text needs a byte-level vocabulary of 256 tokens; this model has {vocab} (use --prompt-ids)"
                )));
            }
            text.bytes().map(i64::from).collect()
        }
        (None, None) => anyhow::bail!(Error::Conflict("give --prompt-ids or --prompt-text".into())),
    };
    if ids.is_empty() {
        anyhow::bail!(Error::BatchShape("the prompt is empty".into()));
    }
    check_vocabulary(&ids, vocab, "prompt token id")?;
    Ok(ids)
}

/// Generates `new_tokens` for each of `prompts` (one sequence each) on `kind`, with a
/// progress bar on stderr unless quiet.
pub(crate) fn generate_on(
    kind: RuntimeKind,
    a: &GenerateArgs,
    file: &DecodingFile,
    prompts: &[Vec<i64>],
    new_tokens: usize,
) -> anyhow::Result<GenerationReport> {
    let writes = if a.copy_state {
        StateWrites::Copied
    } else {
        StateWrites::InPlace
    };
    let mut loaded = file.load(kind, &runtime_options(a), writes)?;
    let decoder = Decoder::new(&mut loaded, prompts.len())?;
    let note = announce_note(&decoder);
    let (mode, state_in_place) = (decoder.model().info.mode.as_str(), decoder.in_place());
    let mut generator = Generator::new(decoder, sampling(a))?;
    if a.eos_token_id.is_some() {
        generator = generator.with_end_token(a.eos_token_id)?;
    }
    let target = if a.quiet || a.json {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(new_tokens as u64), target);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tokens {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(format!("generating on {}", kind.name()));
    let g = generator.generate(prompts, new_tokens, &mut |k| bar.set_position(k as u64))?;
    bar.finish_and_clear();
    let sequences = match (prompts, a.prompts_file.is_some()) {
        ([prompt], false) => Sequences::One {
            prompt_tokens: prompt.len(),
            tokens: g.tokens.first().cloned().unwrap_or_default(),
            stopped: g
                .stopped
                .first()
                .copied()
                .unwrap_or(StopReason::MaxNewTokens),
            prefill_tokens_per_s: prompt.len() as f64 / (g.prefill_ms / 1e3),
        },
        _ => Sequences::Batch {
            batch: prompts.len(),
            prompt_tokens: g.prompt_tokens.clone(),
            tokens: g.tokens.clone(),
            stopped: g.stopped.clone(),
        },
    };
    Ok(GenerationReport {
        runtime: kind.name(),
        mode,
        state_in_place,
        sequences,
        prefill_ms: g.prefill_ms,
        steps: g.step_ms.len(),
        steps_ms: g.steps_ms(),
        step_median_ms: g.step_median_ms(),
        step_tokens_per_s: g.step_tokens_per_s(),
        note,
        step_form: StepForm::of(file.decoded()),
        fused_step_median_ms: None,
        fused_gain: None,
    })
}

/// Generates on each runtime of the flags ([`generate_on`]); with `--fused-gain`, then the
/// fused twin of the file on each ONNX Runtime runtime, its median step set beside the
/// file's.
pub(crate) fn generate_all(
    a: &GenerateArgs,
    file: &DecodingFile,
    prompts: &[Vec<i64>],
    new_tokens: usize,
) -> anyhow::Result<Vec<GenerationReport>> {
    let kinds = runtimes(a);
    if a.fused_gain && !kinds.iter().any(|k| k.binds_buffers()) {
        anyhow::bail!(Error::Conflict(
            "--fused-gain measures the fused step in ONNX Runtime: give --runtime ort-cpu or ort-cuda (tract cannot read it)".into()
        ));
    }
    let twin = if a.fused_gain {
        Some(fused_twin(
            file.decoded(),
            &file.file().path.with_extension("fused-twin.onnx"),
        )?)
    } else {
        None
    };
    let mut results = Vec::new();
    for kind in kinds {
        let mut report = generate_on(kind, a, file, prompts, new_tokens)?;
        if let (Some(twin), true) = (&twin, kind.binds_buffers()) {
            let (own, fused) = fused_gain_rounds(kind, a, file, twin, prompts, new_tokens)?;
            report.fused_step_median_ms = Some(fused);
            report.fused_gain = Some(own / fused);
        }
        results.push(report);
    }
    Ok(results)
}

/// Rounds of `--fused-gain`'s measurement, the file and its twin alternating.
const FUSED_GAIN_ROUNDS: usize = 3;
/// Steps per run of `--fused-gain`'s measurement, at most.
const FUSED_GAIN_STEPS: usize = 32;

/// The median steps of the file and of its fused twin on `kind`: [`FUSED_GAIN_ROUNDS`]
/// rounds of one run each, side by side (file, twin, file, twin, ...), the median of each
/// side's run medians.
fn fused_gain_rounds(
    kind: RuntimeKind,
    a: &GenerateArgs,
    file: &DecodingFile,
    twin: &DecodingFile,
    prompts: &[Vec<i64>],
    new_tokens: usize,
) -> anyhow::Result<(f64, f64)> {
    let steps = new_tokens.min(FUSED_GAIN_STEPS);
    if steps < 2 {
        anyhow::bail!(Error::OutOfRange(
            "--fused-gain times steps: it needs at least 2 new tokens".into()
        ));
    }
    let (mut own, mut fused) = (Vec::new(), Vec::new());
    for _ in 0..FUSED_GAIN_ROUNDS {
        for (side, f) in [(&mut own, file), (&mut fused, twin)] {
            let median = generate_on(kind, a, f, prompts, steps)?.step_median_ms;
            side.push(median.ok_or_else(|| {
                Error::Internal("a measured run of --fused-gain without steps".into())
            })?);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok((median(&mut own), median(&mut fused)))
}

/// The sampling the flags ask for.
pub(crate) fn sampling(a: &GenerateArgs) -> Sampling {
    Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    }
}

/// Checks the sampling flags, naming the flag that is wrong.
pub(crate) fn check_sampling(a: &GenerateArgs) -> Result<(), Error> {
    sampling(a).sampler().map(drop).map_err(|e| {
        Error::OutOfRange(
            match e {
                SamplingError::Temperature => "--temperature must be a finite number >= 0",
                SamplingError::TopK => "--top-k must be at least 1",
                SamplingError::TopP => "--top-p must be a probability in (0, 1]",
            }
            .into(),
        )
    })
}

fn show_tokens(tokens: &[i64], vocab: usize) -> String {
    let ids: Vec<String> = tokens.iter().map(i64::to_string).collect();
    let mut s = format!("tokens: {}", ids.join(","));
    if vocab == 256 {
        let bytes: Vec<u8> = tokens.iter().map(|&t| t as u8).collect();
        s += &format!("\ntext:   {:?}", String::from_utf8_lossy(&bytes));
    }
    s
}

/// Runs `generate`. The file is read once, here ([`DecodingFile`]), for every runtime.
pub fn run(a: GenerateArgs) -> anyhow::Result<()> {
    let path = match (&a.server, &a.model) {
        (Some(url), _) => return server::run(&a, url),
        (None, Some(path)) => path,
        (None, None) => anyhow::bail!(Error::Conflict("give a model file or --server".into())),
    };
    let file = DecodingFile::read(path)?;
    let model = file.description();
    if let Some(prompts) = &a.prompts_file {
        return batch::run(&a, &file, prompts);
    }
    let n = model.info.max_sequence;
    let prompt = parse_prompt(&a, model.vocab_size)?;
    if prompt.len() > n {
        anyhow::bail!(Error::PastPositions(format!(
            "the prompt has {} tokens, more than the model's {n} positions",
            prompt.len()
        )));
    }
    let room = n - prompt.len();
    let new_tokens = match a.max_new_tokens {
        Some(k) if k > room => anyhow::bail!(Error::PastPositions(format!(
            "--max-new-tokens {k} would generate past the model's {n} positions ({} prompt tokens leave room for {room})",
            prompt.len()
        ))),
        Some(k) => k,
        None => room,
    };
    check_sampling(&a)?;
    let results = generate_all(&a, &file, std::slice::from_ref(&prompt), new_tokens)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print_reports(&results, model)?;
        if new_tokens < a.max_new_tokens.unwrap_or(usize::MAX) && a.max_new_tokens.is_none() {
            println!("stopped at the model's {n} positions");
        }
    }
    same_tokens(&results, a.json)
}

/// The text report of one prompt's generation on each runtime.
fn print_reports(results: &[GenerationReport], model: &DecodingModel) -> anyhow::Result<()> {
    for g in results {
        let Sequences::One {
            prompt_tokens,
            tokens,
            stopped,
            prefill_tokens_per_s,
        } = &g.sequences
        else {
            anyhow::bail!(Error::Internal("a batch report of one prompt".into()));
        };
        println!("{} ({} model):", g.runtime, g.mode);
        println!("{}", show_tokens(tokens, model.vocab_size));
        if *stopped == StopReason::EndToken {
            println!("stopped at the end token");
        }
        println!(
            "prefill: {prompt_tokens} tokens in {:.1} ms ({prefill_tokens_per_s:.0} tokens/s)",
            g.prefill_ms
        );
        match (g.step_median_ms, g.step_tokens_per_s) {
            (Some(median), Some(rate)) => println!(
                "steps:   {} tokens in {:.1} ms ({rate:.1} tokens/s, median step {median:.2} ms{})",
                g.steps,
                g.steps_ms,
                if model.info.mode.has_state() {
                    ""
                } else {
                    "; no state: each step re-runs the whole prefix"
                }
            ),
            _ => println!("steps:   none"),
        }
        if let Some(line) = g.form_line() {
            println!("{line}");
        }
    }
    Ok(())
}

/// `--compare`: fails (exit 1) when two runtimes generated different tokens, else says
/// they agree (unless the output is JSON).
fn same_tokens(results: &[GenerationReport], json: bool) -> anyhow::Result<()> {
    let Some((first, rest)) = results.split_first() else {
        return Ok(());
    };
    if let Some(other) = rest
        .iter()
        .find(|g| g.sequences.tokens() != first.sequences.tokens())
    {
        eprintln!(
            "gmlp-onnx: {} and {} generated different tokens",
            first.runtime, other.runtime
        );
        return Err(Disagreement.into());
    }
    let runtimes: Vec<&str> = results.iter().map(|g| g.runtime.as_str()).collect();
    if runtimes.len() > 1 && !json {
        println!("same tokens in {}", runtimes.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: GenerateArgs,
    }

    fn args(extra: &[&str]) -> GenerateArgs {
        let mut all = vec!["x", "m.onnx"];
        all.extend_from_slice(extra);
        Wrapper::parse_from(all).args
    }

    /// A small causal static-state token model (n = 12) in `dir`, built by `build` as a
    /// user builds one.
    fn tiny_static(dir: &std::path::Path) -> PathBuf {
        #[derive(Parser)]
        struct Build {
            #[command(flatten)]
            args: crate::cli::build::BuildArgs,
        }
        let path = dir.join("static.onnx");
        let out = path.to_string_lossy().into_owned();
        let build = Build::parse_from([
            "x",
            "--preset",
            "amlp-base",
            "--layers",
            "1",
            "--seq-len",
            "12",
            "--causal",
            "--with-past",
            "-q",
            "-o",
            &out,
        ]);
        crate::cli::build::run(build.args).unwrap();
        path
    }

    /// `generate` decodes the file once, whatever runtimes it compares (tract dequantizes
    /// from it, ONNX Runtime's static-state session adds its step outputs to it).
    #[test]
    fn generate_decodes_the_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = tiny_static(dir.path());
        let runtimes = if cfg!(feature = "test-onnxruntime") {
            "tract,ort-cpu"
        } else {
            "tract"
        };
        let mut a = args(&[
            "--prompt-ids",
            "1,2,3",
            "--max-new-tokens",
            "3",
            "--compare",
            runtimes,
            "--json",
            "-q",
        ]);
        a.model = Some(path);
        let before = gmlp_onnx::onnx::reader::files_decoded();
        run(a).unwrap();
        assert_eq!(gmlp_onnx::onnx::reader::files_decoded() - before, 1);
    }

    #[test]
    fn prompts_parse_as_ids_or_bytes_within_the_vocabulary_and_refusals_name_the_flag() {
        assert_eq!(
            parse_prompt(&args(&["--prompt-ids", "1, 2,3"]), 10).unwrap(),
            [1, 2, 3]
        );
        assert_eq!(
            parse_prompt(&args(&["--prompt-text", "Hi"]), 256).unwrap(),
            [72, 105]
        );
        let err = |extra: &[&str], vocab| parse_prompt(&args(extra), vocab).unwrap_err();
        let outside = |extra: &[&str], vocab| match err(extra, vocab).downcast::<Error>() {
            Ok(Error::OutsideVocabulary { id, vocab, .. }) => Some((id, vocab)),
            _ => None,
        };
        assert_eq!(outside(&["--prompt-ids", "1,10"], 10), Some((10, 10)));
        assert_eq!(outside(&["--prompt-ids=-1"], 10), Some((-1, 10)));
        // The refusals of the prompt's flags, in the words they are rendered in.
        let said = |extra: &[&str], vocab| err(extra, vocab).to_string();
        assert_eq!(
            said(&["--prompt-ids", "1,x"], 10),
            "invalid argument: --prompt-ids: 'x' is not a token id"
        );
        assert_eq!(
            said(&["--prompt-text", "Hi"], 50),
            "invalid argument: --prompt-text needs a byte-level vocabulary of 256 tokens; this model has 50 (use --prompt-ids)"
        );
        assert_eq!(
            said(&["--prompt-text", ""], 256),
            "invalid argument: the prompt is empty"
        );
        assert_eq!(
            said(&["--prompt-ids", "1,10"], 10),
            "invalid argument: prompt token id 10 is outside the vocabulary 0..10"
        );
    }
}
