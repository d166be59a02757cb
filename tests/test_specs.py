"""Tests for spec loading: every spec form, inline example tensors, and every MP5xx error."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from memoplan.diagnostics import PlanError, Span
from memoplan.examples import cnn, transformer
from memoplan.specs import Example, load_callable, load_example, load_model, make_example
from memoplan.syntax.ast import ExampleStmt, TensorFn, TensorSpec

SPAN = Span("plan.memplan", 3, 7, 3, 30)

MODELS_PY = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x, scale=1.0):
        return self.fc(x) * scale

    @classmethod
    def factory(cls):
        return cls()

def build():
    return Net()

def inputs():
    return (torch.ones(3, 4),)

def inputs_list():
    return [torch.ones(3, 4)]

def one_tensor():
    return torch.zeros(2, 4)

def with_kwargs():
    from memoplan.specs import Example
    return Example((torch.ones(3, 4),), {"scale": 2.0})

def boom():
    raise RuntimeError("out of coffee")

def needs_arg(x):
    return Net()

def returns_int():
    return 42

def returns_dict():
    return {"x": torch.ones(1)}

NUMBER = 7
TENSOR = torch.ones(2, 4)
INSTANCE = Net()
"""


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    (tmp_path / "models.py").write_text(MODELS_PY)
    return tmp_path


def _error(excinfo: pytest.ExceptionInfo[PlanError], code: str):
    err = excinfo.value
    assert err.codes == [code], err.render()
    (diag,) = err.diagnostics
    return diag


# ---------------------------------------------------------------- spec forms


def test_module_spec() -> None:
    model = load_model("memoplan.examples.cnn:build")
    assert isinstance(model, cnn.CNN)
    example = load_example("memoplan.examples.cnn:example")
    assert isinstance(example, Example)
    assert example.args[0].shape == (8, 3, 32, 32) and dict(example.kwargs) == {}


def test_module_spec_class_and_dotted() -> None:
    assert isinstance(load_model("memoplan.examples.cnn:CNN"), cnn.CNN)
    assert isinstance(load_model("torch.nn:Identity"), nn.Identity)
    fn = load_callable("memoplan.specs:Example.to")
    assert fn is Example.to


def test_module_spec_found_via_base_dir(models_dir: Path) -> None:
    # `models` is not importable from sys.path, only from the plan's folder.
    (models_dir / "plan_local_mod_xyz.py").write_text("from torch import nn\ndef build():\n    return nn.Identity()\n")
    model = load_model("plan_local_mod_xyz:build", base_dir=models_dir)
    assert isinstance(model, nn.Identity)
    assert str(models_dir) not in sys.path  # the path was only added for the import


def test_file_spec_relative_to_base_dir(models_dir: Path) -> None:
    model = load_model("models.py:build", base_dir=models_dir)
    assert type(model).__name__ == "Net"
    out = load_example("models.py:inputs", base_dir=models_dir).run(model)
    assert out.shape == (3, 2)


