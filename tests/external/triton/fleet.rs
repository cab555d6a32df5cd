//! Several servers behind the router: three tritonservers serving one repository written
//! by `gmlp-onnx triton --servers ... --router-config`, haproxy running that
//! configuration, and `generate --server` through it, 32 sequences at once, all on
//! 127.0.0.1. Three phases on one fleet: all servers up (every sequence on one server, all
//! three serving), one server SIGKILLed mid-run (every sequence completes, restarts only on
//! the lost server's), one SIGSTOPped mid-run and SIGCONTed once its sequences have
//! started again elsewhere (none continues a stale state). In every phase the tokens equal
//! those of `generate FILE` (ONNX Runtime in-process) for every sequence. Waits are bounded
//! and driven by Triton's statistics, the router's answers and the client's own notes.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::{causal_amlp, free_ports, gmlp_ok, http_status, triton_env, Server, TritonEnv};
use crate::common::{gmlp, output_text, path_str};

/// Sequences per run (the issue asks for at least 24 at once).
const SEQUENCES: usize = 32;
/// New tokens per sequence; prompts are 1 to 16 tokens and n is 48.
const NEW_TOKENS: usize = 32;

/// haproxy running a configuration, killed when dropped.
struct Router {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Router {
    fn start(config: &Path, port: u16, log: PathBuf) -> Router {
        let check = Command::new("haproxy")
            .args(["-c", "-f", path_str(config)])
            .output()
            .expect("haproxy is missing (apt-get install haproxy)");
        assert!(
            check.status.success(),
            "haproxy -c refuses the written configuration: {}",
            output_text(&check)
        );
        let out = std::fs::File::create(&log).expect("router log");
        let child = Command::new("haproxy")
            .args(["-db", "-f", path_str(config)])
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("router log"))
            .stderr(out)
            .spawn()
            .expect("start haproxy");
        let mut router = Router { child, port, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_status(port, "/v2/health/ready") != Some(200) {
            if let Ok(Some(status)) = router.child.try_wait() {
                panic!("haproxy exited ({status}): {}", router.log_text());
            }
            assert!(Instant::now() < deadline, "router not ready: {}", router.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
        router
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server's `HOST:PORT`, as the router names it in its answers.
fn address(server: &Server) -> String {
    format!("127.0.0.1:{}", server.ports[0])
}

/// The model's inference count on `server` (Triton's statistics endpoint).
fn inferences(server: &Server) -> u64 {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", server.ports[0])).expect("stats");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    use std::io::{Read, Write};
    write!(s, "GET /v2/models/lm/stats HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("stats");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("stats");
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).expect("stats JSON");
    v["model_stats"][0]["inference_count"]
        .as_u64()
        .unwrap_or_else(|| panic!("no inference_count: {v}"))
}

/// Sends a signal to a server (SIGKILL, SIGSTOP, SIGCONT) by its process id.
fn signal(server: &Server, name: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{name}"), &server.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success(), "kill -{name}");
}

/// `generate --server` running, its stderr lines arriving on a channel.
struct Client {
    child: Child,
    notes: Receiver<String>,
}

impl Client {
    fn start(router: &Router, prompts: &Path) -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gmlp-onnx"))
            .args(["generate", "--server", &router.url(), "--triton-name", "lm"])
            .args(["--prompts-file", path_str(prompts)])
            .args(["--max-new-tokens", &NEW_TOKENS.to_string(), "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run generate --server");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, notes) = channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                if tx.send(line.unwrap_or_default()).is_err() {
                    break;
                }
            }
        });
        Client { child, notes }
    }

