//! The documentation holds together: every relative link in README.md, BENCHMARKS.md and
//! docs/*.md points at a file that exists (and, into a Markdown file, at a heading that
//! exists, by GitHub's anchor rule); README.md stays a short front page that links every
//! page of docs/; every repository path a document, source comment, test or script names
//! (`tests/suite/docs.rs`, `fuzz/corpus/`) exists; and no source, test, script or document
//! cites a text a reader of the repository does not have (the project's issue tracker, or
//! a specification outside the repository) — they cite the paper, the upstream sources, or
//! docs/design.md.
//!
//! docs/cli.md's freshness is checked where the command-line definitions live
//! (src/cli/reference.rs, a unit test of the binary).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// README.md's length limit: the front page, not the manual.
const README_MAX_LINES: usize = 200;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files whose links are checked: README.md, BENCHMARKS.md, docs/*.md.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md"), root().join("BENCHMARKS.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    files
}

/// GitHub's anchor for a heading's text: lower case, punctuation and symbols removed
/// (letters, digits, `-` and `_` kept), each space a `-`.
fn slug(heading: &str) -> String {
    heading
        .chars()
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// What one Markdown file holds: the destinations of its links and images, and the
/// anchors of its headings (a repeated heading gets `-1`, `-2`, ... as on GitHub).
struct Page {
    links: Vec<String>,
    anchors: BTreeSet<String>,
}

fn parse(text: &str) -> Page {
    let mut links = Vec::new();
    let mut anchors = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut heading: Option<String> = None;
    for event in Parser::new_ext(text, Options::ENABLE_TABLES) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap_or_default());
                let n = seen.entry(base.clone()).or_insert(0);
                anchors.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => links.push(dest_url.to_string()),
            _ => {}
        }
    }
    Page { links, anchors }
}

fn is_external(link: &str) -> bool {
    link.contains("://") || link.starts_with("mailto:")
}

/// Every broken relative link of `file`, as `file: link (why)`.
fn broken_links(file: &Path, pages: &mut BTreeMap<PathBuf, Page>) -> Vec<String> {
    let rel = |p: &Path| p.strip_prefix(root()).unwrap_or(p).display().to_string();
    let page = pages.entry(file.to_path_buf()).or_insert_with(|| {
        parse(&std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display())))
    });
    let links: Vec<String> = page
        .links
        .iter()
        .filter(|l| !is_external(l))
        .cloned()
        .collect();
    let mut broken = Vec::new();
    for link in links {
        let (path, anchor) = match link.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (link.as_str(), None),
        };
        let target = if path.is_empty() {
            file.to_path_buf()
        } else {
            file.parent().expect("a file has a folder").join(path)
        };
        if !target.exists() {
            broken.push(format!("{}: {link} (no such file)", rel(file)));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if target.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let target = target.canonicalize().expect("an existing file has a path");
        let page = pages.entry(target.clone()).or_insert_with(|| {
            parse(&std::fs::read_to_string(&target).expect("read a linked page"))
        });
        if !page.anchors.contains(anchor) {
            broken.push(format!(
                "{}: {link} (no heading with anchor #{anchor} in {})",
                rel(file),
                rel(&target)
            ));
        }
    }
    broken
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("Opsets and IR versions"), "opsets-and-ir-versions");
    assert_eq!(slug("int8 (--dtype int8)"), "int8---dtype-int8");
    assert_eq!(
        slug("CPU speed: the f32 graph before/after, and int8"),
        "cpu-speed-the-f32-graph-beforeafter-and-int8"
    );
    assert_eq!(slug("gmlp-onnx build"), "gmlp-onnx-build");
    assert_eq!(slug("int8 vs quantize_dynamic"), "int8-vs-quantize_dynamic");
    let page = parse("# A\n\n## `x` y\n\n## A\n\n[t](#a-1)\n\n| c |\n|---|\n| [u](b.md#c) |\n");
    assert_eq!(
        page.anchors.iter().map(String::as_str).collect::<Vec<_>>(),
        ["a", "a-1", "x-y"]
    );
    assert_eq!(page.links, ["#a-1", "b.md#c"]);
}

#[test]
fn relative_links_resolve() {
    let mut pages = BTreeMap::new();
    let mut broken = Vec::new();
    let docs = documents();
    assert!(docs.len() > 5, "docs/ has its pages: {docs:?}");
    for file in &docs {
        let file = file.canonicalize().expect("a listed document exists");
        broken.extend(broken_links(&file, &mut pages));
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn readme_is_a_front_page_that_reaches_every_doc() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("read README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines (at most {README_MAX_LINES}): put the detail in a page of docs/ and link it from \"Read on\""
    );
    let links: BTreeSet<String> = parse(&readme)
        .links
        .into_iter()
        .map(|l| l.split('#').next().unwrap_or_default().to_string())
        .collect();
    let unlinked: Vec<String> = documents()
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("docs")))
        .filter_map(|p| {
            p.file_name()
                .map(|n| format!("docs/{}", n.to_string_lossy()))
        })
        .filter(|l| l != "docs/README.md" && !links.contains(l))
        .collect();
    assert!(
        unlinked.is_empty(),
        "README.md does not link these pages of docs/ (add them to \"Read on\"): {unlinked:?}"
    );
}

/// Text files under `dir`, skipping build outputs, installed packages and fuzz inputs.
fn text_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            let skip = [
                "target",
                "node_modules",
                "corpus",
                "regressions",
                "artifacts",
                ".venv",
            ];
            if !skip.contains(&name.as_str()) && !name.starts_with('.') {
                text_files(&path, out);
            }
        } else if let Ok(text) = std::fs::read(&path) {
            if !text.contains(&0) {
                out.push(path);
            }
        }
    }
}

/// Where `line` cites the issue tracker (the word followed by a number, with a space, `#`
/// or `-` between) or the specification outside the repository (its section sign or file
/// name).
fn outside_citation(line: &str) -> Option<&'static str> {
    let lower = line.to_lowercase();
    let mut rest = lower.as_str();
    while let Some(at) = rest.find("issue") {
        let after = rest[at + "issue".len()..].trim_start_matches([' ', '-', '#']);
        if after.starts_with(|c: char| c.is_ascii_digit()) {
            return Some("an issue number");
        }
        rest = &rest[at + "issue".len()..];
    }
    // Spelled in two parts so that this file does not match itself.
    let spec = ["SPEC", " §"].concat();
    let spec_file = ["SPEC", ".md"].concat();
    if line.contains(&spec) || line.contains(&spec_file) {
        return Some("the specification outside the repository");
    }
    None
}

/// The repository's own text: sources, tests, scripts, documents and the files at the top
/// (not proto/onnx.proto, a copy of the ONNX project's file that names its own paths).
fn own_text_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in [
        "src", "tests", "bench", "scripts", "fuzz", "examples", "docs", ".ci", "fixtures",
        "bindings",
    ] {
        text_files(&root().join(dir), &mut files);
    }
    for file in [
        "README.md",
        "BENCHMARKS.md",
        "CHANGELOG.md",
        "build.rs",
        "Cargo.toml",
        "pyproject.toml",
    ] {
        files.push(root().join(file));
    }
    files
}

#[test]
fn nothing_cites_a_text_outside_the_repository() {
    let files = own_text_files();
    let mut found = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            if let Some(what) = outside_citation(line) {
                found.push(format!(
                    "{}:{}: cites {what}: {}",
                    file.strip_prefix(root()).unwrap_or(file).display(),
                    i + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "cite the paper, the upstream source or docs/design.md instead:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_citation_check_can_fail() {
    // Spelled in parts so that this file does not match itself.
    let issue = "iss".to_string() + "ue";
    assert!(outside_citation(&format!("//! Causal models ({issue} 11): ...")).is_some());
    assert!(outside_citation(&format!("# the {issue}-13 acceptance point")).is_some());
    assert!(outside_citation(&format!("see {issue} #4")).is_some());
    assert!(outside_citation(&["(", "SPEC", " §6)"].concat()).is_some());
    assert!(outside_citation(&["see ", "SPEC", ".md"].concat()).is_some());
    assert!(outside_citation("a known issue with OpenCV").is_none());
    assert!(outside_citation("paper §4 and appendix C").is_none());
}

/// The repository paths `line` names: each word that starts with one of `folders` (the
/// repository's top-level folders) and a `/`, as `tests/suite/docs.rs` or `fuzz/corpus/`.
/// Not counted: a path inside a longer one or a URL (`ggml/src/…`), a shell variable's
/// (`$dir/src/…`), another project's (`onnxruntime's docs/…`), and patterns with a
/// placeholder (`fixtures/NAME/meta.json`, `tests/suite/*.rs`, `fuzz/corpus/<target>`).
fn named_paths<'a>(line: &'a str, folders: &[String]) -> Vec<&'a str> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    let mut found = Vec::new();
    for (at, _) in line.char_indices() {
        let before = &line[..at];
        if before.ends_with(|c: char| is_path_char(c) || "$~\\".contains(c))
            || before.ends_with("'s ")
        {
            continue;
        }
        let rest = &line[at..];
        if !folders
            .iter()
            .any(|f| rest.starts_with(f.as_str()) && rest[f.len()..].starts_with('/'))
        {
            continue;
        }
        let end = rest.find(|c: char| !is_path_char(c)).unwrap_or(rest.len());
        let path = rest[..end].trim_end_matches(['.', '-']);
        let next = rest[end..].chars().next();
        let placeholder = path.split('/').any(|part| {
            part.len() > 1
                && part.contains(|c: char| c.is_ascii_uppercase())
                && part
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        });
        if placeholder || next.is_some_and(|c| "*<{$…".contains(c)) {
            continue;
        }
        found.push(path);
    }
    found
}

/// The repository's top-level folders.
fn top_folders() -> Vec<String> {
    let skip = ["target", ".git", ".venv", "node_modules", "proto"];
    let mut folders: Vec<String> = std::fs::read_dir(root())
        .expect("read the repository root")
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !skip.contains(&name.as_str()) && !name.starts_with(".venv"))
        .collect();
    folders.sort();
    folders
}

#[test]
fn every_repository_path_named_exists() {
    let folders = top_folders();
    assert!(
        folders.iter().any(|f| f == "tests") && folders.iter().any(|f| f == ".ci"),
        "{folders:?}"
    );
    let mut missing = Vec::new();
    let mut checked = 0;
    for file in own_text_files() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            for path in named_paths(line, &folders) {
                checked += 1;
                if !root().join(path).exists() {
                    missing.push(format!(
                        "{}:{}: {path}",
                        file.strip_prefix(root()).unwrap_or(&file).display(),
                        i + 1
                    ));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} paths found: the scan is broken"
    );
    assert!(
        missing.is_empty(),
        "paths named but not in the repository (moved or removed?):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_path_scan_finds_paths_and_skips_the_rest() {
    let folders = ["tests".to_string(), "src".to_string(), "fuzz".to_string()];
    assert_eq!(
        named_paths(
            "see tests/suite/docs.rs, (src/cli/) and `fuzz/corpus/onnx_reader`.",
            &folders
        ),
        ["tests/suite/docs.rs", "src/cli/", "fuzz/corpus/onnx_reader"]
    );
    assert_eq!(
        named_paths("ends a sentence at tests/suite/docs.rs.", &folders),
        ["tests/suite/docs.rs"]
    );
    for skipped in [
        "https://github.com/ggml-org/llama.cpp/blob/master/src/llama.cpp",
        "ggml/src/ggml-quants.c",
        "\"$src/Cargo.toml\"",
        "onnxruntime's src/contrib_ops",
        "tests/suite/*.rs",
        "fuzz/corpus/TARGET",
        "fuzz/corpus/<target>",
        "tests/suite/{a,b}.rs",
        "contests/x",
    ] {
        assert!(
            named_paths(skipped, &folders).is_empty(),
            "{skipped}: {:?}",
            named_paths(skipped, &folders)
        );
    }
}

/// The `.rs` names in `text` (`generation/resident.rs`, `mod.rs`, `src/fs.rs`).
fn rust_file_names(text: &str) -> Vec<&str> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || "_/".contains(c);
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(".rs") {
        let after = rest[at + 3..].chars().next();
        let start = rest[..at]
            .rfind(|c: char| !is_path_char(c))
            .map_or(0, |k| k + 1);
        if !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && start < at {
            found.push(&rest[start..at + 3]);
        }
        rest = &rest[at + 3..];
    }
    found
}

/// docs/architecture.md walks the code file by file: every file it names (a path under
/// src/ with or without the `src/` in front, or a file name under the folder its line
/// describes) is a file of the tree, so the page fails here when a file moves or goes.
#[test]
fn every_source_file_the_architecture_page_names_exists() {
    let mut sources = vec![root().join("build.rs")];
    for folder in ["src", "tests", "bindings", "fuzz", "build", "examples"] {
        text_files(&root().join(folder), &mut sources);
    }
    let sources: Vec<String> = sources
        .iter()
        .filter_map(|p| p.strip_prefix(root()).ok())
        .map(|p| p.to_string_lossy().replace('\\', "/"))
        .filter(|p| p.ends_with(".rs"))
        .collect();
    let page = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let names = rust_file_names(&page);
    assert!(
        names.len() > 50,
        "only {} names: the scan is broken",
        names.len()
    );
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| {
            !sources
                .iter()
                .any(|s| s == name || s.ends_with(&format!("/{name}")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names files the tree does not have: {missing:?}"
    );
    assert_eq!(
        rust_file_names("walks gmlp/interface.rs, (mod.rs) and `src/fs.rs`; not .rsx or x.rst"),
        ["gmlp/interface.rs", "mod.rs", "src/fs.rs"]
    );
}
