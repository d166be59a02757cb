"""Editor stage: the language server (``memoplan lsp``) and the TextMate grammar for ``.memplan`` files.

A thin adapter over ``memoplan.syntax`` and ``memoplan.resolver``: ``server`` speaks the
Language Server Protocol (pygls, the ``lsp`` extra), ``analysis`` is what ``memoplan
check`` says about a document, ``hover``, ``completion`` and ``context`` answer the
cursor, ``reference`` reads the hover text from ``grammar/README.md``, ``language`` lists
the words of the language from the parser's types, ``worker`` is the separate process
that loads models, and ``textmate`` writes ``editors/memplan.tmLanguage.json`` from the
Lark grammar's keywords.
"""