def test_file_spec_relative_to_cwd(models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(models_dir.parent)
    model = load_model(f"{models_dir.name}/models.py:build")
    assert type(model).__name__ == "Net"


def test_file_spec_absolute_and_in_subfolder(tmp_path: Path) -> None:
    sub = tmp_path / "nets"
    sub.mkdir()
    (sub / "tiny.py").write_text(
        "from torch import nn\nclass Tiny(nn.Linear):\n    def __init__(self):\n        super().__init__(2, 2)\n"
    )
    assert isinstance(load_model(str(sub / "tiny.py") + ":Tiny"), nn.Linear)
    assert isinstance(load_model("nets/tiny.py:Tiny", base_dir=tmp_path), nn.Linear)


def test_file_spec_dotted_callable_and_class(models_dir: Path) -> None:
    via_factory = load_model("models.py:Net.factory", base_dir=models_dir)
    via_class = load_model("models.py:Net", base_dir=models_dir)
    assert type(via_factory) is type(via_class)
    assert type(via_class).__name__ == "Net"


def test_file_loaded_once_under_private_name(models_dir: Path) -> None:
    before = set(sys.modules)
    a = load_model("models.py:build", base_dir=models_dir)
    b = load_model(str(models_dir / "models.py") + ":Net", base_dir=Path("/elsewhere"))
    c = load_model("./models.py:Net", base_dir=models_dir)
    assert type(a) is type(b) is type(c)  # same class object: loaded once per resolved path
    assert "models" not in sys.modules
    new = set(sys.modules) - before
    assert all(name.startswith("_memoplan_file_models_") for name in new)
    assert type(a).__module__ in sys.modules


def test_file_may_import_its_siblings(tmp_path: Path) -> None:
    (tmp_path / "helper_sibling_abc.py").write_text("WIDTH = 5\n")
    (tmp_path / "net.py").write_text(
        "from torch import nn\nfrom helper_sibling_abc import WIDTH\ndef build():\n    return nn.Linear(WIDTH, 1)\n"
    )
    assert load_model("net.py:build", base_dir=tmp_path).in_features == 5


def test_model_instance_is_returned_as_is(models_dir: Path) -> None:
    first = load_model("models.py:INSTANCE", base_dir=models_dir)
    assert first is load_model("models.py:INSTANCE", base_dir=models_dir)


def test_example_result_forms(models_dir: Path) -> None:
    def load(name: str) -> Example:
        return load_example(f"models.py:{name}", base_dir=models_dir)

    assert [a.shape for a in load("inputs").args] == [(3, 4)]
    assert [a.shape for a in load("inputs_list").args] == [(3, 4)]
    assert [a.shape for a in load("one_tensor").args] == [(2, 4)]
    assert [a.shape for a in load("TENSOR").args] == [(2, 4)]
    kw = load("with_kwargs")
    assert dict(kw.kwargs) == {"scale": 2.0}
    model = load_model("models.py:build", base_dir=models_dir)
    torch.testing.assert_close(kw.run(model), model(torch.ones(3, 4)) * 2.0)


def test_example_with_keyword_arguments() -> None:
    example = load_example("memoplan.examples.transformer:example_with_mask")
    assert set(example.kwargs) == {"attention_mask"}
    out = example.run(transformer.build())
    assert out.shape == (4, 32, transformer.VOCAB)


def test_example_dataclass() -> None:
    x = torch.ones(2)
    example = Example([x], {"k": x})
    assert example.args == (x,)
    with pytest.raises(TypeError):
        example.kwargs["k"] = 1  # type: ignore[index]
    assert Example((x,)).kwargs == {}
    moved = example.to("cpu")
    assert moved.args[0].device.type == "cpu" and "k" in moved.kwargs


# ---------------------------------------------------------------- inline tensors


def _stmt(*tensors: TensorSpec) -> ExampleStmt:
    return ExampleStmt(tensors=tensors, span=SPAN)


def test_inline_tensors_shapes_and_default_dtypes() -> None:
    example = make_example(
        _stmt(
            TensorSpec(TensorFn.RANDN, (4, 3, 8, 8)),
            TensorSpec(TensorFn.RAND, (2, 5)),
            TensorSpec(TensorFn.RANDINT, (4, 16), high=100),
            TensorSpec(TensorFn.ZEROS, (3,)),
            TensorSpec(TensorFn.ONES, (2, 2)),
        )
    )
    randn, rand, ids, zeros, ones = example.args
    assert randn.shape == (4, 3, 8, 8) and randn.dtype == torch.float32
    assert rand.shape == (2, 5) and rand.dtype == torch.float32
    assert 0 <= rand.min() and rand.max() < 1
    assert ids.shape == (4, 16) and ids.dtype == torch.int64 and 0 <= ids.min() and ids.max() < 100
    assert torch.equal(zeros, torch.zeros(3))
    assert torch.equal(ones, torch.ones(2, 2))
    assert dict(example.kwargs) == {}


@pytest.mark.parametrize(
    ("spec", "dtype"),
    [
        (TensorSpec(TensorFn.RANDN, (2, 3), dtype="float16"), torch.float16),
        (TensorSpec(TensorFn.RANDN, (2, 3), dtype="bfloat16"), torch.bfloat16),
        (TensorSpec(TensorFn.RAND, (2, 3), dtype="float64"), torch.float64),
        (TensorSpec(TensorFn.RANDINT, (2, 3), high=2, dtype="bool"), torch.bool),
        (TensorSpec(TensorFn.RANDINT, (2, 3), low=-5, high=5, dtype="int32"), torch.int32),
        (TensorSpec(TensorFn.RANDINT, (2, 3), high=9, dtype="float32"), torch.float32),
        (TensorSpec(TensorFn.ZEROS, (2, 3), dtype="int64"), torch.int64),
        (TensorSpec(TensorFn.ONES, (2, 3), dtype="bool"), torch.bool),
    ],
)
def test_inline_tensor_dtypes(spec: TensorSpec, dtype: torch.dtype) -> None:
    (tensor,) = make_example(_stmt(spec)).args
    assert tensor.dtype == dtype and tensor.shape == (2, 3)


def test_inline_randint_bounds() -> None:
    (t,) = make_example(_stmt(TensorSpec(TensorFn.RANDINT, (1000,), low=-3, high=4))).args
    assert t.min() >= -3 and t.max() <= 3
    assert set(t.tolist()) == set(range(-3, 4))


def test_inline_tensors_are_deterministic_per_seed() -> None:
    stmt = _stmt(TensorSpec(TensorFn.RANDN, (4, 4)), TensorSpec(TensorFn.RANDINT, (8,), high=1000))
    a = make_example(stmt, seed=1)
    b = make_example(stmt, seed=1)
    c = make_example(stmt, seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.args, b.args))
    assert not torch.equal(a.args[0], c.args[0])
    # The global RNG is neither used nor disturbed.
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    make_example(stmt)
    assert torch.equal(torch.rand(3), expected)


