//! Compiles the vendored `proto/onnx.proto` with protox (no protoc binary) and prost-build.
fn main() {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let fds = protox::compile(["proto/onnx.proto"], ["proto"]).expect("compile proto/onnx.proto");
    prost_build::Config::new()
        .compile_fds(fds)
        .expect("generate Rust for onnx.proto");
}
