//! `generate --prompts-file`: several prompts decoded together as one batch, by the same
//! generation loop as one prompt (`Generator`). The prompts go in as one run (padded to
//! the longest; see `Decoder::prefill`), then every step
//! feeds each sequence its own next token at its own position. A static-state model
//! (docs/static-state.md) takes prompts of different lengths; any other model needs them
//! of one length. Each sequence samples with its own sampler seeded with `--seed`, so it
//! gets the tokens it would get decoded alone.

use std::path::Path;

use serde::Serialize;

use gmlp_onnx::runtime::decoder::DecodingModel;
use gmlp_onnx::runtime::generator::StopReason;
use gmlp_onnx::runtime::RuntimeKind;
use gmlp_onnx::Error;

use super::{generate_on, parse_ids, runtimes, sampling, show_tokens, GenerateArgs};

/// Most prompts one file may hold (the state of every sequence is allocated at once).
pub const MAX_PROMPTS: usize = 64;
/// Largest prompts file read, in bytes.
pub const MAX_PROMPTS_FILE_BYTES: u64 = 16 << 20;

/// What one runtime generated for a batch of prompts.
#[derive(Serialize)]
struct BatchGeneration {
    runtime: String,
    mode: &'static str,
    state_in_place: bool,
    batch: usize,
    prompt_tokens: Vec<usize>,
    tokens: Vec<Vec<i64>>,
    /// Why each sequence stopped: `end_token` (its last token) or `max_new_tokens`.
    stopped: Vec<StopReason>,
    prefill_ms: f64,
    steps: usize,
    steps_ms: f64,
    step_median_ms: Option<f64>,
    /// New tokens of all sequences per second of steps.
    step_tokens_per_s: Option<f64>,
    /// As in a single generation's result.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// The prompts of `file`: one per non-blank line, comma-separated token ids within the
/// vocabulary; at most [`MAX_PROMPTS`], each of at most `n` tokens.
fn read_prompts(file: &Path, vocab: usize, n: usize) -> anyhow::Result<Vec<Vec<i64>>> {
    let what = format!("--prompts-file {}", file.display());
    let size = std::fs::metadata(file)
        .map_err(|e| Error::InvalidArgument(format!("{what}: {e}")))?
        .len();
    if size > MAX_PROMPTS_FILE_BYTES {
        anyhow::bail!(Error::InvalidArgument(format!(
            "{what}: {size} bytes is more than the {MAX_PROMPTS_FILE_BYTES} a prompts file may have"
        )));
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| Error::InvalidArgument(format!("{what}: {e}")))?;
    let mut prompts = Vec::new();
    for (k, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if prompts.len() == MAX_PROMPTS {
            anyhow::bail!(Error::InvalidArgument(format!(
                "{what}: more than {MAX_PROMPTS} prompts (decode them in several runs)"
            )));
        }
        let line_what = format!("{what} line {}", k + 1);
        let ids = parse_ids(line, &line_what)?;
        if let Some(bad) = ids.iter().find(|&&id| id < 0 || id as usize >= vocab) {
            anyhow::bail!(Error::InvalidArgument(format!(
                "{line_what}: token id {bad} is outside the vocabulary 0..{vocab}"
            )));
        }
        if ids.len() > n {
            anyhow::bail!(Error::InvalidArgument(format!(
                "{line_what}: {} tokens, more than the model's {n} positions",
                ids.len()
            )));
        }
        prompts.push(ids);
    }
    if prompts.is_empty() {
        anyhow::bail!(Error::InvalidArgument(format!("{what}: no prompt")));
    }
    Ok(prompts)
}

fn generate_batch_on(
    kind: RuntimeKind,
    a: &GenerateArgs,
    prompts: &[Vec<i64>],
    new_tokens: usize,
) -> anyhow::Result<BatchGeneration> {
    let r = generate_on(kind, a, prompts, new_tokens)?;
    let g = r.generation;
    Ok(BatchGeneration {
        runtime: r.runtime,
        mode: r.mode,
        state_in_place: r.state_in_place,
        batch: prompts.len(),
        prompt_tokens: g.prompt_tokens.clone(),
        prefill_ms: g.prefill_ms,
        steps: g.step_ms.len(),
        steps_ms: g.steps_ms(),
        step_median_ms: g.step_median_ms(),
        step_tokens_per_s: g.step_tokens_per_s(),
        tokens: g.tokens,
        stopped: g.stopped,
        note: r.note,
    })
}

/// Runs `generate --prompts-file`.
pub fn run(a: &GenerateArgs, file: &Path, model: &DecodingModel) -> anyhow::Result<()> {
    let n = model.info.max_sequence;
    let prompts = read_prompts(file, model.vocab_size, n)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let room = n - longest;
    let new_tokens = match a.max_new_tokens {
        Some(k) if k > room => anyhow::bail!(Error::InvalidArgument(format!(
            "--max-new-tokens {k} would generate past the model's {n} positions (the longest prompt, {longest} tokens, leaves room for {room})"
        ))),
        Some(k) => k,
        None => room,
    };
    let kinds = runtimes(a);
    sampling(a).sampler()?;
    let mut results = Vec::new();
    for kind in kinds {
        results.push(generate_batch_on(kind, a, &prompts, new_tokens)?);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        for g in &results {
            println!(
                "{} ({} model, {} sequences{}):",
                g.runtime,
                g.mode,
                g.batch,
                if g.state_in_place {
                    ", state written in place"
                } else {
                    ""
                }
            );
            for (b, seq) in g.tokens.iter().enumerate() {
                println!("[{b}] {}", show_tokens(seq, model.vocab_size));
                if g.stopped[b] == StopReason::EndToken {
                    println!("[{b}] stopped at the end token");
                }
            }
            println!(
                "prefill: {} prompts ({} tokens) in {:.1} ms",
                g.batch,
                g.prompt_tokens.iter().sum::<usize>(),
                g.prefill_ms
            );
            match (g.step_median_ms, g.step_tokens_per_s) {
                (Some(median), Some(rate)) => println!(
                    "steps:   {} steps of {} tokens in {:.1} ms ({rate:.1} tokens/s in total, median step {median:.2} ms)",
                    g.steps, g.batch, g.steps_ms
                ),
                _ => println!("steps:   none"),
            }
        }
    }
    super::same_tokens(
        results.iter().map(|g| (g.runtime.as_str(), &g.tokens)),
        a.json,
    )
}
