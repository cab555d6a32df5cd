"""Stubs of the Rust extension ``gmlp_onnx._native`` (bindings/python/src); the public API
is ``gmlp_onnx`` itself. ``bindings/python/tests/test_stubs.py`` holds these to the module."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

__version__: str

# (name, data_ptr, dtype, shape, strides in elements, owner): gmlp_onnx._sources.TensorRef
_TensorRef = Tuple[str, int, str, Sequence[int], Sequence[int], object]
# (name, dtype, shape, bytes) of an array for numpy.frombuffer
_Array = Tuple[str, str, List[int], bytes]

def main(argv: List[str]) -> int:
    """The `gmlp-onnx` command; returns its exit code."""

def export(
    tensors: Optional[List[_TensorRef]],
    checkpoint: Optional[str],
    label: str,
    output: str,
    options: Optional[Dict[str, Any]],
) -> Dict[str, Any]:
    """The build pipeline from tensors read where they are (or a checkpoint file)."""

def validation_inputs(path: str, options: Optional[Dict[str, Any]] = None) -> Tuple[List[_Array], List[str]]:
    """The inputs validate runs `path` on, and its output names."""

def validate(
    path: str,
    options: Optional[Dict[str, Any]],
    inputs: Optional[List[_TensorRef]],
    expected: Optional[List[_TensorRef]],
    label: Optional[str],
) -> Dict[str, Any]:
    """The validate command's comparison; raises ValidationError on a miss."""

def inspect(path: str) -> str:
    """What `gmlp-onnx inspect --json` prints."""

class Generator:
    """A causal token model loaded once for generating."""

    def __new__(cls, path: str, runtime: str, options: Optional[Dict[str, Any]] = None) -> "Generator": ...
    @property
    def runtime(self) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def max_sequence(self) -> int: ...
    @property
    def eos_token_id(self) -> Optional[int]: ...
    @property
    def note(self) -> Optional[str]: ...
    @property
    def step_form(self) -> Optional[str]: ...
    def start(
        self,
        prompts: List[List[int]],
        max_new_tokens: int,
        sampling: Dict[str, Any],
        eos_token_id: Optional[int] = None,
    ) -> None: ...
    def step(self) -> Optional[List[Optional[int]]]: ...
    def generate(
        self,
        prompts: List[List[int]],
        max_new_tokens: int,
        sampling: Dict[str, Any],
        eos_token_id: Optional[int] = None,
    ) -> List[List[int]]: ...
