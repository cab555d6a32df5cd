//! Serving built models: [`triton`] puts an ONNX file into a Triton Inference Server model
//! repository (configuration, the served model with Triton's state interface, the atomic
//! write); [`genai`] writes an onnxruntime-genai model folder.

pub mod genai;
pub mod triton;
