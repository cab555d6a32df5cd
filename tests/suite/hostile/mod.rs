//! Hostile and broken inputs (docs/reliability.md). Every case runs the real binary under a
//! time limit and asserts: the documented non-zero exit code, one line on stderr that starts
//! with `gmlp-onnx: error:` and names the problem, no panic, no hang, and no file left behind
//! in the output directory (neither the output nor a temporary file).

mod bombs;
mod checkpoints;
mod cli_args;
mod generation;
mod models;
mod outputs;
mod pytorch;
mod replay;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longest any refusal may take; a run past it counts as a hang.
const HANG_LIMIT: Duration = Duration::from_secs(120);

/// Runs `gmlp-onnx ARGS`, killing it (and failing the test) if it outlives `limit`.
pub fn run_limited(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gmlp-onnx"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gmlp-onnx");
    fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    }
    let stdout = drain(child.stdout.take().expect("stdout"));
    let stderr = drain(child.stderr.take().expect("stderr"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gmlp-onnx {args:?} hung: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (stdout, stderr) = (
        stdout.join().expect("stdout"),
        stderr.join().expect("stderr"),
    );
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Names of the entries of `dir`.
pub fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

/// Asserts that a finished run was refused: exit `code`, one stderr line starting with
/// `gmlp-onnx: error:` that contains `needle`, no panic.
pub fn assert_refusal(o: &Output, code: i32, needle: &str, what: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(code),
        "{what}: exit code; stderr: {err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("internal error"),
        "{what}: panic: {err}"
    );
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), 1, "{what}: one line expected: {err}");
    assert!(
        lines[0].starts_with("gmlp-onnx: error: "),
        "{what}: not an error line: {err}"
    );
    assert!(
        err.contains(needle),
        "{what}: expected '{needle}' in: {err}"
    );
}

/// Runs `gmlp-onnx ARGS` and asserts a refusal (see [`assert_refusal`]) that leaves `dir`
/// exactly as it was: no output and no temporary file.
pub fn assert_refused(dir: &Path, args: &[&str], code: i32, needle: &str) {
    let before = listing(dir);
    let o = run_limited(args, HANG_LIMIT);
    assert_refusal(&o, code, needle, &format!("{args:?}"));
    assert_eq!(listing(dir), before, "{args:?} left files behind");
}

/// Writes `bytes` to `dir/name` and returns the path.
pub fn file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write test input");
    path
}

/// A path as `&str` for command lines.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}
