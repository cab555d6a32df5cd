//! `gmlp-onnx inspect`: what an ONNX file declares and holds, as text or JSON, and on
//! request pictures of its spatial weights (`--plot DIR`).

use std::path::Path;

/// Runs `inspect`; with `plot`, writes the pictures first and lists them.
pub fn run(model: &Path, json: bool, plot: Option<&Path>) -> anyhow::Result<()> {
    let summary = match plot {
        Some(dir) => gmlp_onnx::inspect::inspect_and_plot(model, dir)?,
        None => gmlp_onnx::inspect::inspect(model)?,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.render());
    }
    Ok(())
}
