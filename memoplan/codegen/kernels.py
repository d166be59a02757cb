"""Codegen stage: renders the Triton codec kernels (``bit`` pack/unpack, ``uint8``) from templates.

The generated modules live in :mod:`memoplan.runtime.kernels` and are committed;
this module is how they are made and checked::

    python -m memoplan.codegen.kernels            # rewrite memoplan/runtime/kernels/*.py
    python -m memoplan.codegen.kernels --check    # exit 1 if the committed files differ

Every decision is made here, in Python: which dtypes get a kernel, the type a
kernel computes in, the block sizes the CUDA autotuner tries and the block the
explicit (CPU / ``TRITON_INTERPRET=1``) launcher uses.  The templates under
``memoplan/codegen/templates/kernels/`` only print these values.  Output is
deterministic (no timestamps, sorted), so regenerating gives byte-identical files.

The layouts the kernels write are the normative ones of
:mod:`memoplan.runtime.codecs` (see its module docstring); ``docs/kernels.md``
describes the kernels, the launchers and how the tests run them on CPU.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from memoplan.codegen.render import render
from memoplan.targets import replace_file
from memoplan.version import __version__

__all__ = [
    "DTYPES",
    "KERNEL_FILES",
    "BlockConfig",
    "DtypeSpec",
    "check_kernels",
    "kernels_dir",
    "main",
    "render_kernels",
    "write_kernels",
]

#: generated file name -> template (relative to memoplan/codegen/templates), in the order they are written.
KERNEL_FILES: dict[str, str] = {
    "__init__.py": "kernels/__init__.py.j2",
    "bit.py": "kernels/bit.py.j2",
    "uint8.py": "kernels/uint8.py.j2",
}

# Elements one CUDA program handles, for the configs the autotuner tries: from 2048 (4 warps,
# 16 elements a thread) to 16384 (8 warps, 64 elements a thread, still cheap in registers).
# One element list for every dtype keeps register use bounded; the bytes a tile moves
# then scale with the itemsize, and the autotuner picks per dtype and size class.
_CUDA_TILE_ELEMENTS = (2048, 4096, 8192, 16384)
_EIGHT_WARPS_FROM = 8192  # tiles of at least this many elements get 8 warps, smaller ones 4
# The explicit launcher's default in interpret mode: each program is one numpy step,
# so a few large programs are fastest; tests pass small blocks to cross program borders.
_INTERPRET_PACK_BLOCK = 64  # bytes of packed output (512 elements) per program
_INTERPRET_ELEMENT_BLOCK = 512  # elements per program for the uint8 kernels


@dataclass(frozen=True)
class BlockConfig:
    """One ``triton.Config``: the ``BLOCK`` constexpr and the warps per program."""

    block: int
    num_warps: int


@dataclass(frozen=True)
class DtypeSpec:
    """How the kernels handle one input dtype (all strings are printed verbatim)."""

    name: str  # "float32": the suffix of the kernel names
    torch_dtype: str  # "torch.float32"
    # dtype the kernel's pointers see: torch.bool tensors are passed as their uint8 bytes
    # (torch stores bool as 0/1 bytes), which every Triton version loads the same way.
    kernel_view: str | None
    compute: str  # Triton type the values are compared / rounded in
    # Cast chain from an integer tile (0/1 bits, 0..255 bytes) to the stored dtype.  Through
    # float32 for bfloat16: Triton's interpreter keeps bfloat16 as raw uint16 bits and
    # supports only the float32 <-> bfloat16 cast on them (triton-lang/triton#3811,
    # #4972), so an int -> bfloat16 cast there writes the integer as bits.  On the GPU
    # both casts are exact and cost one instruction each.
    store_cast: str
    binary_only: bool  # True for bool: the binariness check can never fail
    # uint8 codec: "round" = clamp(round_half_even(x), 0, 255) with NaN -> 0; "copy" = the 0/1 bytes.
    uint8_encode: str
    # uint8 decode: "convert" = uint8 -> dtype; "nonzero" = byte != 0 (torch's cast to bool).
    uint8_decode: str
    pack_configs: tuple[BlockConfig, ...]  # BLOCK = packed bytes per program
    unpack_configs: tuple[BlockConfig, ...]  # BLOCK = packed bytes per program
    element_configs: tuple[BlockConfig, ...]  # BLOCK = elements per program (uint8 codec)

    @property
    def min_pack_block(self) -> int:
        """Smallest autotuned pack ``BLOCK``: sizes the per-program flags of the checked pack."""
        return min(c.block for c in self.pack_configs)


def _configs(elements_per_block: int) -> tuple[BlockConfig, ...]:
    """Autotune configs for tiles of :data:`_CUDA_TILE_ELEMENTS`; ``BLOCK`` counts units of ``elements_per_block``."""
    return tuple(
        BlockConfig(tile // elements_per_block, 8 if tile >= _EIGHT_WARPS_FROM else 4) for tile in _CUDA_TILE_ELEMENTS
    )


_STORE_CASTS = {"bfloat16": ".to(tl.float32).to(tl.bfloat16)", "bool": ".to(tl.uint8)"}


def _spec(name: str, *, is_bool: bool = False) -> DtypeSpec:
    return DtypeSpec(
        name=name,
        torch_dtype=f"torch.{name}",
        kernel_view="torch.uint8" if is_bool else None,
        # float16/bfloat16 are widened exactly to float32: the comparisons and the
        # round-half-even then run in one type on every backend (the interpreter keeps
        # bfloat16 as raw uint16 bits, so comparing in bfloat16 there would be wrong).
        compute="tl.uint8" if is_bool else "tl.float32",
        store_cast=_STORE_CASTS.get(name, f".to(tl.{name})"),
        binary_only=is_bool,
        uint8_encode="copy" if is_bool else "round",
        uint8_decode="nonzero" if is_bool else "convert",
        pack_configs=_configs(8),
        unpack_configs=_configs(8),
        element_configs=_configs(1),
    )


#: The dtypes that get kernels; any other dtype stays on the torch path of codecs.py.
DTYPES: tuple[DtypeSpec, ...] = (
    _spec("float32"),
    _spec("float16"),
    _spec("bfloat16"),
    _spec("bool", is_bool=True),
)


def _template_path(template: str) -> str:
    return f"memoplan/codegen/templates/{template}"


def render_kernels() -> dict[str, str]:
    """Every generated kernel file: file name -> source text (deterministic)."""
    context = {
        "version": __version__,
        "dtypes": DTYPES,
        "interpret_pack_block": _INTERPRET_PACK_BLOCK,
        "interpret_element_block": _INTERPRET_ELEMENT_BLOCK,
        "modules": tuple(name[: -len(".py")] for name in KERNEL_FILES if name != "__init__.py"),
    }
    files = {}
    for name, template in KERNEL_FILES.items():
        files[name] = render(template, source=_template_path(template), **context)
    return files


def kernels_dir() -> Path:
    """``memoplan/runtime/kernels`` of the package this module belongs to."""
    return Path(__file__).resolve().parents[1] / "runtime" / "kernels"


def write_kernels(directory: Path | None = None) -> list[Path]:
    """Write :func:`render_kernels` into ``directory`` (default :func:`kernels_dir`); unchanged files are left alone."""
    directory = kernels_dir() if directory is None else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_kernels().items():
        path = directory / name
        data = text.encode("utf-8")
        if not path.exists() or path.read_bytes() != data:
            replace_file(path, data)
        written.append(path)
    return written


def check_kernels(directory: Path | None = None) -> list[str]:
    """Problems with the committed files in ``directory``: missing, different or stale; empty when up to date."""
    directory = kernels_dir() if directory is None else Path(directory)
    expected = render_kernels()
    problems = []
    for name, text in expected.items():
        path = directory / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.read_bytes() != text.encode("utf-8"):
            problems.append(f"{name}: differs from {_template_path(KERNEL_FILES[name])}")
    for path in sorted(directory.glob("*.py")):
        if path.name not in expected:
            problems.append(f"{path.name}: not generated by any template (stale?)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memoplan.codegen.kernels",
        description="Regenerate (or check) the Triton codec kernels in memoplan/runtime/kernels.",
    )
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    parser.add_argument("--dir", type=Path, default=None, help="output folder (default: memoplan/runtime/kernels)")
    args = parser.parse_args(argv)
    if args.check:
        problems = check_kernels(args.dir)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("regenerate with: python -m memoplan.codegen.kernels", file=sys.stderr)
            return 1
        print("kernels up to date")
        return 0
    for path in write_kernels(args.dir):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