def test_make_example_from_spec(models_dir: Path) -> None:
    example = make_example(ExampleStmt(spec="models.py:inputs", span=SPAN), base_dir=models_dir)
    assert example.args[0].shape == (3, 4)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (TensorSpec(TensorFn.RANDN, (2,), dtype="flaot16"), ["unknown dtype", "flaot16"]),
        (TensorSpec(TensorFn.RANDN, (2,), dtype="int64"), ["floating-point", "int64"]),
        (TensorSpec(TensorFn.RANDINT, (2,)), ["needs `high`"]),
        (TensorSpec(TensorFn.RANDINT, (2,), low=5, high=5), ["less than"]),
        (TensorSpec(TensorFn.ZEROS, (2,), high=5), ["only apply to randint"]),
        (TensorSpec(TensorFn.ONES, (2, -1)), ["negative"]),
    ],
)
def test_inline_tensor_errors(spec: TensorSpec, words: list[str]) -> None:
    with pytest.raises(PlanError) as excinfo:
        make_example(_stmt(TensorSpec(TensorFn.ZEROS, (1,)), spec))
    diag = _error(excinfo, "MP501")
    assert "example tensor 2" in diag.message
    assert all(w in diag.message for w in words), diag.message
    assert diag.span == SPAN


def test_unknown_dtype_did_you_mean() -> None:
    with pytest.raises(PlanError) as excinfo:
        make_example(_stmt(TensorSpec(TensorFn.RANDN, (2,), dtype="flaot16")))
    assert "float16" in (_error(excinfo, "MP501").help or "")


