//! Where the ONNX Runtime shared library comes from, in a fixed order that follows how ML
//! engineers install it (a `pip install onnxruntime` somewhere):
//!
//! 1. `--ort-lib PATH`;
//! 2. `ORT_DYLIB_PATH`;
//! 3. the active virtual environment, `$VIRTUAL_ENV`;
//! 4. the Python environment this `gmlp-onnx` binary is installed in (`pip install` of the
//!    wheel puts it in `<env>/bin/`, beside `<env>/lib/python3.X/site-packages/`);
//! 5. `./.venv` in the current directory (what `scripts/test` creates);
//! 6. the `onnxruntime` package importable by `$GMLP_ONNX_PYTHON`, else `python3`.
//!
//! An explicit choice (1 or 2) that is not a file is an error rather than a silent fall
//! through; otherwise the first place holding `onnxruntime/capi/libonnxruntime.so*` wins.
//! Every place looked at is recorded, so that the error (and `gmlp-onnx doctor`) can say
//! what was tried and why each place did not serve.
//!
//! Longer than ~500 lines: the six places and the record of each look are one ordered
//! search, and two fifths of the file are its unit tests (each place, each refusal).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One of the places the library is looked for, in search order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LibrarySource {
    /// The path the caller gives (`OrtOptions::library`).
    Explicit,
    /// The `ORT_DYLIB_PATH` environment variable.
    EnvVar,
    /// The active virtual environment (`$VIRTUAL_ENV`).
    ActiveVirtualEnv,
    /// The Python environment the running binary is installed in.
    OwnEnvironment,
    /// `./.venv` in the current directory.
    LocalVenv,
    /// The `onnxruntime` package importable by a Python interpreter.
    Python,
}

impl LibrarySource {
    /// How the place is named in messages.
    pub fn describe(self) -> &'static str {
        match self {
            LibrarySource::Explicit => "the explicit path",
            LibrarySource::EnvVar => "ORT_DYLIB_PATH",
            LibrarySource::ActiveVirtualEnv => "$VIRTUAL_ENV",
            LibrarySource::OwnEnvironment => "the environment gmlp-onnx is installed in",
            LibrarySource::LocalVenv => "./.venv",
            LibrarySource::Python => "python",
        }
    }
}

/// What one place held.
#[derive(Clone, Debug, PartialEq)]
pub struct Look {
    /// Which place.
    pub source: LibrarySource,
    /// The place itself (a path, a variable's value, an interpreter), or `None` when it
    /// does not apply (flag not given, variable not set).
    pub place: Option<String>,
    /// The library found there, or why there was none.
    pub outcome: std::result::Result<PathBuf, NoLibrary>,
}

/// Why a place held no ONNX Runtime library (each message as [`Look::render`] shows it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoLibrary {
    /// The place does not apply here (flag not given, variable not set, no interpreter…):
    /// why, as said.
    #[error("{0}")]
    NotApplicable(&'static str),
    /// A path given explicitly (`what`: "the path given", "the path set") is not a file.
    #[error("{what} is not a file")]
    NotAFile {
        /// How the path was given.
        what: &'static str,
    },
    /// The environment's folder does not exist.
    #[error("no such folder")]
    NoSuchFolder,
    /// The environment has no `lib/python3*/site-packages`.
    #[error("no lib/python3*/site-packages")]
    NoSitePackages,
    /// No `onnxruntime` package in the environment's site-packages.
    #[error("no onnxruntime package installed there")]
    NoPackage,
    /// The interpreter could not be started (the operating system's reason).
    #[error("cannot run it ({0})")]
    CannotRun(String),
    /// The interpreter cannot import `onnxruntime`.
    #[error("it cannot import onnxruntime")]
    CannotImport,
    /// The package's `capi` folder holds no library file.
    #[error("no libonnxruntime.so* in {}", .0.display())]
    NotInPackage(PathBuf),
}

