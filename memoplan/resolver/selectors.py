"""Resolve stage: selectors matched against a model's ``named_modules()`` paths.

* a literal segment matches that child name; ``*`` one segment; ``**`` zero or more;
* a glob segment (``layer*``, ``1?``) one segment whose name fits it: ``*`` any run of
  characters, ``?`` one character, within the segment;
* ``[i]`` / ``[a:b:c]`` pick children of the previous segment by position among its
  integer-named children (``nn.Sequential``, ``nn.ModuleList``) in numeric order,
  Python slice rules; a container with a non-integer child name has no positions;
* ``: Name`` keeps modules whose class, or a base class, is called ``Name`` — a short
  name (``__name__`` or ``__qualname__``), or a dotted name whose leading part is a prefix of the class's module
  (``torch.nn.BatchNorm2d`` matches ``torch.nn.modules.batchnorm.BatchNorm2d``);
* ``not term`` removes what ``term`` matches.

The root module (path ``""``) is selected only by a path that is the empty quoted segment alone
(``module "" { checkpoint segments = 8 }``, a model that is itself an ``nn.Sequential``): no
wildcard, glob or class filter reaches it.
"""

from __future__ import annotations

import bisect
import re
from functools import cached_property

from torch import nn

from memoplan.diagnostics import closest, did_you_mean
from memoplan.ir import path_key
from memoplan.syntax import ast

# re-exported: the resolver's names
from memoplan.syntax.specificity import Specificity as Specificity
from memoplan.syntax.specificity import specificity as specificity


class ModelIndex:
    """Paths, children and classes of one model, indexed for fast matching."""

    def __init__(self, model: nn.Module):
        self.root = model
        self.modules: dict[str, nn.Module] = {}
        for path, module in model.named_modules(remove_duplicate=False):
            if path:
                self.modules.setdefault(path, module)
        self.paths = sorted(self.modules, key=path_key)  # natural order, for output
        self._sorted = sorted(self.modules)  # plain order, for prefix search
        self._children: dict[str, list[str]] = {
            "": [name for name, child in model._modules.items() if child is not None]
        }
        for path, module in self.modules.items():
            self._children[path] = [name for name, child in module._modules.items() if child is not None]
        self._class_names: dict[type, frozenset[str]] = {}

    def module(self, path: str) -> nn.Module:
        """The module at ``path``; ``""`` is the root (which ``modules`` and ``paths`` leave out)."""
        return self.root if not path else self.modules[path]

    def children(self, path: str) -> list[str]:
        return self._children.get(path, [])

    def under(self, prefix: str) -> list[str]:
        """``prefix`` itself and every path below it (all paths for ``""``)."""
        if not prefix:
            return self._sorted
        lo = bisect.bisect_left(self._sorted, prefix)
        out = []
        for path in self._sorted[lo:]:
            if path == prefix or path.startswith(prefix + "."):
                out.append(path)
            elif not path.startswith(prefix):
                break
        return out

    def class_names(self, cls: type) -> frozenset[str]:
        """Every name a class filter may use for ``cls``: short and qualified, of it and its bases."""
        names = self._class_names.get(cls)
        if names is None:
            found = set()
            for base in cls.__mro__:
                if base is object or base is nn.Module:
                    continue
                # ``__name__`` too: a class defined in a function has the qualname
                # ``factory.<locals>.Block``, which no plan can spell.
                for name in {base.__qualname__, base.__name__}:
                    found.add(name)
                    module_parts = base.__module__.split(".")
                    for i in range(1, len(module_parts) + 1):
                        found.add(".".join(module_parts[:i]) + "." + name)
            names = self._class_names[cls] = frozenset(found)
        return names

    @cached_property
    def all_class_names(self) -> list[str]:
        return sorted({type(m).__name__ for m in self.modules.values()})

    def matches_class(self, path: str, class_name: str) -> bool:
        return class_name in self.class_names(type(self.module(path)))


def _literal_prefix(segments) -> str:
    parts = []
    for segment in segments:
        if not isinstance(segment, ast.Name):
            break
        parts.append(segment.text)
    return ".".join(parts)


def _regex(segments) -> re.Pattern:
    """Regex over ``path + "."`` for patterns without index/slice segments."""
    out = []
    for segment in segments:
        if isinstance(segment, ast.Name):
            out.append(re.escape(segment.text) + r"\.")
        elif isinstance(segment, ast.Glob):
            out.append(_glob_regex(segment.pattern) + r"\.")
        elif isinstance(segment, ast.Star):
            out.append(r"[^.]+\.")
        else:
            out.append(r"(?:[^.]+\.)*")
    return re.compile("".join(out))


