//! `gmlp-onnx generate`: text generation with a causal token model on any runtime, by the
//! library's one generation loop ([`Generator`]). A `--with-past` model runs the prompt
//! once and then one token per step, its state fed back (a static state stays where the
//! runtime keeps it: on ort-cuda, on the device, each step a replayed CUDA graph); a
//! variable-length model without state re-runs the whole prefix for every token (slower,
//! the comparison the state is for). `--prompts-file` decodes several prompts as one batch
//! (see [`batch`]).

use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use gmlp_onnx::runtime::decoder::{Decoder, DecodingModel};
use gmlp_onnx::runtime::generator::{Generation, Generator, Sampling, StopReason};
use gmlp_onnx::runtime::{RuntimeKind, RuntimeOptions};
use gmlp_onnx::Error;

use crate::cli::{distinct, Disagreement};

mod batch;

#[derive(Args)]
pub struct GenerateArgs {
    /// A causal token model built with --with-past (or with a variable length).
    pub model: PathBuf,
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
    /// Path of libonnxruntime.so (else ORT_DYLIB_PATH, else the Python onnxruntime package).
    #[arg(long)]
    pub ort_lib: Option<PathBuf>,
    /// ONNX Runtime's intra-op threads (0: its default, one per physical core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// No progress line.
    #[arg(long, short)]
    pub quiet: bool,
}

/// What one runtime generated, with its timings.
#[derive(Serialize)]
struct GenerationReport {
    runtime: String,
    mode: &'static str,
    state_in_place: bool,
    prompt_tokens: usize,
    tokens: Vec<i64>,
    /// Why the sequence stopped: `end_token` (its last token) or `max_new_tokens`.
    stopped: StopReason,
    /// Time to the first new token: the prompt's run and the first pick.
    prefill_ms: f64,
    prefill_tokens_per_s: f64,
    steps: usize,
    steps_ms: f64,
    /// A step feeds the previous token and picks the next.
    step_median_ms: Option<f64>,
    step_tokens_per_s: Option<f64>,
    /// What the runtime did differently from running the file as it is (tract's
    /// dequantized 8-bit `MatMulNBits`, ort-cuda's CUDA graphs), also printed on stderr.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// One runtime's generation for a batch of prompts, with what it ran on.
pub(crate) struct RuntimeGeneration {
    pub(crate) runtime: String,
    pub(crate) mode: &'static str,
    pub(crate) state_in_place: bool,
    pub(crate) note: Option<String>,
    pub(crate) generation: Generation,
}

/// How `generate` opens a runtime: ONNX Runtime with the given library and threads; tract
/// runs the 8-bit `MatMulNBits` nodes it cannot read (the output projections and vocabulary
/// head of int4 files, every projection of int8-weight-only ones) as `MatMul`s on the file's
/// dequantized weights, which [`announce_note`] says.
pub(crate) fn runtime_options(a: &GenerateArgs) -> RuntimeOptions {
    RuntimeOptions {
        ort_library: a.ort_lib.clone(),
        threads: a.threads,
        tract_dequantize_nbits: true,
        ..Default::default()
    }
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
                anyhow::bail!(Error::InvalidArgument(format!(
                    "--prompt-text needs a byte-level vocabulary of 256 tokens; this model has {vocab} (use --prompt-ids)"
                )));
            }
            text.bytes().map(i64::from).collect()
        }
        (None, None) => anyhow::bail!(Error::InvalidArgument(
            "give --prompt-ids or --prompt-text".into()
        )),
    };
    if ids.is_empty() {
        anyhow::bail!(Error::InvalidArgument("the prompt is empty".into()));
    }
    if let Some(bad) = ids.iter().find(|&&id| id < 0 || id as usize >= vocab) {
        anyhow::bail!(Error::InvalidArgument(format!(
            "prompt token id {bad} is outside the vocabulary 0..{vocab}"
        )));
    }
    Ok(ids)
}

