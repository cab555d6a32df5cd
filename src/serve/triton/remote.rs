//! Generation against a Triton endpoint or the [router](super::router) in front of
//! several: the same generation as the library's [`Generator`](crate::generation::Generator)
//! (prompt, then pick and append until the end token or the tokens asked for, each
//! sequence with its own [`Sampling`] stream), with the model run by the server and its
//! state kept there, one thread per sequence.
//!
//! A server can be lost mid-sequence, and its state with it. When a request fails in a way
//! that starting again can get past ([`RequestError::restartable`]: no answer, a 5xx, a
//! server that does not know the sequence), the sequence starts again **under a new
//! sequence id** with its tokens so far as the prompt, on whatever server the router
//! picks, up to [`RemoteOptions::max_restarts`] times. An id is never sent again after a
//! failure, so a server that comes back holding an old state is never asked to continue
//! it. The sampler is the sequence's own and is not replayed: a restart changes which
//! server computes the logits, not which tokens are picked from them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::client::{Answer, Endpoint, RequestError, ServedModel};
use crate::error::{Error, Result};
use crate::generation::{check_vocabulary, Sampling, StopReason};
use crate::message::{Phrase, Setting};
use crate::rng::SplitMix64;

/// Default of [`RemoteOptions::max_restarts`].
pub const DEFAULT_MAX_RESTARTS: u32 = 8;
/// Default of [`RemoteOptions::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest pause before a restart (after several failures in a row).
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Where and how a remote generation runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteOptions {
    /// The endpoint: `http://HOST:PORT` of a Triton server or of the router.
    pub url: String,
    /// The model's name (`None`: the one model the server has).
    pub model: Option<String>,
    /// How many times one sequence may start again before the generation fails.
    pub max_restarts: u32,
    /// The longest a request may take before it counts as failed.
    pub request_timeout: Duration,
}

impl RemoteOptions {
    /// Options for `url` with the defaults.
    pub fn new(url: &str) -> RemoteOptions {
        RemoteOptions {
            url: url.to_string(),
            model: None,
            max_restarts: DEFAULT_MAX_RESTARTS,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

/// What one sequence produced, and what it took.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteSequence {
    /// Tokens of its prompt.
    pub prompt_tokens: usize,
    /// Its new tokens (up to and including the end token).
    pub tokens: Vec<i64>,
    /// Why it stopped.
    pub stopped: StopReason,
    /// How many times it started again under a new id.
    pub restarts: u32,
    /// The servers that answered it, in order, each once in a row (from the router's
    /// header; empty without a router).
    pub servers: Vec<String>,
    /// The failed requests' errors, one line each.
    pub failures: Vec<String>,
    /// Time from the sequence's start to its first token, ms.
    pub first_token_ms: f64,
    /// Each successful request's time, ms.
    pub request_ms: Vec<f64>,
    /// Time from the generation's start to this sequence's last token, ms.
    pub done_ms: f64,
}

/// What a remote generation produced.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteGeneration {
    /// One per prompt, in order.
    pub sequences: Vec<RemoteSequence>,
    /// From the first request to the last answer, ms.
    pub wall_ms: f64,
    /// When the generation started, ms since the Unix epoch (to line its times up with
    /// outside events, such as a server's loss).
    pub started_unix_ms: f64,
}

/// What a remote generation tells as it goes: sequence `index` starts again after
/// `error` (a restartable request failure).
pub type OnRestart<'a> = &'a (dyn Fn(usize, &RequestError) + Sync);

/// Fresh sequence ids: a random start (std's per-process random hasher keys and the time) stepped by a
/// counter and mixed, so that two clients, or two runs of one, do not pick the same ids.
/// Ids are below 2^53 (exact in any JSON reader) and never 0 (no sequence, to Triton).
struct SequenceIds {
    base: u64,
    next: AtomicU64,
}

impl SequenceIds {
    fn new() -> SequenceIds {
        use std::hash::{BuildHasher, Hasher};
        // std's hasher keys are random per process (from the OS) and differ per instance.
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        SequenceIds {
            base: SplitMix64::keyed(random ^ now, "sequence ids").next_u64(),
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> u64 {
        let k = self.next.fetch_add(1, Ordering::Relaxed);
        let id = SplitMix64::keyed(self.base ^ k, "sequence id").next_u64() >> 11;
        id.max(1)
    }
}

/// A connection to a served with-past model.
pub struct Remote {
    endpoint: Endpoint,
    model: ServedModel,
    options: RemoteOptions,
    ids: SequenceIds,
}

/// What one sequence's loop needs besides its prompt.
struct Run<'a> {
    remote: &'a Remote,
    sampling: Sampling,
    end_token: Option<i64>,
    new_tokens: usize,
    started: Instant,
    on_restart: OnRestart<'a>,
}

impl Remote {
    /// Connects: the endpoint answers, the model is there, ready and keeps a state.
    pub fn connect(options: RemoteOptions) -> Result<Remote> {
        let endpoint = Endpoint::new(&options.url, options.request_timeout)?;
        let model = endpoint.model(options.model.as_deref())?;
        Ok(Remote {
            endpoint,
            model,
            options,
            ids: SequenceIds::new(),
        })
    }

    /// The served model.
    pub fn model(&self) -> &ServedModel {
        &self.model
    }

