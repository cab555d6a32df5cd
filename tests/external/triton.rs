//! Model repositories written by `gmlp-onnx triton` / `build --triton-repo`, served by a
//! real Triton Inference Server (tritonserver 2.51.0 from PyPI's nvidia-pytriton, with the
//! ONNX Runtime backend built from the vendored r24.10 sources by
//! scripts/triton_backend.sh), compared with ONNX Runtime in-process by
//! tests/triton_client.py. Also the refusals: nothing is written on bad input.
//!
//! scripts/test exports GMLP_ONNX_TRITON_* (see scripts/triton_backend.sh); when they are
//! missing, the test runs that script itself (cached, well under a second once built).
//!
//! Longer than ~500 lines: one Triton server setup shared by every serving case (plain,
//! growing state, static state batched, the docs' client loop, the endpoint under load and
//! faults with its server restart, refusals).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{
    assert_refused, gmlp, output_text, path_str, small_token_model, small_vision_model, tree, Amlp,
    Build,
};

mod fleet;

/// Tolerance of Triton's answers against ONNX Runtime in-process: a batch of several
/// requests runs other kernel blockings than one request (5e-7 seen).
const REL_TOL: f64 = 1e-5;

/// Where the Triton pieces are.
struct TritonEnv {
    python: String,
    server: String,
    backends: String,
    libs: String,
}

fn triton_env() -> TritonEnv {
    let var = |k: &str| std::env::var(k).ok();
    let mut vars: std::collections::HashMap<String, String> = [
        "GMLP_ONNX_TRITON_PYTHON",
        "GMLP_ONNX_TRITONSERVER",
        "GMLP_ONNX_TRITON_BACKENDS",
        "GMLP_ONNX_TRITON_LIBS",
    ]
    .iter()
    .filter_map(|k| var(k).map(|v| (k.to_string(), v)))
    .collect();
    if vars.len() < 4 {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/triton_backend.sh");
        let o = Command::new(script)
            .output()
            .expect("run scripts/triton_backend.sh");
        assert!(
            o.status.success(),
            "scripts/triton_backend.sh failed (it needs cmake, rapidjson-dev, googletest and ../shared/vendor): {}",
            output_text(&o)
        );
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            if let Some((k, v)) = line.split_once('=') {
                vars.insert(k.to_string(), v.to_string());
            }
        }
    }
    let get = |k: &str| {
        vars.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("{k} not set by scripts/triton_backend.sh"))
    };
    TritonEnv {
        python: get("GMLP_ONNX_TRITON_PYTHON"),
        server: get("GMLP_ONNX_TRITONSERVER"),
        backends: get("GMLP_ONNX_TRITON_BACKENDS"),
        libs: get("GMLP_ONNX_TRITON_LIBS"),
    }
}

/// Three free loopback ports (HTTP, gRPC, metrics).
fn free_ports() -> [u16; 3] {
    let listeners: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    let ports: Vec<u16> = listeners
        .iter()
        .map(|l| l.local_addr().expect("port").port())
        .collect();
    [ports[0], ports[1], ports[2]]
}

/// A running tritonserver, killed when dropped (also when a test fails).
struct Server {
    child: Child,
    /// HTTP, gRPC and metrics ports, kept across a restart.
    ports: [u16; 3],
    log: PathBuf,
}

impl Server {
    fn url(&self) -> String {
        format!("127.0.0.1:{}", self.ports[0])
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Starts tritonserver on `repo` (absolute path) and waits (bounded) until it is ready.
    fn start(env: &TritonEnv, repo: &Path, log: PathBuf) -> Server {
        let ports = free_ports();
        let child = Self::spawn(env, repo, &log, ports);
        let mut server = Server { child, ports, log };
        server.wait_ready();
        server
    }

    fn spawn(env: &TritonEnv, repo: &Path, log: &Path, [http, grpc, metrics]: [u16; 3]) -> Child {
        let log_file = std::fs::File::create(log).expect("create server log");
        Command::new(&env.server)
            .arg(format!("--model-repository={}", path_str(repo)))
            .arg(format!("--backend-directory={}", env.backends))
            .args(["--http-address=127.0.0.1", "--grpc-address=127.0.0.1"])
            .arg("--metrics-address=127.0.0.1")
            .arg(format!("--http-port={http}"))
            .arg(format!("--grpc-port={grpc}"))
            .arg(format!("--metrics-port={metrics}"))
            .arg("--exit-timeout-secs=5")
            .env("LD_LIBRARY_PATH", &env.libs)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log file"))
            .stderr(log_file)
            .spawn()
            .expect("start tritonserver")
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "tritonserver exited ({status}) before it was ready:\n{}",
                    self.log_tail()
                );
            }
            if http_status(self.ports[0], "/v2/health/ready") == Some(200) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "tritonserver not ready after 90 s:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Kills the server (SIGKILL: no drain, every sequence's state is lost) and starts a
    /// new one on the same ports, logging to `log`; waits until it is ready.
    fn restart(&mut self, env: &TritonEnv, repo: &Path, log: PathBuf) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log = log;
        self.child = Self::spawn(env, repo, &self.log, self.ports);
        self.wait_ready();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status code of a plain HTTP GET on loopback, `None` if nothing answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = String::new();
    s.read_to_string(&mut head).ok()?;
    head.split_whitespace().nth(1)?.parse().ok()
}

