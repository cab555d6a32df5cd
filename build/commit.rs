//! The commit a build is made from, for `gmlp-onnx --version`: build.rs's part, in a file
//! of its own so that tests/suite/version.rs runs it on repositories it makes.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the binary is built from, relative to the repository root: a change to any of
/// them since the commit marks the build `-dirty` (tests and documents do not).
pub const SOURCES: [&str; 6] = [
    "src",
    "build.rs",
    "build",
    "Cargo.toml",
    "Cargo.lock",
    "proto",
];

/// `git -C DIR ARGS`'s standard output, trimmed; `None` when git is missing or fails. The
/// variables that point git elsewhere (set inside git hooks) are removed.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .arg("--no-optional-locks")
        .args(args)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The short hash of HEAD, with `-dirty` after it when a file of [`SOURCES`] differs from
/// HEAD; `None` when `dir` is not the top of a git checkout (a source tarball, a pip
/// sdist, a copy inside another repository) or git is missing.
pub fn describe(dir: &Path) -> Option<String> {
    let top = git(dir, &["rev-parse", "--show-toplevel"])?;
    if Path::new(&top).canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    let hash = git(dir, &["rev-parse", "--short", "HEAD"])?;
    let mut status = vec!["status", "--porcelain", "--untracked-files=no", "--"];
    status.extend(SOURCES);
    let changed = git(dir, &status)?;
    Some(if changed.is_empty() {
        hash
    } else {
        format!("{hash}-dirty")
    })
}

/// The files whose change can change [`describe`]'s answer (HEAD, its log, the branch
/// HEAD names, the packed refs, and [`SOURCES`]), those that exist: build.rs reruns
/// when one changes.
pub fn watched(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    if describe(dir).is_some() {
        let mut refs = vec!["HEAD".to_string(), "logs/HEAD".into(), "packed-refs".into()];
        refs.extend(git(dir, &["symbolic-ref", "-q", "HEAD"]));
        for name in refs {
            if let Some(path) = git(dir, &["rev-parse", "--git-path", &name]) {
                files.push(dir.join(path));
            }
        }
    }
    files.extend(SOURCES.iter().map(|s| dir.join(s)));
    files.retain(|f| f.exists());
    files
}