/// Generates `new_tokens` for each of `prompts` (one sequence each) on `kind`, with a
/// progress bar on stderr unless quiet.
pub(crate) fn generate_on(
    kind: RuntimeKind,
    a: &GenerateArgs,
    prompts: &[Vec<i64>],
    new_tokens: usize,
) -> anyhow::Result<RuntimeGeneration> {
    let decoder = Decoder::open_with(
        kind,
        &a.model,
        &runtime_options(a),
        prompts.len(),
        !a.copy_state,
    )?;
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
    let generation =
        generator.generate(prompts, new_tokens, &mut |k| bar.set_position(k as u64))?;
    bar.finish_and_clear();
    Ok(RuntimeGeneration {
        runtime: kind.name().to_string(),
        mode,
        state_in_place,
        note,
        generation,
    })
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

fn show_tokens(tokens: &[i64], vocab: usize) -> String {
    let ids: Vec<String> = tokens.iter().map(i64::to_string).collect();
    let mut s = format!("tokens: {}", ids.join(","));
    if vocab == 256 {
        let bytes: Vec<u8> = tokens.iter().map(|&t| t as u8).collect();
        s += &format!("\ntext:   {:?}", String::from_utf8_lossy(&bytes));
    }
    s
}

/// Runs `generate`.
pub fn run(a: GenerateArgs) -> anyhow::Result<()> {
    let model = DecodingModel::read(&a.model)?;
    if let Some(file) = &a.prompts_file {
        return batch::run(&a, file, &model);
    }
    let n = model.info.max_sequence;
    let prompt = parse_prompt(&a, model.vocab_size)?;
    if prompt.len() > n {
        anyhow::bail!(Error::InvalidArgument(format!(
            "the prompt has {} tokens, more than the model's {n} positions",
            prompt.len()
        )));
    }
    let room = n - prompt.len();
    let new_tokens = match a.max_new_tokens {
        Some(k) if k > room => anyhow::bail!(Error::InvalidArgument(format!(
            "--max-new-tokens {k} would generate past the model's {n} positions ({} prompt tokens leave room for {room})",
            prompt.len()
        ))),
        Some(k) => k,
        None => room,
    };
    let kinds = runtimes(&a);
    sampling(&a).sampler()?;
    let mut results = Vec::new();
    for kind in kinds {
        let r = generate_on(kind, &a, std::slice::from_ref(&prompt), new_tokens)?;
        let g = r.generation;
        results.push(GenerationReport {
            runtime: r.runtime,
            mode: r.mode,
            state_in_place: r.state_in_place,
            prompt_tokens: prompt.len(),
            tokens: g.tokens.first().cloned().unwrap_or_default(),
            stopped: g
                .stopped
                .first()
                .copied()
                .unwrap_or(StopReason::MaxNewTokens),
            prefill_ms: g.prefill_ms,
            prefill_tokens_per_s: prompt.len() as f64 / (g.prefill_ms / 1e3),
            steps: g.step_ms.len(),
            steps_ms: g.steps_ms(),
            step_median_ms: g.step_median_ms(),
            step_tokens_per_s: g.step_tokens_per_s(),
            note: r.note,
        });
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        for g in &results {
            println!("{} ({} model):", g.runtime, g.mode);
            println!("{}", show_tokens(&g.tokens, model.vocab_size));
            if g.stopped == StopReason::EndToken {
                println!("stopped at the end token");
            }
            println!(
                "prefill: {} tokens in {:.1} ms ({:.0} tokens/s)",
                g.prompt_tokens, g.prefill_ms, g.prefill_tokens_per_s
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
        }
        if new_tokens < a.max_new_tokens.unwrap_or(usize::MAX) && a.max_new_tokens.is_none() {
            println!("stopped at the model's {n} positions");
        }
    }
    same_tokens(
        results.iter().map(|g| (g.runtime.as_str(), &g.tokens)),
        a.json,
    )
}

/// `--compare`: fails (exit 1) when two runtimes generated different tokens, else says
/// they agree (unless the output is JSON).
fn same_tokens<'a, T: PartialEq + 'a>(
    results: impl Iterator<Item = (&'a str, &'a T)> + Clone,
    json: bool,
) -> anyhow::Result<()> {
    let mut all = results.clone();
    let Some((first_runtime, first_tokens)) = all.next() else {
        return Ok(());
    };
    if let Some((other, _)) = all.find(|(_, tokens)| *tokens != first_tokens) {
        eprintln!("gmlp-onnx: {first_runtime} and {other} generated different tokens");
        return Err(Disagreement.into());
    }
    let runtimes: Vec<&str> = results.map(|(runtime, _)| runtime).collect();
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

    #[test]
    fn prompts_parse_as_ids_or_bytes_within_the_vocabulary() {
        assert_eq!(
            parse_prompt(&args(&["--prompt-ids", "1, 2,3"]), 10).unwrap(),
            [1, 2, 3]
        );
        assert_eq!(
            parse_prompt(&args(&["--prompt-text", "Hi"]), 256).unwrap(),
            [72, 105]
        );
        let err =
            |extra: &[&str], vocab| parse_prompt(&args(extra), vocab).unwrap_err().to_string();
        assert!(err(&["--prompt-ids", "1,x"], 10).contains("'x' is not a token id"));
        assert!(err(&["--prompt-ids", "1,10"], 10).contains("outside the vocabulary 0..10"));
        assert!(err(&["--prompt-ids=-1"], 10).contains("outside the vocabulary"));
        assert!(err(&["--prompt-text", "Hi"], 50).contains("256 tokens"));
        assert!(err(&["--prompt-text", ""], 256).contains("empty"));
    }
}