impl Look {
    /// `SOURCE (PLACE): OUTCOME` on one line, the source named by [`LibrarySource::describe`].
    pub fn render(&self) -> String {
        self.render_as(self.source.describe())
    }

    /// [`Look::render`] with the source named `source` (a front end's own name for it).
    pub fn render_as(&self, source: &str) -> String {
        let place = match &self.place {
            Some(p) => format!("{source} ({p})"),
            None => source.to_string(),
        };
        match &self.outcome {
            Ok(lib) => format!("{place}: {}", lib.display()),
            Err(why) => format!("{place}: {why}"),
        }
    }
}

/// The result of a search: every place looked at, in order, the last one being the one
/// that decided (found the library, or was an explicit choice that failed).
#[derive(Clone, Debug, PartialEq)]
pub struct Discovery {
    /// Places looked at, in order.
    pub looked: Vec<Look>,
}

impl Discovery {
    /// The library found, and where.
    pub fn found(&self) -> Option<(LibrarySource, &Path)> {
        self.looked
            .iter()
            .find_map(|l| l.outcome.as_ref().ok().map(|p| (l.source, p.as_path())))
    }

    /// Every place looked at, `; `-separated, for a one-line error.
    pub fn summary(&self) -> String {
        self.looked
            .iter()
            .map(Look::render)
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// True when an explicit choice (`--ort-lib` or `ORT_DYLIB_PATH`) named something that
    /// is not a file: the search stopped there.
    pub fn explicit_choice_failed(&self) -> bool {
        self.looked.last().is_some_and(|l| {
            l.outcome.is_err()
                && matches!(l.source, LibrarySource::Explicit | LibrarySource::EnvVar)
        })
    }
}

/// The environment a front end that is not the binary says the library is installed in.
static INSTALLED_IN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Says which environment the library is installed in when the running executable is not
/// the `gmlp-onnx` binary (the Python bindings give their interpreter's `sys.prefix`):
/// searched in the executable's place. The first call wins.
pub fn set_installed_in(prefix: PathBuf) {
    let _ = INSTALLED_IN.set(prefix);
}

/// What the search depends on, gathered once so that tests can fake every layout.
#[derive(Clone, Debug, Default)]
pub struct SearchContext {
    /// `--ort-lib`.
    pub explicit: Option<PathBuf>,
    /// `ORT_DYLIB_PATH`.
    pub ort_dylib_path: Option<OsString>,
    /// `VIRTUAL_ENV`.
    pub virtual_env: Option<OsString>,
    /// The running executable.
    pub executable: Option<PathBuf>,
    /// The environment this library is installed in, where the running executable is not
    /// its own (a Python interpreter running the bindings: its `sys.prefix`); else the
    /// executable's.
    pub installed_in: Option<PathBuf>,
    /// The current directory.
    pub current_dir: Option<PathBuf>,
    /// The interpreter to ask last (`$GMLP_ONNX_PYTHON`, else `python3`); `None` skips it.
    pub python: Option<String>,
}

impl SearchContext {
    /// The context of this process: its environment, executable and current directory.
    pub fn from_process(explicit: Option<&Path>) -> Self {
        let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        SearchContext {
            explicit: explicit.map(Path::to_path_buf),
            ort_dylib_path: non_empty("ORT_DYLIB_PATH"),
            virtual_env: non_empty("VIRTUAL_ENV"),
            executable: std::env::current_exe().ok(),
            installed_in: INSTALLED_IN.get().cloned(),
            current_dir: std::env::current_dir().ok(),
            python: Some(
                std::env::var("GMLP_ONNX_PYTHON")
                    .ok()
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| "python3".into()),
            ),
        }
    }
}

