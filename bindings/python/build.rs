//! Records the commit the extension is built from (the root crate's build/commit.rs), for
//! `gmlp-onnx --version` run through the Python entry point.

#[path = "../../build/commit.rs"]
mod commit;

fn main() {
    let here =
        std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = here
        .join("../..")
        .canonicalize()
        .expect("the repository root");
    for file in commit::watched(&root) {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let commit = commit::describe(&root).unwrap_or_else(|| "commit unknown".to_string());
    println!("cargo:rustc-env=GMLP_ONNX_COMMIT={commit}");
}
