//! A KServe v2 HTTP/JSON client for a with-past model served by Triton (or by several
//! servers behind the [router](super::router)): tokens only, the sequence's state kept by
//! the server. [`Endpoint::model`] reads what a generation needs from the model's
//! configuration (`/v2/models/NAME/config`: the vocabulary, and n for a static state);
//! [`Endpoint::infer`] sends one request of a sequence and returns the last row of its
//! logits (asked for as binary data: exact f32 and no JSON parsing of floats), or a
//! [`RequestError`] saying whether starting the sequence again can get past it.
//!
//! HTTP by [ureq](https://docs.rs/ureq) without its TLS and compression features: a
//! blocking client with a connection pool and a handful of small dependencies, no async
//! runtime (the remote generation runs each sequence on a thread of its own).

use std::time::Duration;

use serde_json::{json, Value};

use super::router::{SEQUENCE_HEADER, SERVER_HEADER};
use crate::error::{Error, Result};
use crate::gmlp::emit::INPUT_IDS;
use crate::message::{Phrase, Setting};

/// The output a with-past model answers with.
pub const LOGITS: &str = "logits";
/// Triton's answer header giving the length of the JSON part of a binary answer.
const HEADER_LENGTH: &str = "Inference-Header-Content-Length";
/// What Triton says of a request for a sequence it does not hold (never started, freed
/// after being idle, or started on a server that has since restarted).
const UNKNOWN_SEQUENCE: &str = "must specify the START flag";

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// No answer: refused, reset or timed out connection (a server or router gone or hung).
    #[error("transport: {0}")]
    Transport(String),
    /// A server-side failure (HTTP 5xx: Triton's, or the router's when no server answers).
    #[error("[{status}] {message}")]
    Server {
        /// The HTTP status.
        status: u16,
        /// The answer's message, on one line.
        message: String,
    },
    /// The server does not hold the sequence (Triton's "must specify the START flag").
    #[error("[{status}] {message}")]
    UnknownSequence {
        /// The HTTP status (400).
        status: u16,
        /// Triton's message.
        message: String,
    },
    /// Any other refusal (a bad request, an unknown model): starting again would not help.
    #[error("[{status}] {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The answer's message, on one line.
        message: String,
    },
    /// An answer that is not what a with-past model gives.
    #[error("malformed answer: {0}")]
    BadAnswer(String),
}

impl RequestError {
    /// True when the sequence may get past it by starting again (on whatever server):
    /// transport errors, server errors and unknown sequences.
    pub fn restartable(&self) -> bool {
        matches!(
            self,
            RequestError::Transport(_)
                | RequestError::Server { .. }
                | RequestError::UnknownSequence { .. }
        )
    }
}

/// A served with-past model, as its configuration describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedModel {
    /// The model's name on the server.
    pub name: String,
    /// The vocabulary (the last dimension of `logits`).
    pub vocab_size: usize,
    /// n, the positions of a static state (`None` for a growing state, whose
    /// configuration does not say it).
    pub max_sequence: Option<usize>,
}

/// One answer: the last row of the logits, and the server that gave it (when a router
/// says so in its header).
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The logits of the last token sent.
    pub logits: Vec<f32>,
    /// The router's [`SERVER_HEADER`].
    pub server: Option<String>,
}

/// A Triton HTTP endpoint (a server or the router).
pub struct Endpoint {
    agent: ureq::Agent,
    base: String,
}

fn one_line(text: &str) -> String {
    crate::error::one_line(text)
}

fn server_setting(url: &str, what: String) -> Error {
    Error::Setting(Phrase::setting(Setting::Server).then(format!(" {url}: {what}")))
}

impl Endpoint {
    /// An endpoint at `url` (`http://HOST:PORT` or `HOST:PORT`), each request bounded by
    /// `timeout`. Nothing is sent yet.
    pub fn new(url: &str, timeout: Duration) -> Result<Endpoint> {
        let rest = if let Some(r) = url.strip_prefix("http://") {
            r
        } else if url.contains("://") {
            return Err(server_setting(
                url,
                "only http:// is supported (Triton's HTTP endpoint, or the router)".into(),
            ));
        } else {
            url
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(server_setting(url, "give it as http://HOST:PORT".into()));
        }
        super::router::ServerAddress::parse(authority).map_err(|_| {
            server_setting(
                url,
                "not HOST:PORT (a host and a port from 1 to 65535)".into(),
            )
        })?;
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .max_idle_connections_per_host(256)
            .max_idle_connections(256)
            .build();
        Ok(Endpoint {
            agent: config.into(),
            base: format!("http://{authority}"),
        })
    }

