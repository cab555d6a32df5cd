//! `generate --prompts-file`: several prompts decoded together as one batch, by the same
//! generation loop as one prompt (`Generator`). The prompts go in as one run (padded to
//! the longest; see `Decoder::prefill`), then every step
//! feeds each sequence its own next token at its own position. A static-state model
//! (docs/static-state.md) takes prompts of different lengths; any other model needs them
//! of one length. Each sequence samples with its own sampler seeded with `--seed`, so it
//! gets the tokens it would get decoded alone.

use std::path::Path;

use gmlp_onnx::generation::StopReason;
use gmlp_onnx::generation::{check_vocabulary, DecodingFile};
use gmlp_onnx::Error;

use super::{check_sampling, generate_all, parse_ids, show_tokens, GenerateArgs, Sequences};

/// Most prompts one file may hold (the state of every sequence is allocated at once).
pub const MAX_PROMPTS: usize = 64;
/// Largest prompts file read, in bytes.
pub const MAX_PROMPTS_FILE_BYTES: u64 = 16 << 20;

/// The prompts of `file`: one per non-blank line, comma-separated token ids within the
/// vocabulary; at most [`MAX_PROMPTS`], each of at most `n` tokens.
pub(super) fn read_prompts(file: &Path, vocab: usize, n: usize) -> anyhow::Result<Vec<Vec<i64>>> {
    let what = format!("--prompts-file {}", file.display());
    let size = std::fs::metadata(file)
        .map_err(|e| Error::io(file, e))?
        .len();
    if size > MAX_PROMPTS_FILE_BYTES {
        anyhow::bail!(Error::OutOfRange(format!(
            "{what}: {size} bytes is more than the {MAX_PROMPTS_FILE_BYTES} a prompts file may have"
        )));
    }
    let text = std::fs::read_to_string(file).map_err(|e| Error::io(file, e))?;
    let mut prompts = Vec::new();
    for (k, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if prompts.len() == MAX_PROMPTS {
            anyhow::bail!(Error::OutOfRange(format!(
                "{what}: more than {MAX_PROMPTS} prompts (decode them in several runs)"
            )));
        }
        let line_what = format!("{what} line {}", k + 1);
        let ids = parse_ids(line, &line_what)?;
        check_vocabulary(&ids, vocab, &format!("{line_what}: token id"))?;
        if ids.len() > n {
            anyhow::bail!(Error::PastPositions(format!(
                "{line_what}: {} tokens, more than the model's {n} positions",
                ids.len()
            )));
        }
        prompts.push(ids);
    }
    if prompts.is_empty() {
        anyhow::bail!(Error::BatchShape(format!("{what}: no prompt")));
    }
    Ok(prompts)
}

/// Runs `generate --prompts-file`.
pub fn run(a: &GenerateArgs, file: &DecodingFile, prompts_file: &Path) -> anyhow::Result<()> {
    let model = file.description();
    let n = model.info.max_sequence;
    let prompts = read_prompts(prompts_file, model.vocab_size, n)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let room = n - longest;
    let new_tokens = match a.max_new_tokens {
        Some(k) if k > room => anyhow::bail!(Error::PastPositions(format!(
            "--max-new-tokens {k} would generate past the model's {n} positions (the longest prompt, {longest} tokens, leaves room for {room})"
        ))),
        Some(k) => k,
        None => room,
    };
    check_sampling(a)?;
    let results = generate_all(a, file, &prompts, new_tokens)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        for g in &results {
            let Sequences::Batch {
                batch,
                prompt_tokens,
                tokens,
                stopped,
            } = &g.sequences
            else {
                anyhow::bail!(Error::Internal("a single report of a prompts file".into()));
            };
            println!(
                "{} ({} model, {batch} sequences{}):",
                g.runtime,
                g.mode,
                if g.state_in_place {
                    ", state written in place"
                } else {
                    ""
                }
            );
            for (b, seq) in tokens.iter().enumerate() {
                println!("[{b}] {}", show_tokens(seq, model.vocab_size));
                if stopped[b] == StopReason::EndToken {
                    println!("[{b}] stopped at the end token");
                }
            }
            println!(
                "prefill: {batch} prompts ({} tokens) in {:.1} ms",
                prompt_tokens.iter().sum::<usize>(),
                g.prefill_ms
            );
            match (g.step_median_ms, g.step_tokens_per_s) {
                (Some(median), Some(rate)) => println!(
                    "steps:   {} steps of {batch} tokens in {:.1} ms ({rate:.1} tokens/s in total, median step {median:.2} ms)",
                    g.steps, g.steps_ms
                ),
                _ => println!("steps:   none"),
            }
            if let Some(line) = g.form_line() {
                println!("{line}");
            }
        }
    }
    super::same_tokens(&results, a.json)
}