/// Runs tests/triton_client.py with the Triton venv's Python; returns its JSON answer.
fn client(env: &TritonEnv, args: &[&str]) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/triton_client.py");
    let o = Command::new(&env.python)
        .arg(script)
        .args(args)
        .output()
        .expect("run tests/triton_client.py");
    assert!(
        o.status.success(),
        "triton_client.py failed: {}",
        output_text(&o)
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("bad client output ({e}): {stdout}"))
}

/// Runs tests/triton_client.py like [`client`], restarting `server` each time the client
/// prints `RESTART` (and answering with the server's URL on its stdin); bounded by
/// `limit`, after which the client is killed and the test fails.
fn client_with_restarts(
    env: &TritonEnv,
    args: &[&str],
    server: &mut Server,
    repo: &Path,
    work: &Path,
    limit: Duration,
) -> serde_json::Value {
    use std::io::BufRead;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/triton_client.py");
    let stderr_path = work.join("client.stderr");
    let mut child = Command::new(&env.python)
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).expect("client stderr"))
        .spawn()
        .expect("run tests/triton_client.py");
    let mut stdin = child.stdin.take().expect("client stdin");
    let stdout = child.stdout.take().expect("client stdout");
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            if lines_tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + limit;
    let mut last = String::new();
    let mut restarts = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line == "RESTART" => {
                restarts += 1;
                server.restart(env, repo, work.join(format!("server-{restarts}.log")));
                writeln!(stdin, "{}", server.url()).expect("answer the client");
                stdin.flush().expect("answer the client");
            }
            Ok(line) => last = line,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "triton_client.py still running after {limit:?}: {}\nserver log:\n{}",
                    std::fs::read_to_string(&stderr_path).unwrap_or_default(),
                    server.log_tail()
                );
            }
        }
    }
    let status = child.wait().expect("wait for the client");
    assert!(
        status.success(),
        "triton_client.py failed ({status}): {}\nserver log:\n{}",
        std::fs::read_to_string(&stderr_path).unwrap_or_default(),
        server.log_tail()
    );
    serde_json::from_str(&last).unwrap_or_else(|e| panic!("bad client output ({e}): {last}"))
}

fn gmlp_ok(args: &[&str]) -> String {
    let o = gmlp(args);
    assert!(
        o.status.success(),
        "gmlp-onnx {args:?}: {}",
        output_text(&o)
    );
    output_text(&o)
}

/// The causal aMLPs these tests serve: 2 blocks of d 32, d_ffn 64, attention 8, a
/// vocabulary of 50, n = `seq_len`, spread weights.
fn causal_amlp(seq_len: usize) -> Build {
    causal_amlp_seeded(seq_len).args(&["--init", "spread"])
}

/// [`causal_amlp`] with the default seeded weights, whose tokens vary more.
fn causal_amlp_seeded(seq_len: usize) -> Build {
    Build::preset("amlp-base").args(&[
        "--layers",
        "2",
        "--d-model",
        "32",
        "--d-ffn",
        "64",
        "--attn-dim",
        "8",
        "--seq-len",
        &seq_len.to_string(),
        "--vocab-size",
        "50",
        "--causal",
    ])
}

fn assert_no_errors(report: &serde_json::Value, server: &Server) {
    let errors = report["errors"].as_array().expect("errors list");
    assert!(
        errors.is_empty(),
        "requests failed: {errors:?}\nserver log:\n{}",
        server.log_tail()
    );
}

