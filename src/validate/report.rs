//! The result of a validation: per-runtime timings and placement, per-pair output
//! differences; serialized as the JSON report (schema [`REPORT_SCHEMA`]) and rendered as text.

use std::path::PathBuf;

use serde::Serialize;

use crate::gmlp::Precision;
use crate::runtime::Placement;
use crate::validate::compare::{PairReport, Tolerance};
use crate::validate::histograms::ErrorHistogram;
use crate::validate::stepwise::DecodingReport;

/// The `schema` field of the JSON report; bumped when a field changes meaning.
pub const REPORT_SCHEMA: &str = "gmlp-onnx.validate/1";
/// Name of the reference in pairs that compare a runtime with `--expected` outputs.
pub const EXPECTED: &str = "expected";

/// One model input as used.
#[derive(Clone, Debug, Serialize)]
pub struct InputReport {
    /// Input name.
    pub name: String,
    /// Concrete shape used.
    pub shape: Vec<usize>,
    /// Element type (NumPy name).
    pub dtype: &'static str,
}

/// Latency of repeated runs.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    /// Number of timed runs.
    pub runs: usize,
    /// Median latency in milliseconds.
    pub median_ms: f64,
    /// Fastest run in milliseconds.
    pub min_ms: f64,
}

/// Latency of the `--bench` runs, timed after one warm-up run.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Runs with the inputs taken from and the outputs written to host arrays (on CUDA:
    /// the inputs copied to the device and the outputs back to the host within each run).
    #[serde(flatten)]
    pub host: Latency,
    /// ort-cuda only: the same runs with the inputs copied to the device once before and
    /// the outputs left in device memory (after one more untimed run); absent for runtimes
    /// whose outputs are host memory anyway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_resident: Option<Latency>,
}

/// What one runtime did.
#[derive(Clone, Debug, Serialize)]
pub struct RuntimeReport {
    /// Runtime name (`tract`, `ort-cpu`, `ort-cuda`).
    pub name: String,
    /// What the runtime ran differently from the file as it is (tract: 8-bit MatMulNBits
    /// nodes as MatMul on the file's weights dequantized by gmlp-onnx); absent when nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Wall time of loading and preparing the model (tract: parse and optimize; ONNX
    /// Runtime: session creation with its graph optimizations) in milliseconds.
    pub load_ms: f64,
    /// Wall time of the first run in milliseconds (includes warm-up work and, for
    /// ONNX Runtime, profiling).
    pub first_run_ms: f64,
    /// ONNX Runtime only: distinct graph nodes per execution provider in the first
    /// run, from ONNX Runtime's profiler.
    pub providers: Option<Placement>,
    /// Latency of the `--bench` runs.
    pub bench: Option<BenchReport>,
}

/// Result of [`validate`](fn@crate::validate::validate); serialized as the JSON report (schema [`REPORT_SCHEMA`]).
#[derive(Clone, Debug, Serialize)]
pub struct ValidationReport {
    /// Always [`REPORT_SCHEMA`].
    pub schema: &'static str,
    /// The model file.
    pub model: PathBuf,
    /// Where the inputs came from: `generated` or the `.npz` path.
    pub inputs_source: String,
    /// Seed of generated inputs (`null` with an inputs file).
    pub seed: Option<u64>,
    /// Inputs used.
    pub inputs: Vec<InputReport>,
    /// Reference outputs file, if any.
    pub expected: Option<PathBuf>,
    /// Runtimes run, in order.
    pub runtimes: Vec<RuntimeReport>,
    /// Every pair of runtimes, then every runtime against the expected outputs.
    pub pairs: Vec<PairReport>,
    /// Tolerances applied.
    pub tolerance: Tolerance,
    /// The model's precision from our metadata (`"f32"`, `"f16"`), which chose the
    /// default tolerances; `null` for a file without it.
    pub precision: Option<Precision>,
    /// With-past models: the stepwise decoding check (absent for other models).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decoding: Option<DecodingReport>,
    /// True when every pair agrees (and the decoding check passes).
    pub pass: bool,
    /// The elementwise error histograms of every pair and output, when asked for
    /// ([`crate::validate::ValidateOptions::histograms`]); not part of the JSON report.
    #[serde(skip)]
    pub histograms: Vec<ErrorHistogram>,
}

