//! Runs an ONNX file in candle-onnx: `candle-consumer MODEL.onnx INPUTS.npz OUTPUTS.npz`.
//! Inputs are read by name from the archive; every graph output is written to OUTPUTS.npz.
//! Any failure prints one line to stderr and exits 1 (the matrix records that line).

use std::collections::HashMap;
use std::process::ExitCode;

fn run(model: &str, inputs: &str, outputs: &str) -> Result<(), String> {
    let proto = candle_onnx::read_file(model).map_err(|e| format!("read model: {e}"))?;
    let named = candle_core::Tensor::read_npz(inputs).map_err(|e| format!("read inputs: {e}"))?;
    let feeds: HashMap<String, candle_core::Tensor> = named.into_iter().collect();
    let graph = proto.graph.as_ref().ok_or("model has no graph")?;
    let mut results = candle_onnx::simple_eval(&proto, feeds).map_err(|e| short_message(&e))?;
    let mut saved = Vec::new();
    for output in &graph.output {
        let tensor = results
            .remove(&output.name)
            .ok_or_else(|| format!("output {} not produced", output.name))?;
        saved.push((output.name.clone(), tensor));
    }
    let refs: Vec<(&str, &candle_core::Tensor)> =
        saved.iter().map(|(n, t)| (n.as_str(), t)).collect();
    candle_core::Tensor::write_npz(&refs, outputs).map_err(|e| format!("write outputs: {e}"))
}

/// candle's message without its backtrace and without the Debug dump of the failing node.
fn short_message(error: &candle_core::Error) -> String {
    let text = error.to_string();
    let first = text.lines().next().unwrap_or("");
    match first.find(" for op NodeProto {") {
        Some(at) => first[..at].to_string(),
        None => first.to_string(),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: candle-consumer MODEL.onnx INPUTS.npz OUTPUTS.npz");
        return ExitCode::from(2);
    }
    match run(&args[1], &args[2], &args[3]) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("candle-onnx: {e}");
            ExitCode::FAILURE
        }
    }
}