/// Stateless models: a gMLP vision model written by `build --triton-repo` and an aMLP
/// token model with external data put in by `gmlp-onnx triton`. Four concurrent HTTP
/// clients; every answer equals ONNX Runtime's on the same example, and Triton's
/// statistics show that requests were batched together.
#[test]
fn a_repository_written_by_gmlp_onnx_is_served_by_triton_and_matches_onnx_runtime() {
    let env = triton_env();
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = dir.path().join("repo");
    let delay = "2000"; // µs: lets concurrent requests meet in one batch.
    let vision = small_vision_model(dir.path());
    let vision_name = "gmlp-vision";
    gmlp_ok(&[
        "triton",
        path_str(&vision),
        "--repo",
        path_str(&repo),
        "--triton-name",
        vision_name,
        "--triton-max-queue-delay-us",
        delay,
    ]);
    let token = dir.path().join("amlp.onnx");
    let amlp = Build::amlp(1, Amlp::Short).args(&["--init", "spread", "--external-data", "-q"]);
    let mut argv = amlp.argv(&token);
    argv.extend([
        "--triton-repo",
        path_str(&repo),
        "--triton-name",
        "amlp",
        "--triton-max-queue-delay-us",
        delay,
    ]);
    gmlp_ok(&argv);
    assert!(repo.join("amlp/1/model.onnx.data").is_file());
    let token_copy = small_token_model(dir.path());
    gmlp_ok(&[
        "triton",
        path_str(&token_copy),
        "--repo",
        path_str(&repo),
        "--triton-name",
        "amlp-copy",
    ]);
    let server = Server::start(&env, &repo, dir.path().join("server.log"));
    for (name, model, int_high) in [
        (vision_name, &vision, "1"),
        ("amlp", &token, "300"),
        ("amlp-copy", &token_copy, "300"),
    ] {
        let report = client(
            &env,
            &[
                "stateless",
                &server.url(),
                name,
                path_str(model),
                "--clients",
                "4",
                "--requests",
                "8",
                "--int-high",
                int_high,
            ],
        );
        assert_no_errors(&report, &server);
        let max_rel = report["max_rel"].as_f64().expect("max_rel");
        assert!(
            max_rel <= REL_TOL,
            "{name}: rel {max_rel:.3e} > {REL_TOL:e}"
        );
        let inferences = report["inference_count"].as_u64().expect("count");
        let executions = report["execution_count"].as_u64().expect("count");
        assert_eq!(inferences, 32, "{name}: {report}");
        if name != "amlp-copy" {
            // The default 100 µs delay may or may not batch; 2000 µs with four clients does.
            assert!(
                executions < inferences,
                "{name}: no dynamic batching ({inferences} inferences in {executions} executions)"
            );
        }
        eprintln!("{name}: {report}");
    }
}

/// A with-past model under Triton's implicit state: several sequences of one-token
/// requests, interleaved, each reproducing the logits of one whole-sequence ONNX Runtime
/// run of the original model. Takes a with-past model gmlp-onnx built (input_ids
/// [batch, sequence], past_* / present_* [batch, positions, width]).
fn check_with_past_model(env: &TritonEnv, model: &Path, vocab: usize, work: &Path) {
    let repo = work.join("repo-with-past");
    let out = gmlp_ok(&[
        "triton",
        path_str(model),
        "--repo",
        path_str(&repo),
        "--triton-name",
        "lm",
    ]);
    assert!(out.contains("implicit states"), "{out}");
    let server = Server::start(env, &repo, work.join("server-with-past.log"));
    let vocab = vocab.to_string();
    let report = client(
        env,
        &[
            "with-past",
            &server.url(),
            "lm",
            path_str(model),
            "--sequences",
            "4",
            "--steps",
            "12",
            "--int-high",
            &vocab,
        ],
    );
    assert_no_errors(&report, &server);
    let max_rel = report["max_rel"].as_f64().expect("max_rel");
    assert!(max_rel <= REL_TOL, "with-past: rel {max_rel:.3e}: {report}");
    assert_eq!(report["inference_count"].as_u64(), Some(48), "{report}");
    assert_eq!(report["interleaved"].as_bool(), Some(true), "{report}");
    eprintln!("with-past: {report}");
}

#[test]
fn with_past_single_token_requests_reproduce_the_whole_sequence() {
    let env = triton_env();
    let dir = tempfile::tempdir().expect("tempdir");
    // A with-past file from elsewhere (the client's toy, made with onnx.helper) is refused
    // in one line, nothing written: Triton keeps a state only through the interface
    // emitted from a configuration (0.12.0).
    let toy = dir.path().join("toy-with-past.onnx");
    client(&env, &["toy-with-past", path_str(&toy), "--vocab", "11"]);
    let toy_repo = dir.path().join("repo-toy");
    assert_refused(
        &["triton", path_str(&toy), "--repo", path_str(&toy_repo)],
        "not written by gmlp-onnx",
    );
    assert!(!toy_repo.join("toy-with-past").exists(), "nothing written");
    // A real one from `build --with-past growing`: a causal aMLP (heads 1, Toeplitz gather),
    // 2 blocks, n = 16 (48 steps of one token fill 4 sequences of 12).
    let real = dir.path().join("amlp-with-past.onnx");
    causal_amlp(16)
        .args(&["--with-past", "growing"])
        .write(&real);
    let work = dir.path().join("real");
    std::fs::create_dir(&work).expect("mkdir");
    check_with_past_model(&env, &real, 50, &work);
    // And the g-mlp-pytorch aMLP trained with shift_tokens = 2: its token-shift window
    // (`past_shift.{i}`, at most 2 rows) is an implicit state like the growing ones.
    let shifted = dir.path().join("shift-with-past.onnx");
    let checkpoint =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lucid_shift_causal/model.safetensors");
    gmlp_ok(&[
        "build",
        "--weights",
        path_str(&checkpoint),
        "--causal",
        "--shift-tokens",
        "2",
        "--with-past",
        "growing",
        "-o",
        path_str(&shifted),
    ]);
    let work = dir.path().join("shift");
    std::fs::create_dir(&work).expect("mkdir");
    check_with_past_model(&env, &shifted, 256, &work);
}

