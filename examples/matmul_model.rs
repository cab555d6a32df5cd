//! Writes a one-MatMul ONNX model (`a` f32 [n, n] input times a constant [n, n]) for
//! measuring a runtime's f32 matmul throughput: `cargo run --release --example
//! matmul_model -- OUT.onnx 2048`, then `gmlp-onnx validate OUT.onnx --bench 10`.

use gmlp_onnx::onnx::builder::GraphBuilder;
use gmlp_onnx::onnx::graph::{Dim, ElemType, TensorData};
use gmlp_onnx::onnx::writer::{write_model, ModelInfo};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let out = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: matmul_model OUT.onnx N"))?;
    let n: usize = args.next().unwrap_or_else(|| "2048".into()).parse()?;
    let mut g = GraphBuilder::new(17)?;
    let a = g.input("a", ElemType::F32, vec![Dim::Fixed(n), Dim::Fixed(n)])?;
    let values = (0..n * n)
        .map(|k| ((k % 97) as f32 - 48.0) / 97.0)
        .collect();
    let b = g.weight("b", &[n, n], TensorData::F32(values))?;
    let y = g.matmul("matmul", &a, &b)?;
    let y = g.rename(&y, "y")?;
    let graph = g.finish("matmul", vec![y]);
    write_model(
        &graph,
        &ModelInfo::default(),
        std::path::Path::new(&out),
        |_, _| {},
    )?;
    println!("wrote {out}: {n}x{n} @ {n}x{n}, {} FLOPs", 2 * n * n * n);
    Ok(())
}
