//! `generate --server URL`: the same generation as `generate FILE`, run by a Triton server
//! or by the router in front of several (`gmlp-onnx triton --servers`), each sequence a
//! thread of its own sending tokens only (the library's [`Remote`]). A sequence whose
//! request fails starts again under a new sequence id; `--json` says how many times and
//! on which servers (the router's answer header).

use serde::Serialize;

use gmlp_onnx::generation::StopReason;
use gmlp_onnx::serve::triton::client::RequestError;
use gmlp_onnx::serve::triton::remote::{Remote, RemoteGeneration, RemoteOptions};
use gmlp_onnx::Error;

use super::{batch, check_sampling, parse_prompt, sampling, show_tokens, GenerateArgs, Sequences};

/// What a remote generation did (`generate --server --json` prints a list of one, like the
/// list of runtimes of `generate FILE --json`).
#[derive(Serialize)]
struct ServerReport {
    runtime: &'static str,
    server: String,
    model: String,
    /// The sequences' prompts, tokens and stop reasons, as `generate FILE` reports them.
    #[serde(flatten)]
    sequences: Sequences,
    /// Per sequence: how many times it started again under a new sequence id.
    restarts: Vec<u32>,
    /// Per sequence: the servers that answered it, in order (the router's header).
    servers: Vec<Vec<String>>,
    /// Per sequence: the errors of its failed requests.
    failures: Vec<Vec<String>>,
    /// Per sequence: ms from the generation's start to its last token.
    done_ms: Vec<f64>,
    /// When the generation started, ms since the Unix epoch.
    started_unix_ms: f64,
    /// Successful requests.
    requests: usize,
    wall_ms: f64,
    /// New tokens of all sequences per second of the whole run.
    tokens_per_s: f64,
    request_p50_ms: f64,
    request_p99_ms: f64,
    first_token_p50_ms: f64,
}

/// The q-quantile of `values` (nearest rank; 0 when empty).
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn report(a: &GenerateArgs, remote: &Remote, g: RemoteGeneration) -> ServerReport {
    let seqs = &g.sequences;
    let sequences = match (seqs.as_slice(), a.prompts_file.is_some()) {
        ([s], false) => Sequences::One {
            prompt_tokens: s.prompt_tokens,
            tokens: s.tokens.clone(),
            stopped: s.stopped,
            prefill_tokens_per_s: s.prompt_tokens as f64 / (s.first_token_ms / 1e3),
        },
        _ => Sequences::Batch {
            batch: seqs.len(),
            prompt_tokens: seqs.iter().map(|s| s.prompt_tokens).collect(),
            tokens: seqs.iter().map(|s| s.tokens.clone()).collect(),
            stopped: seqs.iter().map(|s| s.stopped).collect(),
        },
    };
    let latencies: Vec<f64> = seqs.iter().flat_map(|s| s.request_ms.clone()).collect();
    let firsts: Vec<f64> = seqs.iter().map(|s| s.first_token_ms).collect();
    let new_tokens: usize = seqs.iter().map(|s| s.tokens.len()).sum();
    ServerReport {
        runtime: "triton",
        server: remote.url().to_string(),
        model: remote.model().name.clone(),
        sequences,
        restarts: seqs.iter().map(|s| s.restarts).collect(),
        servers: seqs.iter().map(|s| s.servers.clone()).collect(),
        failures: seqs.iter().map(|s| s.failures.clone()).collect(),
        done_ms: seqs.iter().map(|s| s.done_ms).collect(),
        started_unix_ms: g.started_unix_ms,
        requests: latencies.len(),
        wall_ms: g.wall_ms,
        tokens_per_s: new_tokens as f64 / (g.wall_ms / 1e3),
        request_p50_ms: quantile(&latencies, 0.5),
        request_p99_ms: quantile(&latencies, 0.99),
        first_token_p50_ms: quantile(&firsts, 0.5),
    }
}

/// Runs `generate --server URL`.
pub fn run(a: &GenerateArgs, url: &str) -> anyhow::Result<()> {
    check_sampling(a)?;
    let mut options = RemoteOptions::new(url);
    options.model = a.triton_name.clone();
    options.max_restarts = a.max_restarts.unwrap_or(options.max_restarts);
    let remote = Remote::connect(options)?;
    let (vocab, n) = (remote.model().vocab_size, remote.model().max_sequence);
    let prompts = match &a.prompts_file {
        Some(file) => batch::read_prompts(file, vocab, n.unwrap_or(usize::MAX))?,
        None => vec![parse_prompt(a, vocab)?],
    };
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let new_tokens = match (a.max_new_tokens, n) {
        (Some(k), Some(n)) if longest + k > n => anyhow::bail!(Error::PastPositions(format!(
            "--max-new-tokens {k} would generate past the served model's {n} positions (the longest prompt, {longest} tokens, leaves room for {})",
            n.saturating_sub(longest)
        ))),
        (Some(k), _) => k,
        (None, Some(n)) if longest > n => anyhow::bail!(Error::PastPositions(format!(
            "a prompt of {longest} tokens is longer than the served model's {n} positions"
        ))),
        (None, Some(n)) => n - longest,
        (None, None) => anyhow::bail!(Error::Conflict(
            "give --max-new-tokens: the served model's state grows, and its configuration does not say how far".into()
        )),
    };
    let quiet = a.quiet;
    let note = move |b: usize, e: &RequestError| {
        if !quiet {
            eprintln!("note: sequence {b} starts again under a new sequence id ({e})");
        }
    };
    let g = remote.generate(&prompts, new_tokens, sampling(a), a.eos_token_id, &note)?;
    let r = report(a, &remote, g);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&[&r])?);
        return Ok(());
    }
    println!(
        "{} on {} ({} sequences):",
        r.model,
        r.server,
        r.restarts.len()
    );
    let stopped: Vec<StopReason> = match &r.sequences {
        Sequences::One { stopped, .. } => vec![*stopped],
        Sequences::Batch { stopped, .. } => stopped.clone(),
    };
    for (b, tokens) in r.sequences.tokens().iter().enumerate() {
        println!("[{b}] {}", show_tokens(tokens, vocab));
        if stopped[b] == StopReason::EndToken {
            println!("[{b}] stopped at the end token");
        }
        if r.restarts[b] > 0 {
            println!("[{b}] started again {} times", r.restarts[b]);
        }
    }
    println!(
        "{} requests in {:.1} ms ({:.1} tokens/s; request p50 {:.2} ms, p99 {:.2} ms)",
        r.requests, r.wall_ms, r.tokens_per_s, r.request_p50_ms, r.request_p99_ms
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