/// The served file of a static-state model is the built one emitted again with Triton's
/// interface: the built file's nodes in their order (reading the flattened `position`
/// column), the nodes of the counter (scope `triton_position/`), the built file's
/// initializers (its weights as built), its inputs (`position` declared [batch, 1]) and
/// outputs, and `triton_next_position` after them.
fn assert_served_as_built_plus_the_counter(built: &Path, served: &Path) {
    use gmlp_onnx::onnx::proto as onnx;
    use prost::Message;
    let read = |p: &Path| {
        onnx::ModelProto::decode(std::fs::read(p).expect("model").as_slice()).expect("decode")
    };
    let (built, served) = (read(built), read(served));
    let (b, s) = (
        built.graph.as_ref().expect("graph"),
        served.graph.as_ref().expect("graph"),
    );
    let counter = |n: &onnx::NodeProto| n.name().starts_with("triton_position/");
    let flat = s
        .node
        .iter()
        .find(|n| n.name() == "triton_position/flatten")
        .map(|n| n.output[0].clone())
        .expect("the flattened position");
    let ops: Vec<&str> = s
        .node
        .iter()
        .filter(|n| counter(n))
        .map(|n| n.op_type())
        .collect();
    assert!(
        ops.contains(&"Reshape") && ops.contains(&"Slice") && ops.contains(&"Add"),
        "{ops:?}"
    );
    let own: Vec<onnx::NodeProto> = s
        .node
        .iter()
        .filter(|n| !counter(n))
        .cloned()
        .map(|mut n| {
            for i in &mut n.input {
                if *i == flat {
                    *i = "position".into();
                }
            }
            n
        })
        .collect();
    assert!(own == b.node, "the model's own nodes changed");
    assert!(s.initializer == b.initializer, "the weights changed");
    let names = |v: &[onnx::ValueInfoProto]| -> Vec<String> {
        v.iter().map(|x| x.name().to_string()).collect()
    };
    assert_eq!(names(&s.input), names(&b.input));
    for (si, bi) in s.input.iter().zip(&b.input) {
        if si.name() != "position" {
            assert_eq!(si, bi);
        }
    }
    assert_eq!(s.output[..b.output.len()], b.output[..]);
    assert_eq!(names(&s.output[b.output.len()..]), ["triton_next_position"]);
    assert_eq!(served.opset_import, built.opset_import);
}

