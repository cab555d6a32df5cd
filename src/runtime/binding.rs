//! The engine's bound session: buffers made in a session's memory (the host, or a CUDA
//! device), bound by name once as the inputs and outputs of a run, run as often as wanted
//! (a run with the same binding reads and writes the same memory, so that a buffer bound
//! both as an input and as an output is updated in place), written and read by the host.
//! It knows nothing of what the buffers hold: the decoding layer names every tensor, makes
//! every buffer and decides which binding runs when (its static state, src/generation/).
//! ONNX Runtime's I/O binding is the one implementation ([`super::onnxruntime::OrtBound`]).

use crate::error::Result;

/// The element types a buffer of a [`BoundSession`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// float32 (logits, states).
    F32,
    /// int64 (token ids, positions).
    I64,
}

/// A buffer of one [`BoundSession`] ([`BoundSession::buffer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BufferId(pub(crate) usize);

/// A binding of one [`BoundSession`] ([`BoundSession::bind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BindingId(pub(crate) usize);

/// How a binding's runs go on a session with CUDA graphs on
/// ([`CudaOptions::graphs`](super::CudaOptions::graphs)); elsewhere both run as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    /// Every run as it is (ONNX Runtime's `gpu_graph_id` −1).
    Uncaptured,
    /// Captured as a CUDA graph of its own (the session numbers them) after a warm-up
    /// run, then replayed: every buffer of the binding stays at its address, so the host
    /// writes its inputs in place.
    Captured,
}

/// A session whose runs go through buffers bound once (ONNX Runtime's I/O binding, on the
/// host or the CUDA device), so that a run copies nothing it is not asked to.
///
/// An input bound from a buffer is read where the buffer is only if the session wants it
/// in that memory; otherwise ONNX Runtime copies it at bind time. Such an input is bound
/// again before every run, and [`BoundSession::bind`] refuses it where that cannot work:
/// bound also as an output (it would not be updated in place). A session with CUDA graphs
/// refuses to open where any input is read elsewhere (a graph replays fixed addresses).
pub trait BoundSession: Send {
    /// Runtime name for reports.
    fn name(&self) -> &str;
    /// Whether bindings of [`Replay::Captured`] are captured and replayed as CUDA graphs.
    fn captures(&self) -> bool;
    /// A new buffer of `shape`, zeroed, in the session's memory.
    fn buffer(&mut self, element: Element, shape: &[usize]) -> Result<BufferId>;
    /// Frees `buffer` (after the bindings that name it, [`BoundSession::unbind`]).
    fn release(&mut self, buffer: BufferId);
    /// A binding of `inputs` and `outputs` (name, buffer), run as `replay` says; a buffer
    /// may be both an input and an output (written in place).
    fn bind(
        &mut self,
        inputs: &[(&str, BufferId)],
        outputs: &[(&str, BufferId)],
        replay: Replay,
    ) -> Result<BindingId>;
    /// Forgets `binding`.
    fn unbind(&mut self, binding: BindingId);
    /// Runs `binding`: what the host wrote is on the device first, and the run's outputs
    /// are in their buffers when this returns. If it fails, outputs may be partly written.
    fn run(&mut self, binding: BindingId) -> Result<()>;
    /// Writes `values` over the whole int64 `buffer`.
    fn write_i64(&mut self, buffer: BufferId, values: &[i64]) -> Result<()>;
    /// Reads `out.len()` values of the int64 `buffer` from element `offset`.
    fn read_i64(&self, buffer: BufferId, offset: usize, out: &mut [i64]) -> Result<()>;
    /// Reads `out.len()` values of the float32 `buffer` from element `offset`.
    fn read_f32(&self, buffer: BufferId, offset: usize, out: &mut [f32]) -> Result<()>;
    /// Sets every element of `buffer` to zero.
    fn zero(&mut self, buffer: BufferId) -> Result<()>;
}
