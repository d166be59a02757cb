"""``python -m memoplan.lsp``: the language server on stdio, as ``memoplan lsp`` runs it."""

import sys

from memoplan.lsp.server import serve

sys.exit(serve())