/// Looks for the library in the documented order (module docs), stopping at the first
/// place that has it or at an explicit choice that is not a file.
pub fn discover(context: &SearchContext) -> Discovery {
    let mut looked = Vec::new();
    let explicit = |source, path: &Path, what: &'static str| Look {
        source,
        place: Some(path.display().to_string()),
        outcome: if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(NoLibrary::NotAFile { what })
        },
    };
    let stop = |looked: &Vec<Look>| looked.last().is_some_and(|l: &Look| l.outcome.is_ok());
    match &context.explicit {
        Some(p) => {
            looked.push(explicit(LibrarySource::Explicit, p, "the path given"));
            return Discovery { looked };
        }
        None => looked.push(Look {
            source: LibrarySource::Explicit,
            place: None,
            outcome: Err(NoLibrary::NotApplicable("not given")),
        }),
    }
    match &context.ort_dylib_path {
        Some(p) => {
            let look = explicit(LibrarySource::EnvVar, Path::new(p), "the path set");
            looked.push(look);
            return Discovery { looked };
        }
        None => looked.push(Look {
            source: LibrarySource::EnvVar,
            place: None,
            outcome: Err(NoLibrary::NotApplicable("not set")),
        }),
    }
    let environments = [
        (
            LibrarySource::ActiveVirtualEnv,
            context.virtual_env.as_ref().map(PathBuf::from),
            "not set (no virtual environment is active)",
        ),
        (
            LibrarySource::OwnEnvironment,
            context
                .installed_in
                .clone()
                .or_else(|| context.executable.as_deref().and_then(installed_prefix)),
            "the binary is not in a bin/ folder",
        ),
        (
            LibrarySource::LocalVenv,
            context.current_dir.as_ref().map(|d| d.join(".venv")),
            "no current directory",
        ),
    ];
    for (source, prefix, absent) in environments {
        looked.push(match prefix {
            Some(prefix) => Look {
                source,
                place: Some(prefix.display().to_string()),
                outcome: library_in_environment(&prefix),
            },
            None => Look {
                source,
                place: None,
                outcome: Err(NoLibrary::NotApplicable(absent)),
            },
        });
        if stop(&looked) {
            return Discovery { looked };
        }
    }
    looked.push(match &context.python {
        Some(python) => Look {
            source: LibrarySource::Python,
            place: Some(python.clone()),
            outcome: library_of_python(python),
        },
        None => Look {
            source: LibrarySource::Python,
            place: None,
            outcome: Err(NoLibrary::NotApplicable("no interpreter to ask")),
        },
    });
    Discovery { looked }
}

/// The installation prefix of a binary in `<prefix>/bin/` (a virtual environment, a conda
/// environment, `~/.local`): where `pip install` put it.
fn installed_prefix(executable: &Path) -> Option<PathBuf> {
    let bin = executable.parent()?;
    (bin.file_name()? == "bin").then(|| bin.parent().map(Path::to_path_buf))?
}

/// `onnxruntime/capi/libonnxruntime.so*` under `<prefix>/lib*/python3*/site-packages/`.
pub fn library_in_environment(prefix: &Path) -> std::result::Result<PathBuf, NoLibrary> {
    if !prefix.is_dir() {
        return Err(NoLibrary::NoSuchFolder);
    }
    let mut site_packages = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .map(|p| p.join("site-packages"))
            .filter(|p| p.is_dir())
            .collect();
        pythons.sort();
        site_packages.extend(pythons);
    }
    if site_packages.is_empty() {
        return Err(NoLibrary::NoSitePackages);
    }
    for site in &site_packages {
        if let Some(lib) = library_in(&site.join("onnxruntime").join("capi")) {
            return Ok(lib);
        }
    }
    Err(NoLibrary::NoPackage)
}

/// The `onnxruntime` package's library as `python` imports it.
fn library_of_python(python: &str) -> std::result::Result<PathBuf, NoLibrary> {
    let probe = Command::new(python)
        .args([
            "-c",
            "import os, onnxruntime; print(os.path.join(os.path.dirname(onnxruntime.__file__), 'capi'))",
        ])
        .output();
    match probe {
        Err(e) => Err(NoLibrary::CannotRun(e.to_string())),
        Ok(out) if !out.status.success() => Err(NoLibrary::CannotImport),
        Ok(out) => {
            let capi = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            library_in(&capi).ok_or(NoLibrary::NotInPackage(capi))
        }
    }
}