    /// The endpoint's URL.
    pub fn url(&self) -> &str {
        self.endpoint.url()
    }

    /// Generates up to `new_tokens` for each prompt, all sequences at once (one thread
    /// each), stopping each at `end_token`; tells `on_restart` of every restart.
    pub fn generate(
        &self,
        prompts: &[Vec<i64>],
        new_tokens: usize,
        sampling: Sampling,
        end_token: Option<i64>,
        on_restart: OnRestart,
    ) -> Result<RemoteGeneration> {
        sampling.sampler()?;
        let vocab = self.model.vocab_size;
        check_vocabulary(&end_token, vocab, "end token")?;
        for p in prompts {
            check_vocabulary(p, vocab, "prompt token id")?;
        }
        if let (Some(n), Some(longest)) =
            (self.model.max_sequence, prompts.iter().map(Vec::len).max())
        {
            if longest + new_tokens > n {
                return Err(Error::InvalidArgument(format!(
                    "{new_tokens} new tokens after a prompt of {longest} would pass the served model's {n} positions"
                )));
            }
        }
        let started_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3);
        let run = Run {
            remote: self,
            sampling,
            end_token,
            new_tokens,
            started: Instant::now(),
            on_restart,
        };
        let sequences = std::thread::scope(|scope| {
            let run = &run;
            let handles: Vec<_> = prompts
                .iter()
                .enumerate()
                .map(|(index, p)| scope.spawn(move || run.sequence(index, p)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Internal("a sequence thread panicked".into()))
                    })
                })
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(RemoteGeneration {
            sequences,
            wall_ms: run.started.elapsed().as_secs_f64() * 1e3,
            started_unix_ms,
        })
    }
}

impl Run<'_> {
    /// One sequence: requests until done, starting again under a new id after a failure
    /// a restart can get past.
    fn sequence(&self, index: usize, prompt: &[i64]) -> Result<RemoteSequence> {
        let remote = self.remote;
        let mut sampler = self.sampling.sampler()?;
        let mut s = RemoteSequence {
            prompt_tokens: prompt.len(),
            tokens: Vec::with_capacity(self.new_tokens),
            stopped: StopReason::MaxNewTokens,
            restarts: 0,
            servers: Vec::new(),
            failures: Vec::new(),
            first_token_ms: 0.0,
            request_ms: Vec::new(),
            done_ms: 0.0,
        };
        let started = Instant::now();
        let mut id = remote.ids.next();
        // Tokens of prompt ++ tokens the server holds under `id` (0: the next request starts it).
        let mut held = 0;
        let mut failed_in_a_row = 0u32;
        while s.tokens.len() < self.new_tokens {
            let all: Vec<i64> = prompt.iter().chain(&s.tokens).copied().collect();
            let end = s.tokens.len() + 1 == self.new_tokens;
            let sent = Instant::now();
            match remote
                .endpoint
                .infer(&remote.model, id, held == 0, end, &all[held..])
            {
                Ok(Answer { logits, server }) => {
                    s.request_ms.push(sent.elapsed().as_secs_f64() * 1e3);
                    held = all.len();
                    failed_in_a_row = 0;
                    if let Some(server) = server.filter(|x| s.servers.last() != Some(x)) {
                        s.servers.push(server);
                    }
                    let t = sampler.pick(&logits) as i64;
                    s.tokens.push(t);
                    if s.tokens.len() == 1 {
                        s.first_token_ms = started.elapsed().as_secs_f64() * 1e3;
                    }
                    if Some(t) == self.end_token {
                        s.stopped = StopReason::EndToken;
                        if !end {
                            // Frees the server's slot now rather than when it idles out.
                            let _ = remote.endpoint.infer(&remote.model, id, false, true, &[t]);
                        }
                        break;
                    }
                }
                Err(e) if e.restartable() && s.restarts < remote.options.max_restarts => {
                    (self.on_restart)(index, &e);
                    s.failures.push(e.to_string());
                    s.restarts += 1;
                    id = remote.ids.next();
                    held = 0;
                    if failed_in_a_row > 0 {
                        let pause = Duration::from_millis(100) * 2u32.pow(failed_in_a_row.min(5));
                        std::thread::sleep(pause.min(MAX_BACKOFF));
                    }
                    failed_in_a_row += 1;
                }
                Err(e) => return Err(self.failure(e, s.restarts)),
            }
        }
        s.done_ms = self.started.elapsed().as_secs_f64() * 1e3;
        Ok(s)
    }

    fn failure(&self, e: RequestError, restarts: u32) -> Error {
        let url = self.remote.url();
        if e.restartable() {
            Error::Setting(
                Phrase::text(format!(
                    "{url}: a sequence still failed after {restarts} restarts ({e}); is a server up? (or raise "
                ))
                .and(Setting::MaxRestarts)
                .then(")"),
            )
        } else {
            Error::RuntimeFailed {
                runtime: format!("Triton at {url}"),
                reason: e.to_string(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_ids_are_distinct_nonzero_and_below_2_53() {
        let ids = SequenceIds::new();
        let mut seen: Vec<u64> = (0..10_000).map(|_| ids.next()).collect();
        assert!(seen.iter().all(|&id| id > 0 && id < 1 << 53));
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 10_000);
        let other = SequenceIds::new();
        assert_ne!(other.base, ids.base);
    }
}