def _glob_regex(pattern: str) -> str:
    """A glob segment as a regex within one segment: ``*`` any run, ``?`` one character."""
    wildcards = {"*": r"[^.]*", "?": r"[^.]"}
    return "".join(wildcards.get(ch) or re.escape(ch) for ch in pattern)


def match_term(index: ModelIndex, term: ast.SelectorTerm) -> list[str]:
    """Paths matched by one selector term, in plain sorted order."""
    if term.path is None:
        candidates = index._sorted
    elif is_root(term.path):
        candidates = [""]
    else:
        segments = term.path.segments
        prefix = _literal_prefix(segments)
        if len(prefix.split(".")) == len(segments) and prefix:
            candidates = [prefix] if prefix in index.modules else []
        elif any(isinstance(s, (ast.Index, ast.Slice)) for s in segments):
            candidates = [p for p in index.under(prefix) if _match(index, segments, p.split("."), 0, 0)]
        else:
            regex = _regex(segments)
            candidates = [p for p in index.under(prefix) if regex.fullmatch(p + ".")]
    if term.class_name is not None:
        candidates = [p for p in candidates if index.matches_class(p, term.class_name)]
    return candidates


def is_root(path: ast.PathPattern) -> bool:
    """Whether the path is ``""`` alone, the one way to select the root module."""
    return len(path.segments) == 1 and isinstance(path.segments[0], ast.Name) and not path.segments[0].text


def _match(index: ModelIndex, segments, parts: list[str], i: int, j: int) -> bool:
    """Recursive matcher for patterns with index or slice segments."""
    if i == len(segments):
        return j == len(parts)
    segment = segments[i]
    if isinstance(segment, ast.DoubleStar):
        return any(_match(index, segments, parts, i + 1, k) for k in range(j, len(parts) + 1))
    if j == len(parts):
        return False
    if isinstance(segment, ast.Name):
        ok = parts[j] == segment.text
    elif isinstance(segment, ast.Glob):
        ok = re.fullmatch(_glob_regex(segment.pattern), parts[j]) is not None
    elif isinstance(segment, ast.Star):
        ok = True
    else:
        ok = parts[j] in _picked(index, ".".join(parts[:j]), segment)
    return ok and _match(index, segments, parts, i + 1, j + 1)


def _picked(index: ModelIndex, parent: str, segment) -> set[str]:
    names = index.children(parent)
    if not names or not all(n.isascii() and n.isdigit() for n in names):
        return set()
    # Positions follow the integer names, not registration order, so the same model
    # built in a different order selects the same children.
    names = sorted(names, key=path_key)
    if isinstance(segment, ast.Index):
        if -len(names) <= segment.value < len(names):
            return {names[segment.value]}
        return set()
    return set(names[segment.start : segment.stop : segment.step])


def select(index: ModelIndex, selector: ast.Selector) -> list[str]:
    """Paths matched by a selector (include minus excludes), in natural order."""
    chosen = set(match_term(index, selector.include))
    for term in selector.exclude:
        chosen.difference_update(match_term(index, term))
    return sorted(chosen, key=path_key)


def no_match_help(index: ModelIndex, term: ast.SelectorTerm) -> str | None:
    """What MP301 suggests for a selector term that matches nothing: the nearest paths, or the
    model's classes."""
    help_ = None
    if term.path is not None:
        guess = _nearest_paths(index, term.path)
        if guess:
            help_ = "nearest paths: " + ", ".join(f"`{p}`" for p in guess)
        if any(isinstance(s, (ast.Index, ast.Slice)) for s in term.path.segments) and not help_:
            help_ = "`[...]` selects children of an indexed container (nn.Sequential, nn.ModuleList)"
    if term.class_name is not None and not any(index.matches_class(p, term.class_name) for p in index.paths):
        short = term.class_name.rsplit(".", 1)[-1]
        help_ = did_you_mean(short, index.all_class_names) or (
            "classes in the model: " + ", ".join(index.all_class_names[:12])
        )
    return help_


def _nearest_paths(index: ModelIndex, path: ast.PathPattern) -> list[str]:
    from memoplan.syntax.formatter import format_path

    wanted = format_path(path)
    literal = ".".join(s.text for s in path.segments if isinstance(s, ast.Name))
    found = closest(wanted, index.paths, n=3, cutoff=0.5)  # fewest edits first, then the model's order
    if not found and literal:
        found = closest(literal, index.paths, n=3, cutoff=0.5)
    return found