/// The versioned `libonnxruntime.so.*` (or `libonnxruntime.*.dylib`) in a wheel's `capi`
/// folder; the highest name when there are several.
pub fn library_in(capi: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(capi)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with("libonnxruntime.so")
                        || (n.starts_with("libonnxruntime.") && n.ends_with(".dylib"))
                })
        })
        .collect();
    found.sort();
    found.pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake Python environment under `root/name` holding the wheel's library file.
    fn fake_environment(root: &Path, name: &str, python: &str, with_ort: bool) -> PathBuf {
        let prefix = root.join(name);
        let site = prefix.join("lib").join(python).join("site-packages");
        std::fs::create_dir_all(site.join("numpy")).unwrap();
        std::fs::create_dir_all(prefix.join("bin")).unwrap();
        if with_ort {
            let capi = site.join("onnxruntime").join("capi");
            std::fs::create_dir_all(&capi).unwrap();
            std::fs::write(capi.join("libonnxruntime.so.1.31.1"), b"").unwrap();
            std::fs::write(capi.join("onnxruntime_pybind11_state.so"), b"").unwrap();
        }
        prefix
    }

    fn library(prefix: &Path, python: &str) -> PathBuf {
        prefix
            .join("lib")
            .join(python)
            .join("site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1")
    }

    /// Every environment layout at once; each test removes what comes before the place it
    /// checks.
    struct Layout {
        _dir: tempfile::TempDir,
        context: SearchContext,
        active: PathBuf,
        own: PathBuf,
        work: PathBuf,
    }

    fn layout() -> Layout {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let active = fake_environment(root, "active", "python3.12", true);
        let own = fake_environment(root, "own", "python3.11", true);
        let work = root.join("work");
        fake_environment(&work, ".venv", "python3.13", true);
        let context = SearchContext {
            explicit: None,
            ort_dylib_path: None,
            virtual_env: Some(active.clone().into()),
            executable: Some(own.join("bin").join("gmlp-onnx")),
            installed_in: None,
            current_dir: Some(work.clone()),
            python: None,
        };
        Layout {
            _dir: dir,
            context,
            active,
            own,
            work,
        }
    }

    fn sources(d: &Discovery) -> Vec<LibrarySource> {
        d.looked.iter().map(|l| l.source).collect()
    }

    #[test]
    fn an_explicit_path_comes_first_and_a_wrong_one_stops_the_search() {
        let l = layout();
        let lib = library(&l.own, "python3.11");
        let mut context = l.context.clone();
        context.explicit = Some(lib.clone());
        context.ort_dylib_path = Some(library(&l.active, "python3.12").into());
        let d = discover(&context);
        assert_eq!(d.found(), Some((LibrarySource::Explicit, lib.as_path())));
        context.explicit = Some(l.work.join("missing.so"));
        let d = discover(&context);
        assert!(d.found().is_none() && d.explicit_choice_failed());
        assert_eq!(
            d.looked[0].outcome,
            Err(NoLibrary::NotAFile {
                what: "the path given"
            })
        );
    }

    #[test]
    fn ort_dylib_path_comes_before_any_environment_and_is_taken_literally() {
        let l = layout();
        let lib = library(&l.own, "python3.11");
        let mut context = l.context.clone();
        context.ort_dylib_path = Some(lib.clone().into());
        let d = discover(&context);
        assert_eq!(d.found(), Some((LibrarySource::EnvVar, lib.as_path())));
        assert_eq!(
            sources(&d),
            [LibrarySource::Explicit, LibrarySource::EnvVar]
        );
        // What an unexpanded `python3.*` in `export` leaves: refused, naming the path.
        let glob = l
            .own
            .join("lib/python3.*/site-packages/onnxruntime/capi/x.so");
        context.ort_dylib_path = Some(glob.clone().into());
        let d = discover(&context);
        assert!(d.explicit_choice_failed());
        assert!(d.summary().contains(&format!(
            "ORT_DYLIB_PATH ({}): the path set is not a file",
            glob.display()
        )));
    }

    #[test]
    fn environments_are_searched_active_then_own_then_local() {
        let l = layout();
        let d = discover(&l.context);
        let active_lib = library(&l.active, "python3.12");
        assert_eq!(
            d.found(),
            Some((LibrarySource::ActiveVirtualEnv, active_lib.as_path()))
        );

        let mut context = l.context.clone();
        context.virtual_env = None;
        let own_lib = library(&l.own, "python3.11");
        let d = discover(&context);
        assert_eq!(
            d.found(),
            Some((LibrarySource::OwnEnvironment, own_lib.as_path()))
        );
        assert!(d.summary().contains("$VIRTUAL_ENV: not set"));

        // An active environment without onnxruntime is passed over, saying so.
        let bare = fake_environment(l.work.parent().unwrap(), "bare", "python3.12", false);
        context.virtual_env = Some(bare.clone().into());
        let d = discover(&context);
        assert_eq!(d.found().unwrap().0, LibrarySource::OwnEnvironment);
        assert!(d.summary().contains(&format!(
            "$VIRTUAL_ENV ({}): no onnxruntime package installed there",
            bare.display()
        )));

        context.executable = Some(PathBuf::from("/somewhere/target/debug/gmlp-onnx"));
        let local_lib = l
            .work
            .join(".venv/lib/python3.13/site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1");
        let d = discover(&context);
        assert_eq!(
            d.found(),
            Some((LibrarySource::LocalVenv, local_lib.as_path()))
        );
    }

    #[test]
    fn nothing_found_lists_every_place_looked_in_order() {
        let l = layout();
        let empty = l.work.parent().unwrap().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let context = SearchContext {
            virtual_env: Some(empty.join("no-such-venv").into()),
            executable: Some(empty.join("bin").join("gmlp-onnx")),
            current_dir: Some(empty.clone()),
            python: Some(empty.join("no-python").display().to_string()),
            ..Default::default()
        };
        let d = discover(&context);
        assert_eq!(d.found(), None);
        assert!(!d.explicit_choice_failed());
        assert_eq!(
            sources(&d),
            [
                LibrarySource::Explicit,
                LibrarySource::EnvVar,
                LibrarySource::ActiveVirtualEnv,
                LibrarySource::OwnEnvironment,
                LibrarySource::LocalVenv,
                LibrarySource::Python
            ]
        );
        let summary = d.summary();
        for expected in [
            "the explicit path: not given",
            "ORT_DYLIB_PATH: not set",
            "no-such-venv): no such folder",
            &format!(
                "the environment gmlp-onnx is installed in ({}): no lib/python3*/site-packages",
                empty.display()
            ),
            &format!(
                "./.venv ({}): no such folder",
                empty.join(".venv").display()
            ),
            "no-python): cannot run it",
        ] {
            assert!(summary.contains(expected), "{expected} not in {summary}");
        }
    }

    #[test]
    fn the_highest_library_version_in_a_capi_folder_wins_and_folders_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "libonnxruntime.so.1.30.0",
            "libonnxruntime.so.1.31.1",
            "other.so",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        std::fs::create_dir(dir.path().join("libonnxruntime.so.9")).unwrap();
        assert_eq!(
            library_in(dir.path()),
            Some(dir.path().join("libonnxruntime.so.1.31.1"))
        );
        assert_eq!(library_in(&dir.path().join("absent")), None);
    }

    #[test]
    fn a_binary_outside_a_bin_folder_has_no_environment() {
        assert_eq!(
            installed_prefix(Path::new("/venv/bin/gmlp-onnx")),
            Some(PathBuf::from("/venv"))
        );
        assert_eq!(
            installed_prefix(Path::new("/repo/target/release/gmlp-onnx")),
            None
        );
    }
}