impl ValidationReport {
    /// Human-readable summary: inputs, runtimes (placement, latency), then one line per
    /// pair and output.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for i in &self.inputs {
            s += &format!("input  {} {} {:?}\n", i.name, i.dtype, i.shape);
        }
        for r in &self.runtimes {
            s += &format!(
                "ran    {:<9} load {:>9.1} ms, first run {:>9.1} ms (includes warm-up)\n",
                r.name, r.load_ms, r.first_run_ms
            );
            if let Some(note) = &r.note {
                s += &format!("note   {:<9} {note}\n", r.name);
            }
            if let Some(p) = &r.providers {
                let list: Vec<String> = p.iter().map(|(k, v)| format!("{k} {v}")).collect();
                s += &format!(
                    "placed {:<9} nodes per provider: {}\n",
                    r.name,
                    list.join(", ")
                );
            }
            if let Some(b) = &r.bench {
                let h = &b.host;
                s += &format!(
                    "bench  {:<9} median {:.3} ms, min {:.3} ms over {} runs{}\n",
                    r.name,
                    h.median_ms,
                    h.min_ms,
                    h.runs,
                    if b.device_resident.is_some() {
                        ", outputs copied to the host"
                    } else {
                        ""
                    }
                );
                if let Some(d) = &b.device_resident {
                    s += &format!(
                        "bench  {:<9} median {:.3} ms, min {:.3} ms over {} runs, outputs left on the device\n",
                        r.name, d.median_ms, d.min_ms, d.runs
                    );
                }
            }
        }
        s += &format!(
            "bound  max|a - b| <= atol {:e} + rtol {:e} * max|reference|{}\n",
            self.tolerance.atol,
            self.tolerance.rtol,
            match self.precision {
                Some(p) => format!(" (model precision {})", p.name()),
                None => String::new(),
            }
        );
        for p in &self.pairs {
            for o in &p.outputs {
                s += &format!(
                    "{}  {} vs {}: {} max_abs {:.3e} max_rel {:.3e} cosine {:.9} mismatched {}/{} (bound {:.3e})\n",
                    if o.pass { "agree " } else { "DIFFER" },
                    p.reference,
                    p.other,
                    o.output,
                    o.max_abs,
                    o.max_rel,
                    o.cosine,
                    o.mismatched,
                    o.elements,
                    o.bound
                );
            }
        }
        if let Some(d) = &self.decoding {
            s += &d.render();
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(bench: BenchReport) -> ValidationReport {
        ValidationReport {
            schema: REPORT_SCHEMA,
            model: "m.onnx".into(),
            inputs_source: "generated".into(),
            seed: Some(0),
            inputs: Vec::new(),
            expected: None,
            runtimes: vec![RuntimeReport {
                name: "ort-cuda".into(),
                note: None,
                load_ms: 1.0,
                first_run_ms: 2.0,
                providers: None,
                bench: Some(bench),
            }],
            pairs: Vec::new(),
            tolerance: Tolerance {
                rtol: 1e-4,
                atol: 1e-6,
            },
            precision: None,
            decoding: None,
            pass: true,
            histograms: Vec::new(),
        }
    }

    fn latency(median_ms: f64, min_ms: f64) -> Latency {
        Latency {
            runs: 5,
            median_ms,
            min_ms,
        }
    }

    #[test]
    fn the_device_resident_latency_is_reported_beside_the_host_one() {
        let r = report(BenchReport {
            host: latency(7.83, 7.33),
            device_resident: Some(latency(2.05, 1.55)),
        });
        let text = r.render();
        assert!(
            text.contains(
                "bench  ort-cuda  median 7.830 ms, min 7.330 ms over 5 runs, outputs copied to the host\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "bench  ort-cuda  median 2.050 ms, min 1.550 ms over 5 runs, outputs left on the device\n"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["runtimes"][0]["bench"],
            serde_json::json!({"runs": 5, "median_ms": 7.83, "min_ms": 7.33,
                "device_resident": {"runs": 5, "median_ms": 2.05, "min_ms": 1.55}})
        );
    }

    #[test]
    fn without_a_device_the_bench_line_and_fields_are_as_before() {
        let r = report(BenchReport {
            host: latency(7.83, 7.33),
            device_resident: None,
        });
        let text = r.render();
        assert!(
            text.contains("bench  ort-cuda  median 7.830 ms, min 7.330 ms over 5 runs\n"),
            "{text}"
        );
        assert!(!text.contains("device"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["runtimes"][0]["bench"],
            serde_json::json!({"runs": 5, "median_ms": 7.83, "min_ms": 7.33})
        );
    }
}
