"""Codecs for compressed saved inputs: layouts, round trips, sizes and the MP405 error path."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from _imports import imported_modules  # tests/_imports.py
from _paths import ROOT
from _profiles import n_examples  # tests/_profiles.py: the hypothesis profile
from hypothesis import given, settings
from hypothesis import strategies as st

from memoplan.diagnostics import PlanError
from memoplan.runtime import codec_checks, codec_impls, codecs
from memoplan.runtime.codecs import (
    SAMPLE_LIMIT,
    CodecError,
    Payload,
    choose,
    decode,
    encode,
    estimate_nbytes,
    is_binary,
    sample_indices,
)

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
DTYPES = FLOATS + [torch.bool, torch.uint8, torch.int64]
LOSSLESS = ["none", "bool", "uint8", "bit", "sparse"]
SHAPES = [(), (0,), (3, 0, 2), (1,), (7,), (9,), (63,), (65,), (1000,), (4097,), (5, 7, 3)]


@pytest.fixture(autouse=True)
def _fresh_validation_state():
    codecs.reset_validation()
    yield
    codecs.reset_validation()


def binary(shape, dtype, seed=0, density=0.5):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) < density).to(dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape, device and bit pattern (NaN == NaN, -0.0 != 0.0)."""
    if (a.dtype, a.shape, a.device) != (b.dtype, b.shape, b.device):
        return False
    if a.dtype.is_floating_point:
        view = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)


