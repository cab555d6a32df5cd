//! The gMLP / aMLP model ("Pay Attention to MLPs", Liu et al. 2021): configuration
//! ([`config`]) and the paper's presets ([`presets`](mod@presets)), parameters by name ([`weights`]) and
//! their seeded init ([`init`]), int8 weight quantization ([`quantize`]), Toeplitz spatial weights ([`toeplitz`]), graph emission
//! through the graph builder ([`emit`]), the whole model with its metadata ([`export`],
//! [`metadata`]), the interfaces a graph offers a decoder ([`interface`], onnxruntime-genai's
//! [`genai`]), the `--target` profiles ([`targets`]), and an independent reference forward pass ([`reference`](mod@reference)). Nothing here
//! knows protobuf.

pub mod config;
pub mod emit;
pub mod export;
pub mod genai;
pub mod init;
pub mod interface;
pub mod metadata;
pub mod presets;
pub mod quantize;
pub mod reference;
pub mod targets;
pub mod toeplitz;
pub mod weights;

pub use config::{
    BlockOptions, GateAct, GeluForm, GmlpConfig, NormKind, Precision, SpatialForm, StackKind, Task,
    TokenMixing,
};
pub use emit::{build_graph, build_graph_for, build_graph_in, fused_gap, fused_kernels_apply};
pub use init::{InitScheme, SeededInit};
pub use interface::{Interface, SequenceMode};
pub use presets::{preset, presets, Preset};
pub use weights::{param_specs, ParamSpec, WeightSource};