    /// The endpoint's base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// A GET or POST (with a JSON body) to `path`: the status and the body as text.
    fn call(&self, path: &str, body: Option<&Value>) -> Result<(u16, String), RequestError> {
        let url = format!("{}{path}", self.base);
        let answer = match body {
            None => self.agent.get(&url).call(),
            Some(b) => self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(b.to_string()),
        };
        let mut answer = answer.map_err(|e| RequestError::Transport(one_line(&e.to_string())))?;
        let status = answer.status().as_u16();
        let text = answer
            .body_mut()
            .read_to_string()
            .map_err(|e| RequestError::Transport(one_line(&e.to_string())))?;
        Ok((status, text))
    }

    /// The model `name` (or, without a name, the one model the server has), checked ready
    /// and with-past, and what its configuration says of it.
    pub fn model(&self, name: Option<&str>) -> Result<ServedModel> {
        let unreachable =
            |e: RequestError| server_setting(&self.base, format!("no answer from Triton ({e})"));
        let name = match name {
            Some(n) => n.to_string(),
            None => self.only_model().map_err(|e| match e {
                ModelListError::Request(e) => unreachable(e),
                ModelListError::Not(why) => Error::Setting(
                    Phrase::text(format!("{}: {why}; name one with ", self.base))
                        .and(Setting::TritonName),
                ),
            })?,
        };
        super::check_model_name(&name)?;
        let (status, text) = self
            .call(&format!("/v2/models/{name}/config"), None)
            .map_err(unreachable)?;
        if status != 200 {
            return Err(Error::Setting(
                Phrase::text(format!(
                    "{}: no model {name:?} (Triton: [{status}] {}); check ",
                    self.base,
                    error_message(&text)
                ))
                .and(Setting::TritonName),
            ));
        }
        let config: Value = serde_json::from_str(&text)
            .map_err(|e| server_setting(&self.base, format!("unreadable configuration: {e}")))?;
        let (status, _) = self
            .call(&format!("/v2/models/{name}/ready"), None)
            .map_err(unreachable)?;
        if status != 200 {
            return Err(server_setting(
                &self.base,
                format!("model {name:?} is not ready (HTTP {status})"),
            ));
        }
        served_model(&name, &config).map_err(|why| server_setting(&self.base, why))
    }

    /// The name of the one ready model of the repository.
    fn only_model(&self) -> std::result::Result<String, ModelListError> {
        let (status, text) = self
            .call("/v2/repository/index", Some(&json!({"ready": true})))
            .map_err(ModelListError::Request)?;
        let list: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let names: Vec<&str> = list
            .as_array()
            .map(|a| a.iter().filter_map(|m| m["name"].as_str()).collect())
            .unwrap_or_default();
        match (status, names.as_slice()) {
            (200, [one]) => Ok(one.to_string()),
            (200, []) => Err(ModelListError::Not("the server has no ready model".into())),
            (200, many) => Err(ModelListError::Not(format!(
                "the server has several models ({})",
                many.join(", ")
            ))),
            _ => Err(ModelListError::Not(format!(
                "its model list is refused ([{status}] {})",
                error_message(&text)
            ))),
        }
    }

