//! The paper's presets: parameter counts and FLOPs computed from the emitted graphs must
//! be within 1% and 3% of Tables 1 and 5 (no weight is produced: counts come from shapes).

use std::sync::Arc;

use gmlp_onnx::gmlp::export::{counts, DEFAULT_OPSET};
use gmlp_onnx::gmlp::{build_graph, presets, InitScheme, SeededInit};

#[test]
fn presets_reproduce_the_papers_parameter_counts_and_flops() {
    for p in presets() {
        let graph = build_graph(
            &p.config,
            Arc::new(SeededInit {
                seed: 0,
                scheme: InitScheme::Paper,
            }),
            DEFAULT_OPSET,
        )
        .unwrap();
        let c = counts(&graph);
        let params_m = c.stored_params as f64 / 1e6;
        let flops_b = c.flops as f64 / 1e9;
        let dp = (params_m / p.paper_params_m - 1.0).abs();
        let df = (flops_b / p.paper_flops_b - 1.0).abs();
        assert!(
            dp <= 0.01,
            "{}: {params_m:.2}M params vs paper {}M",
            p.name,
            p.paper_params_m
        );
        assert!(
            df <= 0.03,
            "{}: {flops_b:.2}B FLOPs vs paper {}B",
            p.name,
            p.paper_flops_b
        );
        assert_eq!(
            u128::from(c.stored_params),
            p.config.stored_f32_estimate(),
            "{}",
            p.name
        );
    }
}