/// A static-state model (`build --with-past`, docs/static-state.md) served with
/// max_batch_size 8 and its position kept by Triton: eight concurrent sequences with
/// prompts of different lengths (2 to 9 tokens), then one-token steps in lock step, every
/// request `input_ids` only. Every answer equals the sequence's own ONNX Runtime run of
/// the built file, and Triton's statistics show executions of several sequences at
/// different positions at once. A request that also sends `position` is refused.
#[test]
fn static_state_sequences_at_different_positions_batch_together() {
    let env = triton_env();
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("amlp-static.onnx");
    let repo = dir.path().join("repo-static");
    let amlp = causal_amlp(24).args(&["--with-past", "static"]);
    let mut argv = amlp.argv(&model);
    argv.extend([
        "--triton-repo",
        path_str(&repo),
        "--triton-name",
        "lm",
        // Long enough for eight clients on a busy 2-core machine to meet in one batch.
        "--triton-max-queue-delay-us",
        "20000",
    ]);
    let out = gmlp_ok(&argv);
    assert!(
        out.contains("max_batch_size 8, 6 implicit states of fixed size and the position"),
        "{out}"
    );
    let config = std::fs::read_to_string(repo.join("lm/config.pbtxt")).expect("config");
    assert!(
        config.contains("input [\n  {\n    name: \"input_ids\"\n    data_type: TYPE_INT64\n    dims: [ -1 ]\n  }\n]")
            && config.contains("input_name: \"position\"\n      output_name: \"triton_next_position\"")
            && config.contains("dims: [ 24, 32 ]\n        zero_data: true")
            && config.contains("max_queue_delay_microseconds: 20000"),
        "{config}"
    );
    assert_served_as_built_plus_the_counter(&model, &repo.join("lm/1/model.onnx"));
    // The served file is not a model to serve again.
    let again = dir.path().join("again");
    assert_refused(
        &[
            "triton",
            path_str(&repo.join("lm/1/model.onnx")),
            "--repo",
            path_str(&again),
        ],
        "already carries the Triton state adapter",
    );
    assert!(!again.exists());
    let server = Server::start(&env, &repo, dir.path().join("server-static.log"));
    let steps = 12;
    let report = client(
        &env,
        &[
            "static",
            &server.url(),
            "lm",
            path_str(&model),
            "--sequences",
            "8",
            "--steps",
            &steps.to_string(),
            "--prompt-min",
            "2",
            "--int-high",
            "50",
        ],
    );
    assert_no_errors(&report, &server);
    let max_rel = report["max_rel"].as_f64().expect("max_rel");
    assert!(max_rel <= REL_TOL, "static: rel {max_rel:.3e}: {report}");
    let inferences = report["inference_count"].as_u64().expect("count");
    let executions = report["execution_count"].as_u64().expect("count");
    assert_eq!(inferences, 8 * (1 + steps), "{report}");
    let batch_sizes: Vec<u64> = report["batch_sizes"]
        .as_array()
        .expect("batch sizes")
        .iter()
        .map(|b| b.as_u64().expect("size"))
        .collect();
    assert!(
        executions < inferences && batch_sizes.iter().any(|&b| b > 1),
        "no batched executions: {inferences} inferences in {executions} executions, batch sizes {batch_sizes:?}"
    );
    // Triton's own refusal of an input the configuration does not list.
    let refused = report["position_refused"].as_str().unwrap_or_default();
    assert!(
        refused.contains("expected 1 inputs but got 2") && refused.contains("'position'"),
        "a request with position was not refused as expected: {report}"
    );
    eprintln!("static: {report}");
}

/// Four concurrent sequences of `model`, served as `lm` by `server`, with prompts of 2 to 5
/// tokens and then six one-token steps each; the client's report (every answer against the
/// sequence's own ONNX Runtime run of `model`), checked to have no errors.
fn four_sequences_six_steps(env: &TritonEnv, server: &Server, model: &Path) -> serde_json::Value {
    let report = client(
        env,
        &[
            "static",
            &server.url(),
            "lm",
            path_str(model),
            "--sequences",
            "4",
            "--steps",
            "6",
            "--prompt-min",
            "2",
            "--int-high",
            "50",
        ],
    );
    assert_no_errors(&report, server);
    report
}

/// A `--target ort-gpu` static model (the step in ONNX Runtime's fused kernels, buffers that
/// must start zeroed: Triton's `initial_state` is `zero_data`) served the same way: four
/// concurrent sequences with prompts of different lengths, then one-token steps; every
/// answer equals the sequence's own ONNX Runtime run of the built file.
#[test]
fn an_ort_gpu_static_model_is_served_in_its_fused_step() {
    let env = triton_env();
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("amlp-ort-gpu.onnx");
    let repo = dir.path().join("repo-ort-gpu");
    let amlp = causal_amlp(24).args(&["--with-past", "--target", "ort-gpu"]);
    let mut argv = amlp.argv(&model);
    argv.extend(["--triton-repo", path_str(&repo), "--triton-name", "lm"]);
    gmlp_ok(&argv);
    let config = std::fs::read_to_string(repo.join("lm/config.pbtxt")).expect("config");
    assert!(config.contains("zero_data: true"), "{config}");
    let server = Server::start(&env, &repo, dir.path().join("server-ort-gpu.log"));
    let report = four_sequences_six_steps(&env, &server, &model);
    let max_rel = report["max_rel"].as_f64().expect("max_rel");
    assert!(max_rel <= REL_TOL, "ort-gpu: rel {max_rel:.3e}: {report}");
    assert_eq!(report["inference_count"].as_u64(), Some(4 * 7), "{report}");
}

