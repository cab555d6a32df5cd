//! Generation against a Triton endpoint or the [router](super::router) in front of
//! several: the library's one generation loop ([`Run`](crate::generation::Run): prompt,
//! then pick and append until the end token or the tokens asked for, each sequence with
//! its own [`Sampling`] stream) over [`Steps`] that send each sequence's tokens to the server, which runs the
//! model and keeps its state; one thread per sequence.
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
use ndarray::Array2;

use crate::generation::{check_vocabulary, Run as Loop, Sampling, Steps, StopReason};
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
                return Err(Error::PastPositions(format!(
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
    /// One sequence: the library's loop over [`Served`] steps, which start again under a
    /// new id after a failure a restart can get past.
    fn sequence(&self, index: usize, prompt: &[i64]) -> Result<RemoteSequence> {
        let mut served = Served {
            run: self,
            index,
            id: self.remote.ids.next(),
            tokens: Vec::with_capacity(prompt.len() + self.new_tokens),
            held: 0,
            failed_in_a_row: 0,
            restarts: 0,
            servers: Vec::new(),
            failures: Vec::new(),
            request_ms: Vec::new(),
        };
        let mut run = Loop::start(
            &mut served,
            &[prompt.to_vec()],
            self.new_tokens,
            self.sampling,
        )?;
        while run.step(&mut served, self.end_token, None)?.is_some() {}
        let g = run.finish();
        Ok(RemoteSequence {
            prompt_tokens: prompt.len(),
            tokens: g.tokens.into_iter().next().unwrap_or_default(),
            stopped: g
                .stopped
                .first()
                .copied()
                .unwrap_or(StopReason::MaxNewTokens),
            restarts: served.restarts,
            servers: served.servers,
            failures: served.failures,
            first_token_ms: g.prefill_ms,
            request_ms: served.request_ms,
            done_ms: self.started.elapsed().as_secs_f64() * 1e3,
        })
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

/// One sequence on the server, as [`Steps`] of one: the tokens fed so far (prompt, then
/// picks), of which the server holds the first `held` under `id`; each call for logits
/// sends the rest.
struct Served<'r, 'a> {
    run: &'r Run<'a>,
    index: usize,
    id: u64,
    tokens: Vec<i64>,
    /// Tokens the server holds under `id` (0: the next request starts the sequence).
    held: usize,
    failed_in_a_row: u32,
    restarts: u32,
    servers: Vec<String>,
    failures: Vec<String>,
    request_ms: Vec<f64>,
}

impl Steps for Served<'_, '_> {
    fn batch(&self) -> usize {
        1
    }

    fn prefill(&mut self, prompts: &[Vec<i64>]) -> Result<()> {
        self.tokens.clear();
        self.tokens.extend(prompts.iter().flatten());
        self.held = 0;
        Ok(())
    }

    fn advance(&mut self, picks: &[i64]) -> Result<()> {
        self.tokens.extend_from_slice(picks);
        Ok(())
    }

    /// Sends the tokens the server does not hold; after a failure a restart can get past,
    /// starts the sequence again under a new id with every token so far.
    fn next_logits(&mut self, last: bool) -> Result<Array2<f32>> {
        let remote = self.run.remote;
        loop {
            let sent = Instant::now();
            let start = self.held == 0;
            match remote.endpoint.infer(
                &remote.model,
                self.id,
                start,
                last,
                &self.tokens[self.held..],
            ) {
                Ok(Answer { logits, server }) => {
                    self.request_ms.push(sent.elapsed().as_secs_f64() * 1e3);
                    self.held = self.tokens.len();
                    self.failed_in_a_row = 0;
                    if let Some(server) = server.filter(|x| self.servers.last() != Some(x)) {
                        self.servers.push(server);
                    }
                    let vocab = logits.len();
                    return Array2::from_shape_vec((1, vocab), logits)
                        .map_err(|e| Error::Internal(e.to_string()));
                }
                Err(e) if e.restartable() && self.restarts < remote.options.max_restarts => {
                    (self.run.on_restart)(self.index, &e);
                    self.failures.push(e.to_string());
                    self.restarts += 1;
                    self.id = remote.ids.next();
                    self.held = 0;
                    if self.failed_in_a_row > 0 {
                        let pause =
                            Duration::from_millis(100) * 2u32.pow(self.failed_in_a_row.min(5));
                        std::thread::sleep(pause.min(MAX_BACKOFF));
                    }
                    self.failed_in_a_row += 1;
                }
                Err(e) => return Err(self.run.failure(e, self.restarts)),
            }
        }
    }

    /// Frees the server's slot now rather than when it idles out.
    fn end_early(&mut self, picks: &[i64]) {
        let remote = self.run.remote;
        let _ = remote
            .endpoint
            .infer(&remote.model, self.id, false, true, picks);
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
