//! Op forms: how the builder spells an operation when a consumer lacks an operator or reads
//! one of its forms wrongly. The defaults are the operators themselves; a target profile
//! (chosen by the model layer) can ask for primitive spellings. Whatever the forms, the
//! opset decides what is valid: below opset 17 there is no `LayerNormalization`, so it is
//! always decomposed there.

/// How `LayerNormalization` is emitted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LayerNormForm {
    /// The `LayerNormalization` operator (opset ≥ 17); decomposed below 17 regardless.
    #[default]
    Operator,
    /// Primitive ops at every opset: mean, `Sub`, `Mul`, mean, `Add` ε, `Sqrt`, `Div`, `Mul`
    /// scale, `Add` shift (for consumers without the operator, e.g. candle-onnx 0.11).
    Decomposed,
}

/// How a mean over some axes is emitted (the decomposed LayerNorm's two means and any
/// other mean the model asks for).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MeanForm {
    /// `ReduceMean` in its opset's own form: `axes` attribute up to 17, input from 18.
    #[default]
    ReduceMean,
    /// `ReduceSum` (whose `axes` has been an input since opset 13, so it has one form over
    /// the whole range) followed by `Div` by the element count. For consumers that read
    /// only `ReduceMean`'s attribute form and silently reduce over every axis when given
    /// the opset-18 input (candle-onnx 0.11): this spelling reads the same at every opset.
    SumThenDivide,
}

/// Whether the model may be spelled with ONNX Runtime's fused operators (its contrib
/// operators such as `SkipLayerNormalization`, `MatMulNBits` with its bias, ONNX
/// `Attention`) where they replace several nodes by one kernel: for a file meant for ONNX
/// Runtime alone, whose every node is at least one kernel launch on a GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fusions {
    /// Standard ONNX operators node by node, which every consumer reads.
    #[default]
    Standard,
    /// ONNX Runtime's fused kernels where the model layer has a fused form.
    OnnxRuntime,
}

/// How a projection of non-overlapping square patches to tokens (a vision stem) is emitted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PatchForm {
    /// `Conv` with the patch as kernel and stride, then `Reshape` and `Transpose` to
    /// tokens: the form every consumer reads.
    #[default]
    Conv,
    /// The patches cut out of the image by `Reshape`, `Transpose` and `Reshape` (through a
    /// rank-6 tensor) and projected by one `MatMul` with the conv weight, reshaped and
    /// transposed by nodes on the constant (which a runtime folds at load), then its bias:
    /// the tokens come out token-major with no transpose after them. tract 0.23 pushes the
    /// `Conv` form's transpose into the residual stream, carries it channel-major and moves
    /// axes around every block's products (gmlp-ti16's forward: 58.3 against 50.5 ms of
    /// tract's node time a run; BENCHMARKS.md, "tract and ONNX Runtime: tract at its own
    /// limit").
    MatMul,
}

/// The op forms a graph is built with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpForms {
    /// LayerNormalization.
    pub layer_norm: LayerNormForm,
    /// Means.
    pub mean: MeanForm,
    /// Fused operators.
    pub fusions: Fusions,
    /// Patch projections.
    pub patch: PatchForm,
}