    /// Sends `tokens` as the next request of sequence `sequence` (the start flag on its
    /// first request, the end flag on its last) and returns the logits of the last token.
    pub fn infer(
        &self,
        model: &ServedModel,
        sequence: u64,
        start: bool,
        end: bool,
        tokens: &[i64],
    ) -> Result<Answer, RequestError> {
        let body = json!({
            "inputs": [{"name": INPUT_IDS, "shape": [1, tokens.len()], "datatype": "INT64", "data": tokens}],
            "outputs": [{"name": LOGITS, "parameters": {"binary_data": true}}],
            "parameters": {"sequence_id": sequence, "sequence_start": start, "sequence_end": end},
        });
        let url = format!("{}/v2/models/{}/infer", self.base, model.name);
        let transport = |e: ureq::Error| RequestError::Transport(one_line(&e.to_string()));
        let mut answer = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json")
            .header(SEQUENCE_HEADER, sequence.to_string())
            .send(body.to_string())
            .map_err(transport)?;
        let status = answer.status().as_u16();
        let header = |name: &str| {
            answer
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (server, json_length) = (header(SERVER_HEADER), header(HEADER_LENGTH));
        let bytes = answer
            .body_mut()
            .with_config()
            .limit(u64::MAX)
            .read_to_vec()
            .map_err(transport)?;
        if status != 200 {
            let message = error_message(&String::from_utf8_lossy(&bytes));
            return Err(match status {
                400 if message.contains(UNKNOWN_SEQUENCE) => {
                    RequestError::UnknownSequence { status, message }
                }
                500..=599 => RequestError::Server { status, message },
                _ => RequestError::Refused { status, message },
            });
        }
        let logits = last_logits(&bytes, json_length.as_deref(), model.vocab_size)?;
        Ok(Answer { logits, server })
    }
}

/// Why the one model of a repository could not be named.
enum ModelListError {
    Request(RequestError),
    Not(String),
}

/// Triton's `{"error": "..."}`, or the first line of any other body.
fn error_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| one_line(body.lines().find(|l| !l.trim().is_empty()).unwrap_or("")))
}

/// A dimension of a JSON configuration (Triton writes int64s as numbers or strings).
fn dim(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_str()?.parse().ok())
}

fn dims(v: &Value) -> Vec<i64> {
    v["dims"]
        .as_array()
        .map(|a| a.iter().filter_map(dim).collect())
        .unwrap_or_default()
}

/// What a generation needs from a model's JSON configuration, or why it cannot use it.
pub fn served_model(name: &str, config: &Value) -> std::result::Result<ServedModel, String> {
    let states = config["sequence_batching"]["state"]
        .as_array()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            format!("model {name:?} keeps no state (no sequence_batching state): serve a --with-past model")
        })?;
    let has_input_ids = config["input"]
        .as_array()
        .is_some_and(|a| a.iter().any(|t| t["name"] == INPUT_IDS));
    if !has_input_ids {
        return Err(format!("model {name:?} has no {INPUT_IDS} input"));
    }
    let logits = config["output"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["name"] == LOGITS))
        .ok_or_else(|| format!("model {name:?} has no {LOGITS} output"))?;
    let vocab_size = match dims(logits).last() {
        Some(&v) if v > 0 => v as usize,
        _ => {
            return Err(format!(
                "model {name:?}: {LOGITS} has no fixed vocabulary dimension"
            ))
        }
    };
    let past: Vec<Vec<i64>> = states
        .iter()
        .filter(|s| {
            s["input_name"]
                .as_str()
                .is_some_and(|n| n.starts_with(super::PAST_PREFIX))
        })
        .map(dims)
        .collect();
    let max_sequence = match past.first() {
        Some(d) if past.iter().all(|d| d.iter().all(|&x| x > 0)) && !d.is_empty() => {
            Some(d[0] as usize)
        }
        _ => None,
    };
    Ok(ServedModel {
        name: name.to_string(),
        vocab_size,
        max_sequence,
    })
}

