//! Compiles the vendored `proto/onnx.proto` with protox (no protoc binary) and prost-build,
//! and records the commit the build is made from (build/commit.rs) for `--version`.

#[path = "build/commit.rs"]
mod commit;

fn main() {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let fds = protox::compile(["proto/onnx.proto"], ["proto"]).expect("compile proto/onnx.proto");
    prost_build::Config::new()
        .compile_fds(fds)
        .expect("generate Rust for onnx.proto");

    let dir = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    for file in commit::watched(&dir) {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let commit = commit::describe(&dir).unwrap_or_else(|| "commit unknown".to_string());
    println!("cargo:rustc-env=GMLP_ONNX_COMMIT={commit}");
}