/// An int4 model built with a plain `--with-past` (the static state, the default) served
/// with its nodes and weights as built (behind the position counter): four concurrent
/// sequences of different prompt lengths, every answer equal to the sequence's own ONNX
/// Runtime run of the built file (Triton's ONNX Runtime backend runs the
/// `com.microsoft.MatMulNBits` nodes, 4-bit and 8-bit).
#[test]
fn an_int4_with_past_model_is_served_with_its_weights_as_built() {
    let env = triton_env();
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("amlp-int4.onnx");
    let repo = dir.path().join("repo-int4");
    let amlp = Build::preset("amlp-base").args(&[
        "--layers",
        "2",
        "--d-model",
        "64",
        "--d-ffn",
        "256",
        "--attn-dim",
        "16",
        "--seq-len",
        "24",
        "--vocab-size",
        "50",
        "--causal",
        "--with-past",
        "--dtype",
        "int4",
        "--init",
        "spread",
    ]);
    let mut argv = amlp.argv(&model);
    argv.extend(["--triton-repo", path_str(&repo), "--triton-name", "lm"]);
    let out = gmlp_ok(&argv);
    assert!(
        out.contains("static state") && out.contains("max_batch_size 8"),
        "{out}"
    );
    assert_served_as_built_plus_the_counter(&model, &repo.join("lm/1/model.onnx"));
    let server = Server::start(&env, &repo, dir.path().join("server-int4.log"));
    let report = four_sequences_six_steps(&env, &server, &model);
    let max_rel = report["max_rel"].as_f64().expect("max_rel");
    assert!(
        max_rel <= REL_TOL,
        "int4 static: rel {max_rel:.3e}: {report}"
    );
    assert_eq!(
        report["inference_count"].as_u64(),
        Some(4 * (1 + 6)),
        "{report}"
    );
    eprintln!("int4 static: {report}");
}

/// The idle time of the load test's repository: long enough that no live sequence of a
/// busy 2-core machine waits that long between two requests, short enough to wait for.
const IDLE_S: u64 = 3;

/// The endpoint under load and faults (docs/serving.md, "Load and faults"): a static-state
/// repository with `max_batch_size` 8 and a 3 s idle time, clients sending `input_ids`
/// only. 64 concurrent sequences with prompts of 1 to 16 tokens, each decoding 32 tokens
/// one request at a time, 16 of them abandoned mid-way without the end flag; then 64 new
/// sequences that can only hold their slots together once the abandoned ones' slots are
/// back, after which the abandoned sequences are unknown to Triton; then the server killed
/// and restarted while 16 sequences decode (their later requests fail with Triton's own
/// error) and 16 new sequences served by the new server; last, a sequence started again on
/// its own id mid-way, which starts over. Every completed sequence's answers equal its own
/// whole-sequence ONNX Runtime run of the built file (tests/triton_client.py `endpoint`).
#[test]
fn the_endpoint_holds_up_under_load_abandoned_sequences_and_a_restart() {
    let env = triton_env();
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("lm.onnx");
    let repo = dir.path().join("repo");
    let idle_us = (IDLE_S * 1_000_000).to_string();
    let amlp = causal_amlp(48).args(&["--with-past", "-q"]);
    let mut argv = amlp.argv(&model);
    argv.extend([
        "--triton-repo",
        path_str(&repo),
        "--triton-name",
        "lm",
        "--triton-max-sequence-idle-us",
        &idle_us,
    ]);
    gmlp_ok(&argv);
    let config = std::fs::read_to_string(repo.join("lm/config.pbtxt")).expect("config");
    assert!(
        config.contains("max_batch_size: 8\n")
            && config.contains(&format!("max_sequence_idle_microseconds: {idle_us}\n"))
            && config.contains("max_candidate_sequences: 64\n"),
        "{config}"
    );
    let started = Instant::now();
    let mut server = Server::start(&env, &repo, dir.path().join("server.log"));
    let url = server.url();
    let idle_s = IDLE_S.to_string();
    let report = client_with_restarts(
        &env,
        &[
            "endpoint",
            &url,
            "lm",
            path_str(&model),
            "--sequences",
            "64",
            "--steps",
            "32",
            "--prompt-max",
            "16",
            "--int-high",
            "50",
            "--idle-s",
            &idle_s,
        ],
        &mut server,
        &repo,
        dir.path(),
        Duration::from_secs(600),
    );
    assert_no_errors(&report, &server);
    let n = |path: &str| -> u64 {
        report
            .pointer(path)
            .and_then(|v| v.as_u64())
            .unwrap_or_else(|| panic!("{path} missing: {report}"))
    };
    // A: 64 sequences of mixed prompt lengths; a quarter abandoned, the rest completed.
    let lengths = report["prompt_lengths"].as_array().expect("lengths").len();
    assert!(lengths >= 8, "prompt lengths not mixed: {report}");
    assert_eq!((n("/a/completed"), n("/a/abandoned")), (48, 16), "{report}");
    // B: 64 sequences held slots together (the abandoned slots came back), all completed;
    // the abandoned sequences were then unknown to Triton.
    assert_eq!(n("/b/completed"), 64, "{report}");
    assert_eq!(n("/abandoned_forgotten"), 16, "{report}");
    // Sequences at different positions ran in shared executions of up to 8.
    let (inferences, executions) = (n("/a_b_inference_count"), n("/a_b_execution_count"));
    assert_eq!(inferences, n("/a_b_answers"), "{report}");
    assert!(executions < inferences, "{report}");
    let largest = report["a_b_batch_sizes"]
        .as_array()
        .and_then(|b| b.last())
        .and_then(|b| b.as_u64());
    assert_eq!(largest, Some(8), "{report}");
    // C: after the restart, every request of a sequence begun before it failed with
    // Triton's own error; the sequences held at step 8 were all lost.
    assert_eq!(n("/c/paused_lost"), 8, "{report}");
    assert_eq!(
        n("/c/running_lost") + n("/c/running_completed"),
        8,
        "{report}"
    );
    for message in report["c"]["lost_messages"].as_array().expect("messages") {
        let m = message.as_str().unwrap_or_default();
        assert!(
            m.contains("must specify the START flag on the first request of the sequence"),
            "{m}"
        );
    }
    // D: new sequences on the new server.
    assert_eq!(n("/d/completed"), 16, "{report}");
    // E: the start flag on an id in flight starts over: position 0, zero state (compared
    // with its own run below).
    assert_eq!(report["e"]["first_try"], "abandoned", "{report}");
    assert_eq!(n("/e/answers_before_start_again"), 5, "{report}");
    assert_eq!(report["e"]["again"], "completed", "{report}");
    // Every completed sequence equals its own run; so do the answers the others got.
    for key in ["max_rel_completed", "max_rel_other"] {
        let r = report[key].as_f64().expect(key);
        assert!(r <= REL_TOL, "{key} {r:.3e}: {report}");
    }
    eprintln!(
        "endpoint: {report}\n(server start, load and restart: {:.1} s)",
        started.elapsed().as_secs_f64()
    );
}

