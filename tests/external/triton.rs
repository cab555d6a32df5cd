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
//! growing state, static state batched, refusals).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{gmlp, output_text, path_str, small_token_model, small_vision_model};

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
    http_port: u16,
    log: PathBuf,
}

impl Server {
    fn url(&self) -> String {
        format!("127.0.0.1:{}", self.http_port)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Starts tritonserver on `repo` (absolute path) and waits (bounded) until it is ready.
    fn start(env: &TritonEnv, repo: &Path, log: PathBuf) -> Server {
        let [http, grpc, metrics] = free_ports();
        let log_file = std::fs::File::create(&log).expect("create server log");
        let child = Command::new(&env.server)
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
            .expect("start tritonserver");
        let mut server = Server {
            child,
            http_port: http,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "tritonserver exited ({status}) before it was ready:\n{}",
                    server.log_tail()
                );
            }
            if http_status(http, "/v2/health/ready") == Some(200) {
                return server;
            }
            assert!(
                Instant::now() < deadline,
                "tritonserver not ready after 90 s:\n{}",
                server.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
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

fn gmlp_ok(args: &[&str]) -> String {
    let o = gmlp(args);
    assert!(
        o.status.success(),
        "gmlp-onnx {args:?}: {}",
        output_text(&o)
    );
    output_text(&o)
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
#[cfg_attr(
    not(feature = "test-triton"),
    ignore = "needs a Triton server: scripts/test"
)]
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
    gmlp_ok(&[
        "build",
        "--preset",
        "amlp-base",
        "--layers",
        "1",
        "--seq-len",
        "32",
        "--vocab-size",
        "300",
        "--init",
        "spread",
        "--external-data",
        "-q",
        "-o",
        path_str(&token),
        "--triton-repo",
        path_str(&repo),
        "--triton-name",
        "amlp",
        "--triton-max-queue-delay-us",
        delay,
    ]);
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
/// run of the original model. Takes any model with the with-past interface (input_ids
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
#[cfg_attr(
    not(feature = "test-triton"),
    ignore = "needs a Triton server: scripts/test"
)]
fn with_past_single_token_requests_reproduce_the_whole_sequence() {
    let env = triton_env();
    let dir = tempfile::tempdir().expect("tempdir");
    let toy = dir.path().join("toy-with-past.onnx");
    client(&env, &["toy-with-past", path_str(&toy), "--vocab", "11"]);
    check_with_past_model(&env, &toy, 11, dir.path());
    // And a real one from `build --with-past growing`: a causal aMLP (heads 1, Toeplitz gather),
    // 2 blocks, n = 16 (48 steps of one token fill 4 sequences of 12).
    let real = dir.path().join("amlp-with-past.onnx");
    gmlp_ok(&[
        "build",
        "--preset",
        "amlp-base",
        "--layers",
        "2",
        "--d-model",
        "32",
        "--d-ffn",
        "64",
        "--attn-dim",
        "8",
        "--seq-len",
        "16",
        "--vocab-size",
        "50",
        "--causal",
        "--with-past",
        "growing",
        "--init",
        "spread",
        "-o",
        path_str(&real),
    ]);
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

/// A static-state model (`build --with-past`, docs/static-state.md) served with
/// max_batch_size 8: eight concurrent sequences with prompts of different lengths (2 to
/// 9 tokens), then one-token steps in lock step. Every answer equals the sequence's own
/// ONNX Runtime run, and Triton's statistics show executions of several sequences at
/// different positions at once.
#[test]
fn static_state_sequences_at_different_positions_batch_together() {
    let env = triton_env();
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("amlp-static.onnx");
    let repo = dir.path().join("repo-static");
    let out = gmlp_ok(&[
        "build",
        "--preset",
        "amlp-base",
        "--layers",
        "2",
        "--d-model",
        "32",
        "--d-ffn",
        "64",
        "--attn-dim",
        "8",
        "--seq-len",
        "24",
        "--vocab-size",
        "50",
        "--causal",
        "--with-past",
        "static",
        "--init",
        "spread",
        "-o",
        path_str(&model),
        "--triton-repo",
        path_str(&repo),
        "--triton-name",
        "lm",
        // Long enough for eight clients on a busy 2-core machine to meet in one batch.
        "--triton-max-queue-delay-us",
        "20000",
    ]);
    assert!(
        out.contains("max_batch_size 8, 6 implicit states of fixed size"),
        "{out}"
    );
    let config = std::fs::read_to_string(repo.join("lm/config.pbtxt")).expect("config");
    assert!(
        config.contains("name: \"position\"\n    data_type: TYPE_INT64\n    dims: [ 1 ]\n    reshape: { shape: [ ] }")
            && config.contains("dims: [ 24, 32 ]\n        zero_data: true")
            && config.contains("max_queue_delay_microseconds: 20000"),
        "{config}"
    );
    // Served as built: no adapter.
    assert_eq!(
        std::fs::read(&model).expect("model"),
        std::fs::read(repo.join("lm/1/model.onnx")).expect("served model")
    );
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
    eprintln!("static: {report}");
}

/// An int4 model built with a plain `--with-past` (the static state, the default) served
/// as built: four concurrent sequences of different prompt lengths, every answer equal to
/// the sequence's own ONNX Runtime run of the same file (Triton's ONNX Runtime backend runs
/// the `com.microsoft.MatMulNBits` nodes, 4-bit and 8-bit).
#[test]
fn an_int4_with_past_model_is_served_as_built() {
    let env = triton_env();
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("amlp-int4.onnx");
    let repo = dir.path().join("repo-int4");
    let out = gmlp_ok(&[
        "build",
        "--preset",
        "amlp-base",
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
        "-o",
        path_str(&model),
        "--triton-repo",
        path_str(&repo),
        "--triton-name",
        "lm",
    ]);
    assert!(
        out.contains("static state") && out.contains("max_batch_size 8"),
        "{out}"
    );
    let server = Server::start(&env, &repo, dir.path().join("server-int4.log"));
    let report = client(
        &env,
        &[
            "static",
            &server.url(),
            "lm",
            path_str(&model),
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
    assert_no_errors(&report, &server);
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

/// Every file and folder under `dir`, for "nothing was written" checks.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            out.push(e.path());
            out.extend(tree(&e.path()));
        }
    }
    out.sort();
    out
}

fn assert_refused(args: &[&str], expected: &str) {
    let o = gmlp(args);
    let text = output_text(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {text}");
    assert!(text.contains(expected), "{args:?}: {text}");
    assert_eq!(text.trim().lines().count(), 1, "one line: {text}");
    assert!(text.starts_with("gmlp-onnx: error: "), "{text}");
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