def test_empty_example_statement() -> None:
    with pytest.raises(PlanError) as excinfo:
        make_example(ExampleStmt())
    assert _error(excinfo, "MP501").span is None  # an in-memory node has no real span


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("spec", "words", "help_word"),
    [
        ("memoplan.examples.cnn.build", ["no `:`"], "memoplan.examples.cnn:build"),
        ("models.py", ["no `:`"], "models.py:build"),
        (":build", ["nothing before"], None),
        ("memoplan.examples.cnn:", ["no callable"], "memoplan.examples.cnn:build"),
        ("memoplan.examples.cnn:bu-ild", ["not a (dotted) Python name"], None),
        ("memoplan examples:build", ["neither a module name"], None),
        ("", ["no `:`"], None),
    ],
)
def test_mp501_malformed(spec: str, words: list[str], help_word: str | None) -> None:
    with pytest.raises(PlanError) as excinfo:
        load_model(spec, span=SPAN)
    diag = _error(excinfo, "MP501")
    assert all(w in diag.message for w in words), diag.message
    if help_word:
        assert help_word in (diag.help or "")
    assert diag.span == SPAN
    assert "plan.memplan:3:7: error[MP501]" in str(excinfo.value)


def test_mp502_missing_submodule_did_you_mean() -> None:
    with pytest.raises(PlanError) as excinfo:
        load_model("memoplan.examples.cnnn:build", span=SPAN)
    diag = _error(excinfo, "MP502")
    assert "memoplan.examples.cnnn" in diag.message and "not found" in diag.message
    assert "memoplan.examples.cnn" in (diag.help or "")
    assert diag.span == SPAN


def test_mp502_missing_package_did_you_mean() -> None:
    with pytest.raises(PlanError) as excinfo:
        load_model("memoplam.examples.cnn:build")
    diag = _error(excinfo, "MP502")
    assert "`memoplam` not found" in diag.message
    assert "memoplan" in (diag.help or "")


def test_mp502_missing_file_did_you_mean(models_dir: Path) -> None:
    with pytest.raises(PlanError) as excinfo:
        load_model("modles.py:build", base_dir=models_dir, span=SPAN)
    diag = _error(excinfo, "MP502")
    assert "modles.py" in diag.message and "not found" in diag.message
    assert "models.py" in (diag.help or "")
    assert diag.span == SPAN


def test_mp502_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as excinfo:
        load_model("nowhere/models.py:build", base_dir=tmp_path)
    diag = _error(excinfo, "MP502")
    assert "does not exist" in (diag.help or "")


def test_mp502_not_a_python_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "pkgdir.py").mkdir()
    with pytest.raises(PlanError) as excinfo:
        load_model("./notes.txt:build", base_dir=tmp_path)
    assert "not a Python source file" in _error(excinfo, "MP502").message
    with pytest.raises(PlanError) as excinfo:
        load_model("pkgdir.py:build", base_dir=tmp_path)
    assert "is a directory" in _error(excinfo, "MP502").message


def test_mp503_missing_attribute(models_dir: Path) -> None:
    with pytest.raises(PlanError) as excinfo:
        load_model("models.py:biuld", base_dir=models_dir, span=SPAN)
    diag = _error(excinfo, "MP503")
    assert "`models.py` has no attribute `biuld`" in diag.message
    assert "build" in (diag.help or "")
    assert diag.span == SPAN


def test_mp503_missing_dotted_attribute() -> None:
    with pytest.raises(PlanError) as excinfo:
        load_model("memoplan.examples.cnn:CNN.fatory")
    diag = _error(excinfo, "MP503")
    assert "`memoplan.examples.cnn:CNN` has no attribute `fatory`" in diag.message
    with pytest.raises(PlanError) as excinfo:
        load_model("memoplan.examples.cnn:biuld")
    assert "build" in (_error(excinfo, "MP503").help or "")


def test_mp504_callable_raised(models_dir: Path) -> None:
    with pytest.raises(PlanError) as excinfo:
        load_model("models.py:boom", base_dir=models_dir, span=SPAN)
    diag = _error(excinfo, "MP504")
    assert "RuntimeError" in diag.message and "out of coffee" in diag.message
    assert "models.py:boom" in diag.message
    assert diag.span == SPAN
    assert isinstance(excinfo.value.__cause__, RuntimeError)


