//! Where ONNX Runtime ran a graph: the rule that an `ort-cuda` run must have placed at least
//! one node on the CUDA execution provider, judged from ONNX Runtime's profile.

use crate::error::{Error, Result};
use crate::runtime::{Placement, RuntimeKind};

/// Execution provider that must run at least one node for `ort-cuda` to count as run.
pub const CUDA_PROVIDER: &str = "CUDAExecutionProvider";

/// Fails when `ort-cuda` ran no node on the CUDA execution provider (the run did not
/// really use the GPU). Other runtimes always pass.
pub fn check_placement(kind: RuntimeKind, placement: Option<&Placement>) -> Result<()> {
    if kind != RuntimeKind::OrtCuda {
        return Ok(());
    }
    let on_cuda = placement
        .and_then(|p| p.get(CUDA_PROVIDER))
        .copied()
        .unwrap_or(0);
    if on_cuda > 0 {
        return Ok(());
    }
    let seen = match placement {
        Some(p) if !p.is_empty() => p
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
        Some(_) => "no node at all".into(),
        None => "no profile".into(),
    };
    Err(Error::RuntimeUnavailable {
        runtime: "ort-cuda".into(),
        reason: format!(
            "no node ran on {CUDA_PROVIDER} according to ONNX Runtime's profile ({seen}), so CUDA did not really run"
        ),
        remedy: None,
    })
}
