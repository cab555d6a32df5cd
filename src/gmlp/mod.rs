//! The gMLP / aMLP model: configuration and presets, parameters and their init, graph
//! emission, and an independent reference forward pass. Nothing here knows protobuf.

pub mod config;
pub mod emit;
pub mod reference;
pub mod weights;

pub use config::{preset, presets, GmlpConfig, Precision, Preset, SpatialForm, Task};
pub use emit::build_graph;
pub use weights::{param_specs, InitScheme, ParamSpec, SeededInit, WeightSource};
