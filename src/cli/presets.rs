//! `gmlp-onnx presets`: the paper's models with the parameter and FLOP counts of the graphs
//! they emit, beside the paper's.

use std::sync::Arc;

use gmlp_onnx::gmlp::export::{counts, DEFAULT_OPSET};
use gmlp_onnx::gmlp::{presets, InitScheme, SeededInit};

/// Runs `presets`.
pub fn run(json: bool) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for p in presets() {
        let graph = gmlp_onnx::gmlp::build_graph(
            &p.config,
            Arc::new(SeededInit {
                seed: 0,
                scheme: InitScheme::Paper,
            }),
            DEFAULT_OPSET,
        )?;
        let c = counts(&graph);
        rows.push((p, c));
    }
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(p, c)| {
                serde_json::json!({
                    "name": p.name,
                    "config": p.config,
                    "params": c.stored_params,
                    "flops": c.flops,
                    "flops_with_head": c.flops_with_head,
                    "paper_params_m": p.paper_params_m,
                    "paper_flops_b": p.paper_flops_b,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:<12} {:>4} {:>6} {:>6} {:>5} {:>16} {:>10} {:>7} {:>12} {:>10} {:>7}",
        "preset",
        "L",
        "d",
        "f",
        "attn",
        "spatial",
        "params(M)",
        "paper",
        "FLOPs(B)",
        "paper",
        "ΔFLOPs"
    );
    for (p, c) in rows {
        let params_m = c.stored_params as f64 / 1e6;
        let flops_b = c.flops as f64 / 1e9;
        println!(
            "{:<12} {:>4} {:>6} {:>6} {:>5} {:>16} {:>10.2} {:>7.1} {:>12.1} {:>10.1} {:>+6.1}%   (params {:+.2}%)",
            p.name,
            p.config.layers,
            p.config.d_model,
            p.config.d_ffn,
            p.config.attn_dim.map_or("-".to_string(), |a| a.to_string()),
            p.config.spatial.name(),
            params_m,
            p.paper_params_m,
            flops_b,
            p.paper_flops_b,
            100.0 * (flops_b / p.paper_flops_b - 1.0),
            100.0 * (params_m / p.paper_params_m - 1.0),
        );
    }
    println!("FLOPs: 2 per multiply-add of every MatMul and Conv for one example, output head excluded (the paper's convention).");
    Ok(())
}