/// docs/serving.md's client loop, run as written (only the server's address replaced)
/// against a repository written from a seeded aMLP built with a plain `--with-past` and
/// one built `--with-past growing`: it prints the greedy tokens `gmlp-onnx generate`
/// prints for the same file and prompt.
#[test]
fn the_client_loop_of_the_serving_docs_runs_as_written() {
    let env = triton_env();
    let blocks = crate::common::doc_python_blocks("serving.md");
    assert_eq!(blocks.len(), 1, "the client loop");
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = dir.path().join("repo");
    let mut models = Vec::new();
    for (name, past) in [
        ("lm", &["--with-past"][..]),
        ("lm-growing", &["--with-past", "growing"]),
    ] {
        let model = dir.path().join(format!("{name}.onnx"));
        let amlp = Build::amlp(2, Amlp::Medium)
            .args(&["--causal", "--seed", "5"])
            .args(past)
            .args(&["-q"]);
        let mut argv = amlp.argv(&model);
        argv.extend(["--triton-repo", path_str(&repo), "--triton-name", name]);
        gmlp_ok(&argv);
        models.push((name, model));
    }
    let server = Server::start(&env, &repo, dir.path().join("server.log"));
    for (name, model) in &models {
        let script = blocks[0]
            .replace("127.0.0.1:8000", &server.url())
            .replace("client.infer(\"lm\"", &format!("client.infer(\"{name}\""));
        let o = Command::new(&env.python)
            .arg("-c")
            .arg(&script)
            .output()
            .expect("run the docs' client loop");
        assert!(o.status.success(), "{script}\n{}", output_text(&o));
        let printed = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let generate = gmlp(&[
            "generate",
            path_str(model),
            "--runtime",
            "ort-cpu",
            "--prompt-ids",
            "80,101,114",
            "--max-new-tokens",
            "16",
            "--json",
            "-q",
        ]);
        assert!(generate.status.success(), "{}", output_text(&generate));
        let v: serde_json::Value = serde_json::from_slice(&generate.stdout).expect("json");
        let expected: Vec<i64> = serde_json::from_value(v[0]["tokens"].clone()).expect("tokens");
        let mut distinct = expected.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() >= 5, "a varied continuation: {expected:?}");
        let expected_text = format!(
            "[{}]",
            expected
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert_eq!(printed, expected_text, "{name}");
    }
}

