//! `gmlp-onnx inspect`: what an ONNX file declares and holds, as text or JSON.

use std::path::Path;

/// Runs `inspect`.
pub fn run(model: &Path, json: bool) -> anyhow::Result<()> {
    let summary = gmlp_onnx::inspect::inspect(model)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.render());
    }
    Ok(())
}
