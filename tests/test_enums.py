"""The values that cross stages are one enum each (memoplan/enums.py), from the AST to the runtime."""

from __future__ import annotations

import dataclasses

from memoplan import ir
from memoplan.enums import Aspect, Boundaries, Validate
from memoplan.resolver import bind
from memoplan.runtime import recompute
from memoplan.syntax import ast


def test_the_ast_names_the_shared_enums():
    assert ast.Validate is Validate and ast.Boundaries is Boundaries
    assert ir.CompressAction.__dataclass_fields__["validate"].default is Validate.SAMPLE


def test_temporal_chunk_boundaries_stay_an_enum_in_the_ir():
    origin = ir.Origin("p.memplan", 3, "block", "temporal_chunk 4 dim 0")
    kept = ir.TemporalChunkAction(origin, 4, 0)
    replayed = dataclasses.replace(kept, boundaries=Boundaries.RECOMPUTE)
    assert kept.boundaries is Boundaries.KEEP and not kept.recompute_boundaries
    assert replayed.recompute_boundaries
    # plan ids hash the field as they did when it was a bool: ids committed before stay valid
    assert ("recompute_boundaries", True) in ir._strip(replayed)
    assert all(k != "boundaries" for k, _ in ir._strip(kept))


def test_aspects_are_an_enum_that_reads_as_its_word():
    assert bind.ASPECTS[ast.Compress] is Aspect.COMPRESS and bind.ASPECTS[ast.Keep] is Aspect.RECOMPUTE
    assert {Aspect.CHUNK: 1}["temporal_chunk"] == 1 and f"{Aspect.STATE}" == "state"


def test_the_runtime_class_for_chunk_starts_no_longer_shares_the_enums_name():
    assert not hasattr(recompute, "Boundaries") and recompute.ChunkStarts.__name__ == "ChunkStarts"