#[test]
fn bad_repositories_names_and_types_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = small_vision_model(dir.path());
    let repo = dir.path().join("repo");
    let m = path_str(&model);
    let r = path_str(&repo);

    // Names Triton would skip or that break URLs; version 0.
    for name in [".hidden", "a/b", "with space", "", "--x"] {
        assert_refused(
            &["triton", m, "--repo", r, &format!("--triton-name={name}")],
            "Triton model name",
        );
    }
    assert_refused(
        &["triton", m, "--repo", r, "--triton-version", "0"],
        "--triton-version",
    );
    assert_refused(
        &["triton", m, "--repo", r, "--triton-tensorrt", "fp16"],
        "--triton-kind gpu",
    );
    assert!(
        !repo.exists(),
        "a refused command created {}",
        repo.display()
    );

    // An existing non-empty version directory.
    std::fs::create_dir_all(repo.join("v/1")).expect("mkdir");
    std::fs::write(repo.join("v/1/keep.txt"), b"user data").expect("write");
    let before = tree(&repo);
    assert_refused(
        &["triton", m, "--repo", r, "--triton-name", "v"],
        "not empty",
    );
    // `build` checks before it builds: no -o file either.
    let out = dir.path().join("never.onnx");
    assert_refused(
        &[
            "build",
            "--preset",
            "gmlp-ti16",
            "--layers",
            "1",
            "--image-size",
            "32",
            "-q",
            "-o",
            path_str(&out),
            "--triton-repo",
            r,
            "--triton-name",
            "v",
        ],
        "not empty",
    );
    assert!(!out.exists());
    assert_eq!(tree(&repo), before);

    // A type Triton's ONNX Runtime backend cannot carry (a bfloat16 input).
    let bf16 = dir.path().join("bf16.onnx");
    write_bf16_identity(&bf16);
    assert_refused(&["triton", path_str(&bf16), "--repo", r], "cannot carry");
    assert_eq!(tree(&repo), before);

    // A fixed batch dimension with batching on.
    let fixed = dir.path().join("fixed.onnx");
    write_identity(&fixed, 1, &[Some(1), Some(4)]);
    assert_refused(
        &["triton", path_str(&fixed), "--repo", r],
        "--triton-max-batch-size 0",
    );
    assert_eq!(tree(&repo), before);
    gmlp_ok(&[
        "triton",
        path_str(&fixed),
        "--repo",
        r,
        "--triton-max-batch-size",
        "0",
    ]);
    let config = std::fs::read_to_string(repo.join("fixed/config.pbtxt")).expect("config");
    assert!(
        config.contains("dims: [ 1, 4 ]") && !config.contains("dynamic_batching"),
        "{config}"
    );

    // Triton flags without --triton-repo.
    assert_refused(
        &[
            "build",
            "--preset",
            "gmlp-ti16",
            "-q",
            "-o",
            path_str(&out),
            "--triton-name",
            "x",
        ],
        "applies to --triton-repo",
    );
    assert!(!out.exists());

    // A second version beside the first keeps the identical config; a different model
    // under the same name is refused.
    gmlp_ok(&["triton", m, "--repo", r, "--triton-name", "vision"]);
    gmlp_ok(&[
        "triton",
        m,
        "--repo",
        r,
        "--triton-name",
        "vision",
        "--triton-version",
        "2",
    ]);
    assert!(repo.join("vision/2/model.onnx").is_file());
    let before = tree(&repo);
    assert_refused(
        &[
            "triton",
            path_str(&fixed),
            "--repo",
            r,
            "--triton-name",
            "vision",
            "--triton-version",
            "3",
            "--triton-max-batch-size",
            "0",
        ],
        "describes the model differently",
    );
    assert_eq!(tree(&repo), before);
}

/// A one-node Identity model `x → y` with element type `elem_type` and the given dims
/// (`None`: a symbolic dimension), written with the crate's own ONNX types.
fn write_identity(path: &Path, elem_type: i32, dims: &[Option<i64>]) {
    use gmlp_onnx::onnx::proto as onnx;
    use onnx::tensor_shape_proto::{dimension::Value as DimValue, Dimension};
    use prost::Message;
    let value = |name: &str| onnx::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(onnx::TypeProto {
            value: Some(onnx::type_proto::Value::TensorType(
                onnx::type_proto::Tensor {
                    elem_type: Some(elem_type),
                    shape: Some(onnx::TensorShapeProto {
                        dim: dims
                            .iter()
                            .map(|d| Dimension {
                                value: Some(match d {
                                    Some(n) => DimValue::DimValue(*n),
                                    None => DimValue::DimParam("batch".into()),
                                }),
                                ..Default::default()
                            })
                            .collect(),
                    }),
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    };
    let model = onnx::ModelProto {
        ir_version: Some(8),
        opset_import: vec![onnx::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(onnx::GraphProto {
            name: Some("identity".into()),
            node: vec![onnx::NodeProto {
                op_type: Some("Identity".into()),
                input: vec!["x".into()],
                output: vec!["y".into()],
                ..Default::default()
            }],
            input: vec![value("x")],
            output: vec![value("y")],
            ..Default::default()
        }),
        ..Default::default()
    };
    std::fs::write(path, model.encode_to_vec()).expect("write model");
}

fn write_bf16_identity(path: &Path) {
    write_identity(path, 16, &[None, Some(4)]);
}
