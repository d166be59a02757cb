"""Codegen stage: ResolvedPlan -> Python source (emit), files on disk and imports (write)."""

from memoplan.codegen.emit import GeneratedCode, GeneratedFile, emit
from memoplan.codegen.write import import_generated, write_files

__all__ = ["GeneratedCode", "GeneratedFile", "emit", "import_generated", "write_files"]
