//! `gmlp-onnx --version` names the commit the binary was built from (build/commit.rs, run
//! by build.rs): the short hash of HEAD, `-dirty` when the sources differed from it, or
//! "commit unknown" outside a git checkout. The last two are checked on repositories made
//! here, with the same code build.rs runs.

use std::path::Path;
use std::process::Command;

use crate::common::{gmlp, output_text};

#[path = "../../build/commit.rs"]
mod commit;

/// `git -C DIR ARGS` (git is needed: the checkout was made with it), its stdout trimmed.
fn git(dir: &Path, args: &[&str]) -> String {
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .output()
        .expect("run git");
    assert!(o.status.success(), "git {args:?}: {}", output_text(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn version_names_the_commit_the_binary_was_built_from() {
    let o = gmlp(&["--version"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let commit = commit::describe(root).unwrap_or_else(|| "commit unknown".into());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("gmlp-onnx {} ({commit})\n", env!("CARGO_PKG_VERSION"))
    );
    // In a checkout the hash is HEAD's, as git itself gives it.
    if commit != "commit unknown" {
        let head = git(root, &["rev-parse", "--short", "HEAD"]);
        assert!(commit.starts_with(&head), "{commit} vs HEAD {head}");
    }
}

#[test]
fn the_commit_is_heads_marked_dirty_by_changed_sources_and_unknown_outside_a_checkout() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::write(repo.join("src/lib.rs"), "// one\n").unwrap();
    std::fs::write(repo.join("README.md"), "one\n").unwrap();
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "one"]);
    let first = git(&repo, &["rev-parse", "--short", "HEAD"]);
    assert_eq!(commit::describe(&repo), Some(first.clone()));

    // A document changed: not a source of the binary.
    std::fs::write(repo.join("README.md"), "two\n").unwrap();
    assert_eq!(commit::describe(&repo), Some(first.clone()));
    // A source changed, staged or not: dirty.
    std::fs::write(repo.join("src/lib.rs"), "// two\n").unwrap();
    assert_eq!(commit::describe(&repo), Some(format!("{first}-dirty")));
    git(&repo, &["add", "src/lib.rs"]);
    assert_eq!(commit::describe(&repo), Some(format!("{first}-dirty")));
    // Committed: the new HEAD, clean.
    git(&repo, &["commit", "-q", "-am", "two"]);
    let second = git(&repo, &["rev-parse", "--short", "HEAD"]);
    assert_ne!(first, second);
    assert_eq!(commit::describe(&repo), Some(second));

    // build.rs reruns on HEAD's moves and on source changes.
    let watched = commit::watched(&repo);
    for needed in [
        repo.join("src"),
        repo.join(".git/HEAD"),
        repo.join(".git/logs/HEAD"),
    ] {
        assert!(watched.contains(&needed), "{needed:?} not in {watched:?}");
    }

    // A folder that is not the top of a checkout (a tarball unpacked inside another
    // repository) and one outside any checkout (a pip sdist).
    std::fs::create_dir(repo.join("vendored")).unwrap();
    assert_eq!(commit::describe(&repo.join("vendored")), None);
    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    assert_eq!(commit::describe(&plain), None);
    assert_eq!(commit::watched(&plain), Vec::<std::path::PathBuf>::new());
}