def test_mp504_callable_needs_arguments(models_dir: Path) -> None:
    with pytest.raises(PlanError) as excinfo:
        load_example("models.py:needs_arg", base_dir=models_dir)
    diag = _error(excinfo, "MP504")
    assert "TypeError" in diag.message
    assert "no arguments" in (diag.help or "")


def test_mp504_file_raises_on_import(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise ValueError('bad config')\n")
    (tmp_path / "syntax.py").write_text("def build(:\n")
    (tmp_path / "deps.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(PlanError) as excinfo:
        load_model("broken.py:build", base_dir=tmp_path)
    assert "ValueError: bad config" in _error(excinfo, "MP504").message
    with pytest.raises(PlanError) as excinfo:
        load_model("syntax.py:build", base_dir=tmp_path)
    assert "SyntaxError" in _error(excinfo, "MP504").message
    with pytest.raises(PlanError) as excinfo:
        load_model("deps.py:build", base_dir=tmp_path)
    assert "no_such_dependency_xyz" in _error(excinfo, "MP504").message
    # A failed import leaves no module behind (only this test's files: other tests may have
    # loaded a working file of the same name, which stays imported).
    left = [
        name
        for name, module in list(sys.modules.items())
        if name.startswith("_memoplan_file_") and str(getattr(module, "__file__", "")).startswith(str(tmp_path))
    ]
    assert left == []


def test_mp504_module_raises_on_import(tmp_path: Path) -> None:
    (tmp_path / "bad_mod_import_qrs.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(PlanError) as excinfo:
        load_model("bad_mod_import_qrs:build", base_dir=tmp_path)
    diag = _error(excinfo, "MP504")
    assert "ModuleNotFoundError" in diag.message and "no_such_dependency_xyz" in diag.message


def test_mp505_model_wrong_type(models_dir: Path) -> None:
    with pytest.raises(PlanError) as excinfo:
        load_model("models.py:returns_int", base_dir=models_dir, span=SPAN)
    diag = _error(excinfo, "MP505")
    assert "returned a value of type `int`" in diag.message and "nn.Module" in diag.message
    assert diag.span == SPAN
    with pytest.raises(PlanError) as excinfo:
        load_model("models.py:inputs", base_dir=models_dir)
    assert "tuple" in _error(excinfo, "MP505").message
    with pytest.raises(PlanError) as excinfo:
        load_model("models.py:NUMBER", base_dir=models_dir)
    assert "int" in _error(excinfo, "MP505").message


def test_mp505_example_wrong_type(models_dir: Path) -> None:
    with pytest.raises(PlanError) as excinfo:
        load_example("models.py:returns_dict", base_dir=models_dir)
    diag = _error(excinfo, "MP505")
    assert "dict" in diag.message and "Tensor" in diag.message and "Example" in diag.message
    with pytest.raises(PlanError) as excinfo:
        load_example("models.py:NUMBER", base_dir=models_dir)
    assert "int" in _error(excinfo, "MP505").message


def test_mp505_not_callable(models_dir: Path) -> None:
    with pytest.raises(PlanError) as excinfo:
        load_callable("models.py:NUMBER", base_dir=models_dir)
    assert "not a callable" in _error(excinfo, "MP505").message


def test_errors_from_example_statement_point_at_it(models_dir: Path) -> None:
    with pytest.raises(PlanError) as excinfo:
        make_example(ExampleStmt(spec="models.py:nope", span=SPAN), base_dir=models_dir)
    assert _error(excinfo, "MP503").span == SPAN


def test_rendering_has_no_traceback(models_dir: Path) -> None:
    source = textwrap.dedent(
        """\
        version 1

        model "models.py:boom"
        """
    )
    with pytest.raises(PlanError) as excinfo:
        load_model("models.py:boom", base_dir=models_dir, span=SPAN)
    err = PlanError(excinfo.value.diagnostics, source=source)
    text = err.render()
    assert "Traceback" not in text
    assert text.startswith("plan.memplan:3:7: error[MP504]")
    assert "^" in text