    /// Waits (bounded) for the client's JSON report.
    fn finish(mut self, router: &Router) -> serde_json::Value {
        use std::io::Read;
        let mut stdout = self.child.stdout.take().expect("stdout");
        let deadline = Instant::now() + Duration::from_secs(180);
        while self.child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("generate --server still running after 180 s: {}", router.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut text = String::new();
        stdout.read_to_string(&mut text).expect("stdout");
        let status = self.child.wait().expect("wait");
        let notes: Vec<String> = self.notes.try_iter().collect();
        assert!(status.success(), "generate --server failed: {}\n{text}", notes.join("\n"));
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON report");
        v[0].clone()
    }

    /// Waits (bounded) for a note that a sequence starts again.
    fn wait_for_restart(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.notes.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.contains("starts again under a new sequence id") => return,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!("no sequence started again in 60 s"),
                Err(RecvTimeoutError::Disconnected) => panic!("the client ended without a restart"),
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (bounded) until `server` has answered `more` requests beyond `from`: the run is
/// under way on it.
fn wait_for_traffic(server: &Server, from: u64, more: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while inferences(server) < from + more {
        assert!(Instant::now() < deadline, "no traffic on {}", address(server));
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (bounded) until the router sends a sequence to `server` again (after a restart:
/// two good checks), probing with one-request sequences of new ids.
fn wait_routed_to(router: &Router, server: &Server) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let agent: ureq_free::Probe = ureq_free::Probe::new(router.port);
    for id in 1u64.. {
        if agent.served_by(id).as_deref() == Some(address(server).as_str()) {
            return;
        }
        assert!(Instant::now() < deadline, "router never came back to {}", address(server));
    }
}

/// A one-request sequence through the router, by hand (the tests do not link ureq).
mod ureq_free {
    use std::io::{Read, Write};
    use std::time::Duration;

    pub struct Probe(u16);

    impl Probe {
        pub fn new(port: u16) -> Probe {
            Probe(port)
        }

        /// The server that answered a one-token sequence with id `id` (start and end).
        pub fn served_by(&self, id: u64) -> Option<String> {
            let body = format!(
                r#"{{"inputs":[{{"name":"input_ids","shape":[1,1],"datatype":"INT64","data":[1]}}],"parameters":{{"sequence_id":{id},"sequence_start":true,"sequence_end":true}}}}"#
            );
            let mut s = std::net::TcpStream::connect(("127.0.0.1", self.0)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            write!(
                s,
                "POST /v2/models/lm/infer HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Sequence-Id: {id}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .ok()?;
            let mut text = String::new();
            s.read_to_string(&mut text).ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix("x-triton-server: ").or(l.strip_prefix("X-Triton-Server: ")))
                .map(|v| v.trim().to_string())
        }
    }
}

/// The local reference: `generate FILE --prompts-file` on ONNX Runtime in-process.
fn local_tokens(model: &Path, prompts: &Path) -> serde_json::Value {
    let out = gmlp_ok(&[
        "generate",
        path_str(model),
        "--prompts-file",
        path_str(prompts),
        "--max-new-tokens",
        &NEW_TOKENS.to_string(),
        "--json",
        "-q",
    ]);
    let start = out.find('[').expect("JSON");
    let v: serde_json::Value = serde_json::from_str(&out[start..]).expect("local JSON");
    v[0]["tokens"].clone()
}

/// The first server of each sequence, and its restarts.
fn placements(report: &serde_json::Value) -> Vec<(String, u64, usize)> {
    let servers = report["servers"].as_array().expect("servers");
    let restarts = report["restarts"].as_array().expect("restarts");
    servers
        .iter()
        .zip(restarts)
        .map(|(s, r)| {
            let list = s.as_array().expect("list");
            let first = list.first().and_then(|x| x.as_str()).unwrap_or_default();
            (first.to_string(), r.as_u64().expect("restarts"), list.len())
        })
        .collect()
}

struct Fleet {
    env: TritonEnv,
    repo: PathBuf,
    work: PathBuf,
    servers: Vec<Server>,
    router: Router,
}

impl Fleet {
    /// Three servers on free loopback ports, the repository and router configuration
    /// written by one `gmlp-onnx triton` call, haproxy started on it.
    fn start(work: &Path, model: &Path) -> Fleet {
        let env = triton_env();
        let repo = work.join("repo");
        let ports: Vec<[u16; 3]> = (0..3).map(|_| free_ports()).collect();
        let router_port = free_ports()[0];
        let list: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{}", p[0])).collect();
        let config = work.join("router.cfg");
        let out = gmlp_ok(&[
            "triton",
            path_str(model),
            "--repo",
            path_str(&repo),
            "--triton-name",
            "lm",
            "--servers",
            &list.join(","),
            "--router-config",
            path_str(&config),
            "--router-port",
            &router_port.to_string(),
        ]);
        assert!(out.contains("wrote router configuration"), "{out}");
        let mut servers: Vec<Server> = ports
            .iter()
            .enumerate()
            .map(|(k, p)| Server {
                child: Server::spawn(&env, &repo, &work.join(format!("s{k}.log")), *p),
                ports: *p,
                log: work.join(format!("s{k}.log")),
            })
            .collect();
        for s in &mut servers {
            s.wait_ready();
        }
        let router = Router::start(&config, router_port, work.join("router.log"));
        Fleet {
            env,
            repo,
            work: work.to_path_buf(),
            servers,
            router,
        }
    }
}

/// Every sequence's tokens equal the reference's.
fn assert_tokens(report: &serde_json::Value, reference: &serde_json::Value, phase: &str) {
    let got = report["tokens"].as_array().expect("tokens");
    let want = reference.as_array().expect("tokens");
    assert_eq!(got.len(), SEQUENCES, "{phase}");
    for (b, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "{phase}: sequence {b} differs from generate FILE: {report}");
    }
}

#[test]
fn a_fleet_behind_the_router_loses_a_server_and_no_sequence() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("lm.onnx");
    gmlp_ok(&causal_amlp(48).args(&["--with-past", "-q"]).argv(&model));
    let prompts = dir.path().join("prompts.txt");
    let lines: Vec<String> = (0..SEQUENCES)
        .map(|b| {
            let len = 1 + b % 16;
            let ids: Vec<String> = (0..len).map(|t| ((7 * b + 3 * t + 1) % 50).to_string()).collect();
            ids.join(",")
        })
        .collect();
    std::fs::write(&prompts, lines.join("\n")).expect("prompts");
    let reference = local_tokens(&model, &prompts);
    let started = Instant::now();
    let mut fleet = Fleet::start(dir.path(), &model);
    let fleet_ready = started.elapsed();

    // A model the servers lack: one line, non-zero exit.
    let o = gmlp(&["generate", "--server", &fleet.router.url(), "--triton-name", "nope", "--prompt-ids", "1"]);
    assert!(!o.status.success());
    let text = output_text(&o);
    assert_eq!(text.trim().lines().count(), 1, "{text}");
    assert!(text.contains("no model \"nope\"") && text.contains("--triton-name"), "{text}");

    // 1. All up: each sequence on one server, every server serving.
    let before: Vec<u64> = fleet.servers.iter().map(inferences).collect();
    let report = Client::start(&fleet.router, &prompts).finish(&fleet.router);
    assert_tokens(&report, &reference, "all up");
    let addresses: Vec<String> = fleet.servers.iter().map(address).collect();
    for (b, (first, restarts, count)) in placements(&report).into_iter().enumerate() {
        assert_eq!((restarts, count), (0, 1), "sequence {b} moved: {report}");
        assert!(addresses.contains(&first), "sequence {b} on {first}");
    }
    let served: Vec<u64> = fleet.servers.iter().zip(&before).map(|(s, b)| inferences(s) - b).collect();
    assert!(served.iter().all(|&n| n > 0), "a server got no traffic: {served:?}");
    assert_eq!(served.iter().sum::<u64>(), report["requests"].as_u64().expect("requests"));
    let phase1 = started.elapsed();

    // 2. SIGKILL one server once the run is under way on it.
    let victim = 0;
    let from = inferences(&fleet.servers[victim]);
    let client = Client::start(&fleet.router, &prompts);
    wait_for_traffic(&fleet.servers[victim], from, 40);
    signal(&fleet.servers[victim], "KILL");
    let report = client.finish(&fleet.router);
    assert_tokens(&report, &reference, "SIGKILL");
    let lost = address(&fleet.servers[victim]);
    let mut restarted = 0;
    for (b, (first, restarts, _)) in placements(&report).into_iter().enumerate() {
        if restarts > 0 {
            restarted += 1;
            assert_eq!(first, lost, "sequence {b} restarted but was not on the lost server: {report}");
        }
    }
    assert!(restarted > 0, "no sequence was on the lost server mid-run: {report}");
    eprintln!("SIGKILL: {restarted} sequences restarted");
    let phase2 = started.elapsed();

    // The lost server comes back on its ports; the router sends it sequences again.
    let server = &mut fleet.servers[victim];
    let log = fleet.work.join("s0-again.log");
    server.restart(&fleet.env, &fleet.repo, log);
    wait_routed_to(&fleet.router, &fleet.servers[victim]);

    // 3. SIGSTOP one server mid-run; SIGCONT it once a sequence has started again.
    let victim = 1;
    let from = inferences(&fleet.servers[victim]);
    let client = Client::start(&fleet.router, &prompts);
    wait_for_traffic(&fleet.servers[victim], from, 40);
    signal(&fleet.servers[victim], "STOP");
    client.wait_for_restart();
    signal(&fleet.servers[victim], "CONT");
    let report = client.finish(&fleet.router);
    assert_tokens(&report, &reference, "SIGSTOP/SIGCONT");
    let stopped = address(&fleet.servers[victim]);
    let moved = placements(&report).iter().filter(|(f, r, _)| *r > 0 && *f == stopped).count();
    assert!(moved > 0, "no sequence was on the stopped server: {report}");
    eprintln!(
        "fleet: ready in {:.1} s, all-up run by {:.1} s, SIGKILL run by {:.1} s, SIGSTOP run by {:.1} s ({moved} restarted)",
        fleet_ready.as_secs_f64(),
        phase1.as_secs_f64(),
        phase2.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