/// The last row of the logits of a binary answer (JSON header of `json_length` bytes,
/// then the raw little-endian f32 data) or, without the header, of a JSON one.
fn last_logits(
    bytes: &[u8],
    json_length: Option<&str>,
    vocab: usize,
) -> Result<Vec<f32>, RequestError> {
    let bad = |why: String| RequestError::BadAnswer(why);
    let (head, data) = match json_length {
        Some(n) => {
            let n: usize = n
                .trim()
                .parse()
                .map_err(|_| bad(format!("{HEADER_LENGTH} {n}")))?;
            if n > bytes.len() {
                return Err(bad(format!(
                    "{HEADER_LENGTH} {n} past the {} bytes",
                    bytes.len()
                )));
            }
            (&bytes[..n], Some(&bytes[n..]))
        }
        None => (bytes, None),
    };
    let head: Value =
        serde_json::from_slice(head).map_err(|e| bad(format!("unreadable JSON: {e}")))?;
    let output = head["outputs"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["name"] == LOGITS))
        .ok_or_else(|| bad(format!("no {LOGITS} output")))?;
    let values: Vec<f32> = match data {
        Some(raw) => raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        None => output["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_f64().map(|x| x as f32))
                    .collect()
            })
            .unwrap_or_default(),
    };
    if vocab == 0 || values.is_empty() || !values.len().is_multiple_of(vocab) {
        return Err(bad(format!(
            "{} logits, not rows of the vocabulary {vocab}",
            values.len()
        )));
    }
    Ok(values[values.len() - vocab..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::triton::testing::names_settings;

    #[test]
    fn a_static_config_gives_the_vocabulary_and_n() {
        let config = json!({
            "input": [{"name": "input_ids", "dims": ["-1"]}],
            "output": [{"name": "logits", "dims": [-1, 50]}],
            "sequence_batching": {"state": [
                {"input_name": "past_sgu.0", "dims": ["48", "16"]},
                {"input_name": "position", "dims": [1]},
            ]},
        });
        let m = served_model("lm", &config).unwrap();
        assert_eq!((m.vocab_size, m.max_sequence), (50, Some(48)));
        let mut growing = config.clone();
        growing["sequence_batching"]["state"][0]["dims"] = json!([-1, 16]);
        assert_eq!(served_model("lm", &growing).unwrap().max_sequence, None);
        let stateless =
            json!({"input": [{"name": "input_ids"}], "output": [{"name": "logits", "dims": [50]}]});
        // The one test of this family's words (its refusals are reasons, which the caller
        // wraps in a `Setting::Server` error): the remedy is named.
        assert!(served_model("lm", &stateless)
            .unwrap_err()
            .contains("--with-past"));
    }

    #[test]
    fn binary_and_json_answers_give_the_last_row() {
        let head = br#"{"outputs":[{"name":"logits","datatype":"FP32","shape":[1,2,3]}]}"#;
        let mut bytes = head.to_vec();
        for v in [1.0f32, 2.0, 3.0, 4.0, 5.5, -6.0] {
            bytes.extend(v.to_le_bytes());
        }
        let n = head.len().to_string();
        assert_eq!(last_logits(&bytes, Some(&n), 3).unwrap(), [4.0, 5.5, -6.0]);
        assert!(last_logits(&bytes, Some(&n), 4).is_err());
        assert!(last_logits(&bytes, Some("100000"), 3).is_err());
        let json = br#"{"outputs":[{"name":"logits","data":[1,2,3,4]}]}"#;
        assert_eq!(last_logits(json, None, 2).unwrap(), [3.0, 4.0]);
    }

    #[test]
    fn urls_are_http_host_and_port() {
        let d = Duration::from_secs(1);
        assert_eq!(
            Endpoint::new("127.0.0.1:8000", d).unwrap().url(),
            "http://127.0.0.1:8000"
        );
        assert_eq!(Endpoint::new("http://h:1/", d).unwrap().url(), "http://h:1");
        for bad in ["https://h:1", "h", "http://h:1/v2", "h:0", ""] {
            let e = Endpoint::new(bad, d).err().expect(bad);
            assert!(names_settings(&e, &[Setting::Server]), "{bad}: {e:?}");
        }
    }

    #[test]
    fn errors_say_whether_a_restart_can_help() {
        assert!(RequestError::Transport("reset".into()).restartable());
        assert!(RequestError::Server {
            status: 503,
            message: String::new()
        }
        .restartable());
        assert!(RequestError::UnknownSequence {
            status: 400,
            message: String::new()
        }
        .restartable());
        assert!(!RequestError::Refused {
            status: 400,
            message: String::new()
        }
        .restartable());
        assert!(!RequestError::BadAnswer(String::new()).restartable());
        assert_eq!(error_message(r#"{"error":"x y"}"#), "x y");
        assert_eq!(error_message("<html>\n503 Service\n"), "<html>");
    }
}
