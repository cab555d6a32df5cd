"""The stubs (gmlp_onnx/_native.pyi) name what the extension has, with its parameters."""

from __future__ import annotations

import ast
import inspect
import os

import gmlp_onnx
from gmlp_onnx import _native

STUBS = os.path.join(os.path.dirname(__file__), "..", "python", "gmlp_onnx", "_native.pyi")


def _stub_tree():
    with open(STUBS) as f:
        return ast.parse(f.read())


def _parameters(node: ast.FunctionDef) -> list:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args]
    return [n for n in names if n not in ("self", "cls")]


def _runtime_parameters(obj) -> list:
    return [p for p in inspect.signature(obj).parameters if p not in ("self", "cls", "py")]


def test_every_stubbed_function_exists_with_its_parameters():
    tree = _stub_tree()
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert functions
    for node in functions:
        assert hasattr(_native, node.name), node.name
        assert _parameters(node) == _runtime_parameters(getattr(_native, node.name)), node.name


def test_every_stubbed_method_exists_with_its_parameters():
    tree = _stub_tree()
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    runtime = getattr(_native, cls.name)
    for node in cls.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        is_property = any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)
        if node.name == "__new__":
            assert _parameters(node) == _runtime_parameters(runtime), "Generator.__new__"
        elif is_property:
            assert isinstance(inspect.getattr_static(runtime, node.name), type(_native.Generator.runtime)), node.name
        else:
            assert _parameters(node) == _runtime_parameters(getattr(runtime, node.name)), node.name


def test_the_extension_has_nothing_the_stubs_do_not_name():
    tree = _stub_tree()
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    stubbed |= {t.id for n in tree.body if isinstance(n, ast.AnnAssign) for t in [n.target]}
    public = {k for k in dir(_native) if not k.startswith("_")} | {"__version__"}
    assert public == stubbed


def test_the_package_is_typed():
    assert os.path.isfile(os.path.join(os.path.dirname(gmlp_onnx.__file__), "py.typed"))
    assert os.path.isfile(os.path.join(os.path.dirname(gmlp_onnx.__file__), "_native.pyi"))
