"""The package's version: one place, imported by ``memoplan`` and by the stages that print it.

Its own module so that codegen and the CLI need not import the ``memoplan`` package's
``__init__`` (which names every stage) to read it.
"""

__version__ = "0.1.0"