def reference_pack(values: list[int]) -> list[int]:
    """The documented bit layout, element by element: i -> byte i // 8, bit i % 8."""
    out = [0] * ((len(values) + 7) // 8)
    for i, v in enumerate(values):
        out[i // 8] |= (1 if v != 0 else 0) << (i % 8)
    return out


def noncontiguous_views(x: torch.Tensor) -> list[torch.Tensor]:
    """Transposed, strided-slice, permuted (channels-last style) and expanded views."""
    views = []
    if x.dim() >= 2:
        views.append(x.transpose(0, 1))
    if x.dim() >= 1 and x.shape[0] >= 2:
        views.append(x[::2])
    if x.dim() == 3:
        views.append(x.permute(2, 0, 1))
    if x.dim() >= 1 and x.numel() > 0:
        views.append(x.unsqueeze(0).expand(2, *x.shape))
    return views


# ---------------------------------------------------------------- round trips


def pairwise(*factors: list) -> list[tuple]:
    """Cases in which every pair of values of any two factors occurs at least once.

    Each pair of factors (i, j) is walked in full, the remaining factor taking the value that
    rotates with the pair's position, so the full product's two-factor interactions are all
    covered with a small fraction of its cases (in the order they were first made)."""
    cases: dict[tuple, None] = {}
    n = len(factors)
    for i in range(n):
        for j in range(i + 1, n):
            for a, va in enumerate(factors[i]):
                for b, vb in enumerate(factors[j]):
                    case = [f[(a + b + k) % len(f)] for k, f in enumerate(factors)]
                    case[i], case[j] = va, vb
                    cases[tuple(case)] = None
    return list(cases)


# Every codec with every dtype, every codec with every shape and every dtype with every shape:
# the pairs the full product (5 x 7 x 11 = 385 cases) would test, in far fewer cases.
ROUND_TRIPS = pairwise(LOSSLESS, DTYPES, SHAPES)


def test_round_trip_cases_cover_every_pair():
    for (i, fi), (j, fj) in [((0, LOSSLESS), (1, DTYPES)), ((0, LOSSLESS), (2, SHAPES)), ((1, DTYPES), (2, SHAPES))]:
        assert {(c[i], c[j]) for c in ROUND_TRIPS} == {(a, b) for a in fi for b in fj}
    assert len(ROUND_TRIPS) < 385 // 2


@pytest.mark.parametrize(("codec", "dtype", "shape"), ROUND_TRIPS, ids=str)
def test_lossless_round_trip_binary(codec, dtype, shape):
    x = binary(shape, dtype)
    p = encode(x, codec, where="m")
    assert p.codec == codec
    y = decode(p)
    assert same(y, x)
    assert not y.requires_grad


@pytest.mark.parametrize("codec", LOSSLESS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lossless_round_trip_noncontiguous(codec, dtype):
    base = binary((6, 5, 4), dtype, seed=3)
    for view in noncontiguous_views(base):
        assert not view.is_contiguous()
        p = encode(view, codec, where="m", validate="always")
        assert same(decode(p), view)


def test_none_keeps_a_reference():
    x = torch.randn(4, 3).t()
    p = encode(x, "none")
    assert p.data[0] is x
    assert decode(p) is x
    assert p.nbytes == x.numel() * 4


@pytest.mark.parametrize("codec", ["bool", "uint8", "bit", "sparse", "int8"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.float32], ids=str)
def test_decode_never_aliases_the_payload(codec, dtype):
    if codec == "int8" and not dtype.is_floating_point:
        return
    x = binary((4, 16), dtype)
    p = encode(x, codec)
    y = decode(p)
    y.zero_()  # e.g. an in-place activation at the start of the recompute
    assert same(decode(p), x)


def test_decode_restores_dense_layouts_and_makes_gapped_ones_contiguous():
    x = binary((2, 3, 4, 5), torch.float32).contiguous(memory_format=torch.channels_last)
    y = decode(encode(x, "bit"))
    assert y.stride() == x.stride() and y.is_contiguous(memory_format=torch.channels_last)
    t = binary((6, 4), torch.float16).t()
    assert decode(encode(t, "bool")).stride() == t.stride()
    gapped = binary((8, 4), torch.float32)[::2]
    z = decode(encode(gapped, "sparse"))
    assert z.is_contiguous() and same(z, gapped)


def test_payload_does_not_depend_on_strides():
    x = binary((6, 10), torch.float32, seed=5)
    a = encode(x.t().contiguous(), "bit")
    b = encode(x.t(), "bit")
    assert torch.equal(a.data[0], b.data[0])


@settings(max_examples=n_examples(150), deadline=None)
@given(
    shape=st.lists(st.integers(0, 9), min_size=0, max_size=4),
    dtype=st.sampled_from(DTYPES),
    codec=st.sampled_from(LOSSLESS),
    view=st.integers(0, 4),
    density=st.sampled_from([0.0, 0.03, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_round_trip_property(shape, dtype, codec, view, density, seed):
    x = binary(tuple(shape), dtype, seed=seed, density=density)
    views = [x, *noncontiguous_views(x)]
    x = views[view % len(views)]
    p = encode(x, codec, validate="always", where="prop")
    assert same(decode(p), x)
    assert p.nbytes == estimate_nbytes(
        codec,
        x.numel(),
        dtype,
        nnz=int((x != 0).sum()),
        binary=True,
    )


# ---------------------------------------------------------------- bit layout and size


def test_bit_layout_hand_example():
    x = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1], dtype=torch.float32)
    p = encode(x, "bit")
    assert p.data[0].dtype == torch.uint8
    assert p.data[0].tolist() == [0b00001101, 0b00000001]
    assert p.nbytes == 2


def test_bit_layout_is_c_order_lsb_first():
    x = torch.tensor([[0, 0, 0, 0, 0, 0, 0, 1], [1, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.bfloat16)
    assert encode(x, "bit").data[0].tolist() == [0b10000000, 0b00000011]
    # x.t() in C order: 0,1, 0,1, 0,0, 0,0 | 0,0, 0,0, 0,0, 1,0
    assert encode(x.t(), "bit").data[0].tolist() == [0b00001010, 0b01000000]


@settings(max_examples=n_examples(60), deadline=None)
@given(values=st.lists(st.integers(0, 1), min_size=0, max_size=70))
def test_bit_layout_matches_reference(values):
    x = torch.tensor(values, dtype=torch.float16)
    assert encode(x, "bit").data[0].tolist() == reference_pack(values)


@pytest.mark.parametrize(
    "dtype,ratio", [(torch.float32, 32), (torch.float16, 16), (torch.bfloat16, 16), (torch.bool, 8)]
)
@pytest.mark.parametrize("numel", [8, 1024, 4096, 65536])
def test_bit_ratio_exact_for_multiples_of_eight(dtype, ratio, numel):
    x = binary((numel,), dtype)
    assert x.numel() * x.element_size() == ratio * encode(x, "bit").nbytes


@pytest.mark.parametrize("numel", [1024, 1025, 1031, 2233, 4097, 100_003])
def test_bit_ratio_with_padding(numel):
    # At most 7 padding bits: ceil(n/8) bytes against 4n, so <= 1/31.9 from n = 2233 (8.7 KiB).
    p = encode(binary((numel,), torch.float32), "bit")
    assert p.nbytes == codecs.HEADER_BYTES + math.ceil(numel / 8)
    assert p.nbytes / (4 * numel) <= 1 / 32 + 7 / (32 * numel)
    if numel >= 2233:
        assert p.nbytes / (4 * numel) <= 1 / 31.9


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.bool])
@pytest.mark.parametrize("numel", [1, 7, 8, 9, 1031])
def test_bit_decode_allocates_exactly_the_tensor(dtype, numel):
    """The decoded tensor owns numel elements (no padded storage), and no lookup table counts as step memory."""
    from memoplan.measure import LiveStorageMeter

    x = binary((numel,), dtype)
    p = encode(x, "bit")
    codec_impls.BIT_TABLE_CACHE.clear()  # the table is made during the metered decode below
    with LiveStorageMeter() as meter:
        y = decode(p)
        assert meter.current_bytes == numel * x.element_size()
        assert torch.equal(y, x)
        del y
        assert meter.current_bytes == 0


def test_payload_sizes_per_codec():
    x = binary((1000,), torch.float32, density=0.01)
    nnz = int(x.sum())
    assert encode(x, "none").nbytes == 4000
    assert encode(x, "bool").nbytes == 1000
    assert encode(x, "uint8").nbytes == 1000
    assert encode(x, "bit").nbytes == 125
    assert encode(x, "sparse").nbytes == 4 * nnz
    assert encode(x, "int8").nbytes == 1000 + 4 * 16


# ---------------------------------------------------------------- uint8 and sparse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64])
def test_uint8_round_trip_small_integers(dtype):
    x = torch.randint(0, 256, (13, 17), generator=torch.Generator().manual_seed(1)).to(dtype)
    p = encode(x, "uint8", validate="always")
    assert p.data[0].dtype == torch.uint8 and p.data[0].tolist() == x.reshape(-1).to(torch.int64).tolist()
    assert same(decode(p), x)
    assert same(decode(encode(x.t()[::2], "uint8")), x.t()[::2])


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_sparse_keeps_every_bit_pattern(dtype):
    x = torch.zeros(50, dtype=dtype)
    x[[3, 7, 11, 20, 49]] = torch.tensor([0.25, -0.0, float("nan"), float("-inf"), -2.0]).to(dtype)
    p = encode(x, "sparse")
    indices, values = p.data
    assert indices.dtype == torch.int32 and indices.tolist() == [3, 7, 11, 20, 49]
    assert values.dtype == dtype
    assert same(decode(p), x)
    assert same(decode(encode(x.view(5, 10).t(), "sparse")), x.view(5, 10).t())


def test_sparse_omits_values_when_binary():
    x = torch.zeros(100, dtype=torch.float16)
    x[[0, 64, 99]] = 1
    p = encode(x, "sparse")
    assert len(p.data) == 1 and p.data[0].tolist() == [0, 64, 99]
    assert p.nbytes == 12
    assert len(encode(torch.zeros(10), "sparse").data) == 1


# ---------------------------------------------------------------- int8 (lossy)


def scales_of(x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1).float()
    groups = math.ceil(flat.numel() / 64)
    pad = torch.cat([flat, flat.new_zeros(groups * 64 - flat.numel())]).view(groups, 64)
    return pad.abs().amax(1) / 127


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("numel", [1, 63, 64, 65, 1000])
def test_int8_error_within_half_scale(dtype, numel):
    x = (torch.randn(numel, generator=torch.Generator().manual_seed(numel)) * 3).to(dtype)
    p = encode(x, "int8")
    q, scales = p.data
    assert q.dtype == torch.int8 and q.numel() == numel
    assert scales.dtype == torch.float32 and scales.numel() == math.ceil(numel / 64)
    assert torch.equal(scales, scales_of(x))
    y = decode(p)
    assert (y.dtype, y.shape) == (dtype, x.shape)
    err = (y.double() - x.double()).abs()
    per = scales.double().repeat_interleave(64)[:numel]
    ulp = {torch.float16: 2**-10, torch.bfloat16: 2**-7}.get(dtype, 2**-22)
    assert bool((err <= per / 2 * (1 + 1e-5) + x.double().abs() * ulp).all())


def test_int8_layout_hand_example():
    x = torch.zeros(130)
    x[0], x[1], x[2] = 1.27, -0.635, 0.005  # group 0: scale 0.01
    x[64:128] = 0.0  # group 1: all zero, scale 0
    x[128], x[129] = 2.54, 1.0  # group 2 (short): scale 0.02
    q, scales = encode(x, "int8").data
    assert torch.allclose(scales, torch.tensor([0.01, 0.0, 0.02]))
    assert q[:3].tolist() == [127, -64, 0]  # -63.5 and 0.5 round half to even
    assert q[64:128].eq(0).all() and q[128:].tolist() == [127, 50]


def test_int8_tolerance():
    x = torch.randn(256, generator=torch.Generator().manual_seed(0))
    encode(x, "int8", tolerance=0.05, where="enc.0")
    with pytest.raises(CodecError) as info:
        encode(x, "int8", tolerance=1e-6, where="enc.0", validate="always")
    err = info.value
    assert err.codes == ["MP405"] and "`enc.0`" in str(err) and "tolerance" in str(err)
    encode(x, "int8", tolerance=1e-6, validate="off")  # not checked


def test_int8_rejects_nonfinite_and_integer_inputs():
    x = torch.ones(10)
    x[4] = float("inf")
    with pytest.raises(CodecError) as info:
        encode(x, "int8", where="m")
    assert info.value.index == 4
    q, _ = encode(x, "int8", validate="off").data  # defined: +inf -> 127
    assert q[4] == 127
    with pytest.raises(CodecError, match="floating-point"):
        encode(torch.ones(3, dtype=torch.int64), "int8")


# ---------------------------------------------------------------- values a codec cannot hold


@pytest.mark.parametrize(
    ("codec", "bad", "validate", "dtype"),
    pairwise(
        ["bit", "bool"],
        [0.7, 2.0, -1.0, float("nan"), float("inf")],
        ["sample", "always"],
        [torch.float32, torch.float16, torch.bfloat16],
    ),
    ids=str,
)
def test_non_binary_value_raises(codec, bad, validate, dtype):
    x = binary((3, 50), dtype)
    x[2, 9] = bad
    with pytest.raises(CodecError) as info:
        encode(x, codec, validate=validate, where="features.3.lif")
    err = info.value
    assert isinstance(err, PlanError)
    assert err.codes == ["MP405"]
    assert (err.where, err.codec, err.index) == ("features.3.lif", codec, 109)
    text = str(err)
    assert "`features.3.lif`" in text and f"`{codec}`" in text and "flat index 109" in text
    shown = {0.7: "0.7", 2.0: "2", -1.0: "-1", float("inf"): "inf"}.get(bad, "nan")
    assert f"has {shown} at" in text
    assert "compress input = none" in text and "compress input = uint8" in text
    assert "compress input = auto" in text and "lossy" in text


@pytest.mark.parametrize("bad", [0.5, 256.0, -1.0, float("nan"), float("-inf")])
def test_uint8_out_of_range_or_fractional_raises(bad):
    x = torch.arange(20, dtype=torch.float32)
    x[11] = bad
    with pytest.raises(CodecError) as info:
        encode(x, "uint8", where="embed")
    assert info.value.index == 11 and "0..255" in str(info.value)
    with pytest.raises(CodecError):
        encode(torch.tensor([3, 300]), "uint8")


def test_first_bad_value_is_reported():
    x = torch.tensor([0.0, 1.0, 5.0, 0.5, 1.0])
    with pytest.raises(CodecError) as info:
        encode(x, "bit")
    assert (info.value.index, info.value.value) == (2, 5.0)


def test_sample_checks_everything_first_then_the_documented_subset():
    n = 3 * SAMPLE_LIMIT + 5  # step 4
    idx = sample_indices(n)
    assert idx.numel() <= SAMPLE_LIMIT and idx[1] == 4 and idx[-1] == n - 1 - (n - 1) % 4
    x = binary((n,), torch.float32)
    unsampled, sampled = 4 * 1000 + 1, 4 * 1000
    bad = x.clone()
    bad[unsampled] = 0.7
    # The first call for a `where` checks every element: an unsampled position is caught.
    with pytest.raises(CodecError) as info:
        encode(bad, "bit", where="blk")
    assert info.value.index == unsampled
    encode(x, "bit", where="blk")  # a clean full first call
    # Later calls check only sample_indices(n): an unsampled bad value is NOT detected ...
    p = encode(bad, "bit", where="blk")
    assert decode(p)[unsampled] == 1  # ... and is encoded by the "off" rule (x != 0).
    # ... while a bad value at a sampled position is.
    bad2 = x.clone()
    bad2[sampled] = 2.0
    with pytest.raises(CodecError) as info:
        encode(bad2, "bit", where="blk")
    assert info.value.index == sampled
    # "always" checks every element on every call; another `where` starts with a full check.
    with pytest.raises(CodecError):
        encode(bad, "bit", where="blk", validate="always")
    with pytest.raises(CodecError):
        encode(bad, "bit", where="other")


def test_sample_checks_small_tensors_fully_every_call():
    x = binary((SAMPLE_LIMIT,), torch.float32)
    encode(x, "bool", where="m")
    x[12345] = 0.5
    with pytest.raises(CodecError):
        encode(x, "bool", where="m")


@pytest.mark.parametrize("codec", ["bit", "bool"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64], ids=str)
def test_validate_off_stores_nonzero(codec, dtype):
    values = [0.7, -3.0, float("nan"), -0.0, 0.0, 2.0, 1.0, 0.2, 0.0]
    if not dtype.is_floating_point:
        values = [7, -3, 0, 0, 5, 1, 0, 2, 0]
    x = torch.tensor(values).to(dtype)
    y = decode(encode(x, codec, validate="off"))
    assert y.tolist() == (x != 0).to(dtype).tolist()
    if dtype.is_floating_point:
        assert y.tolist() == [1, 1, 1, 0, 0, 1, 1, 1, 0]  # 0.7 -> 1: no truncation, no rounding


def test_validate_off_uint8_rule():
    x = torch.tensor([0.5, 1.5, 2.5, -1.0, 300.0, float("nan"), float("inf"), float("-inf"), 7.0])
    p = encode(x, "uint8", validate="off")
    assert p.data[0].tolist() == [0, 2, 2, 0, 255, 0, 255, 0, 7]


def test_negative_zero_is_a_valid_zero():
    x = torch.tensor([-0.0, 1.0, 0.0])
    for codec in ["bit", "bool", "uint8"]:
        assert decode(encode(x, codec, validate="always")).tolist() == [0.0, 1.0, 0.0]
    assert same(decode(encode(x, "sparse")), x)


def test_enum_values_are_accepted():
    from memoplan.syntax.ast import Codec, Validate

    x = binary((20,), torch.float32)
    assert encode(x, Codec.BIT, validate=Validate.ALWAYS).codec == "bit"
    assert encode(x, Codec.AUTO).codec == "bit"
    with pytest.raises(ValueError):
        encode(x, "zip")
    with pytest.raises(ValueError):
        encode(x, "bit", validate="sometimes")


# ---------------------------------------------------------------- choose and is_binary


def test_is_binary():
    assert is_binary(torch.tensor([0.0, 1.0, -0.0]))
    assert is_binary(torch.tensor([True, False]))
    assert is_binary(torch.empty(0))
    assert not is_binary(torch.tensor([0.0, float("nan")]))
    assert not is_binary(torch.tensor([0, 2]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_choose(dtype):
    g = torch.Generator().manual_seed(0)
    assert choose(binary((4096,), dtype)) == "bit"
    assert choose(torch.randint(0, 256, (4096,), generator=g).to(dtype)) == "uint8"
    sparse = torch.zeros(4096, dtype=dtype)
    sparse[::100] = torch.randn(41, generator=g).to(dtype)
    assert choose(sparse) == "sparse"
    assert choose(torch.randn(4096, generator=g).to(dtype)) == "none"
    very_sparse_spikes = torch.zeros(4096, dtype=dtype)
    very_sparse_spikes[::64] = 1  # density 1/64 < 1/32: indices beat packed bits
    assert choose(very_sparse_spikes) == "sparse"
    assert choose(torch.randint(0, 256, (64,), dtype=torch.uint8, generator=g)) == "none"
    assert choose(torch.empty(0, dtype=dtype)) == "none"


@settings(max_examples=n_examples(60), deadline=None)
@given(
    n=st.integers(0, 300),
    kind=st.sampled_from(["binary", "int", "sparse", "dense"]),
    dtype=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_choose_is_the_smallest_lossless_payload(n, kind, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = {
        "binary": lambda: (torch.rand(n, generator=g) < 0.3).float(),
        "int": lambda: torch.randint(0, 256, (n,), generator=g).float(),
        "sparse": lambda: torch.randn(n, generator=g) * (torch.rand(n, generator=g) < 0.1),
        "dense": lambda: torch.randn(n, generator=g),
    }[kind]().to(dtype)
    picked = choose(x)
    sizes = {}
    for codec in LOSSLESS:
        try:
            sizes[codec] = encode(x, codec, validate="always").nbytes
        except CodecError:
            continue
    assert sizes[picked] == min(sizes.values())
    y = decode(encode(x, picked))
    # x * mask makes -0.0, which bit/bool/uint8 hold as the value 0 (documented): equal, not same bits.
    assert same(y, x) if picked in ("none", "sparse") else torch.equal(y, x) and y.dtype == x.dtype


# ---------------------------------------------------------------- the runtime's import rule


def test_codecs_import_only_torch_stdlib_and_leaves():
    import sys

    for module in (codecs, codec_impls, codec_checks):
        for name in imported_modules(Path(module.__file__)):
            top = name.split(".")[0]
            assert (
                top in sys.stdlib_module_names
                or top == "torch"
                or name
                in (
                    "memoplan.diagnostics",
                    "memoplan.enums",  # the codec specs: a leaf without torch
                    "memoplan.runtime",  # from memoplan.runtime import codec_impls
                    "memoplan.runtime.codec_impls",
                    "memoplan.runtime.codec_checks",
                    "memoplan.runtime.kernels",  # imported lazily, for CUDA tensors only
                )
            ), name


def test_payload_is_frozen():
    p = encode(torch.ones(3), "bit")
    assert isinstance(p, Payload)
    with pytest.raises(AttributeError):
        p.codec = "none"  # type: ignore[misc]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("codec", ["bool", "uint8", "bit", "sparse", "int8"])
def test_cuda_payloads_equal_cpu_payloads(codec):
    x = binary((5, 7, 3), torch.float16, seed=9).permute(2, 0, 1)
    cpu, gpu = encode(x, codec), encode(x.cuda(), codec, validate="always")
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu.data, gpu.data))
    y = decode(gpu)
    assert y.device.type == "cuda" and y.stride() == x.stride()
    assert same(y.cpu(), decode(cpu))


@pytest.mark.bench
def test_codec_benchmark_cpu_mode_runs_small(tmp_path):
    """benchmarks/codec_bandwidth.py --cpu: times the pure-torch bit codec and writes its rows."""
    import json
    import runpy

    bench = runpy.run_path(str(ROOT / "benchmarks" / "codec_bandwidth.py"))
    out = tmp_path / "cpu.json"
    argv = ["--cpu", "--numel", "1000", "4099", "--repeats", "2", "--warmup", "0", "--json", str(out)]
    assert bench["main"](argv) == 0
    rows = json.loads(out.read_text())
    assert [r["numel"] for r in rows] == [1000, 4099]
    assert all(r["pack_ms"] > 0 and r["unpack_ms"] > 0 for r in rows)
