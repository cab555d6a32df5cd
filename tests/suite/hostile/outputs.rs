//! Output safety: bad output paths, interrupts in the middle of a write (SIGINT, SIGTERM),
//! and byte-identical output whatever the thread count.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{assert_refused, listing, run_limited, s, HANG_LIMIT};
use crate::common::Build;

#[test]
fn bad_output_paths_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tiny = ["build", "--preset", "gmlp-ti16", "--layers", "1", "-o"];
    fn with<'a>(tiny: &[&'a str], out: &'a str) -> Vec<&'a str> {
        [tiny, &[out]].concat()
    }
    assert_refused(d, &with(&tiny, s(d)), 2, "is a directory");
    let missing = d.join("no/such/dir/m.onnx");
    assert_refused(d, &with(&tiny, s(&missing)), 2, "does not exist");
    assert_refused(d, &with(&tiny, ""), 2, "a value is required for '--output");
    let same = d.join("same.bin");
    let args = [&tiny[..], &[s(&same), "--save-weights", s(&same)]].concat();
    assert_refused(d, &args, 2, "the same file");
}

/// Starts a build big enough to be interrupted mid-write, waits until its temporary
/// external data file has grown, sends `signal`, and checks that nothing is left.
fn interrupt_a_build(signal: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("big.onnx");
    let build = Build::preset("amlp-base").args(&["--external-data"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_gmlp-onnx"))
        .args(build.argv(&out))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gmlp-onnx");
    let start = Instant::now();
    let writing = |d: &Path| {
        std::fs::read_dir(d)
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| {
                e.file_name().to_string_lossy().contains(".data.tmp-")
                    && e.metadata().map(|m| m.len() > 1 << 20).unwrap_or(false)
            })
    };
    while !writing(d) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the build ended before it could be interrupted"
        );
        assert!(
            start.elapsed() < HANG_LIMIT,
            "the build never started writing"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = child.id().to_string();
    let killed = Command::new("kill").args([signal, &pid]).status().unwrap();
    assert!(killed.success());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{signal}: {err}");
    assert!(
        err.contains("interrupted; removed 2 unfinished output file(s)"),
        "{err}"
    );
    assert!(listing(d).is_empty(), "{signal} left {:?}", listing(d));
}

#[test]
fn sigint_in_the_middle_of_a_write_leaves_no_file() {
    interrupt_a_build("-INT");
}

#[test]
fn sigterm_in_the_middle_of_a_write_leaves_no_file() {
    interrupt_a_build("-TERM");
}

/// The same arguments give byte-identical files (model and external data) whether the
/// process runs pinned to one CPU or may use all of them (the build is single-threaded by
/// design; this holds it to that). Precondition, checked: the machine has at least two CPUs
/// and `taskset -c 0` really restricts the process to one.
#[test]
fn builds_are_byte_identical_on_one_cpu_and_on_all() {
    let cpus = |pinned: bool| {
        let mut cmd = if pinned {
            let mut c = Command::new("taskset");
            c.args(["-c", "0", "nproc"]);
            c
        } else {
            Command::new("nproc")
        };
        let o = cmd
            .output()
            .expect("nproc and taskset (coreutils, util-linux)");
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<usize>()
            .unwrap()
    };
    assert_eq!(
        cpus(true),
        1,
        "taskset -c 0 did not pin the process to one CPU"
    );
    assert!(
        cpus(false) >= 2,
        "this test needs a machine with at least two CPUs"
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let build = Build::preset("amlp-base").args(&[
        "--layers",
        "2",
        "--seq-len",
        "64",
        "--external-data",
        "--init",
        "spread",
        "-q",
    ]);
    for sub in ["one", "all"] {
        std::fs::create_dir(d.join(sub)).unwrap();
    }
    let one_cpu = Command::new("taskset")
        .args(["-c", "0", env!("CARGO_BIN_EXE_gmlp-onnx")])
        .args(build.argv(&d.join("one/m.onnx")))
        .output()
        .expect("taskset (util-linux)");
    assert!(
        one_cpu.status.success(),
        "{}",
        String::from_utf8_lossy(&one_cpu.stderr)
    );
    let o = run_limited(&build.argv(&d.join("all/m.onnx")), HANG_LIMIT);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for name in ["m.onnx", "m.onnx.data"] {
        let a = std::fs::read(d.join("one").join(name)).unwrap();
        let b = std::fs::read(d.join("all").join(name)).unwrap();
        assert!(a.len() > 1000, "{name} is too small to mean anything");
        assert!(a == b, "{name} differs between one CPU and all CPUs");
    }
}
