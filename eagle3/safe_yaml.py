"""YAML from someone else's template, parsed in bounded time and memory.

PyYAML's SafeLoader builds no objects it should not, but it still lets a kilobyte of anchors and
aliases stand for billions of values (shared references: loading is instant, and whatever walks the
result later, a validator or an error message, runs out of memory), keeps the last of two equal
keys without a word, and reads `1:30` as 90 and `2024-01-01` as a date. This loader refuses
duplicate keys (naming both lines), counts every value as if each alias were expanded and stops
past `max_nodes`, stops past `max_depth` levels of nesting, rejects recursive aliases, and knows
only plain scalars, lists and mappings (no tags such as !!python/object, !!binary or !!set).
"""

from __future__ import annotations

import re

import yaml
from yaml.nodes import MappingNode, Node

from .errors import ConfigError, echo

MAX_NODES = 20_000  # values after alias expansion; the shipped configs have a few hundred
MAX_DEPTH = 32      # nesting levels; the schema needs 5, free-form request JSON a few more

_INT = re.compile(r"""^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$""")
# YAML 1.1 without base 60, plus 1.2's exponent without a dot (`1e-4`), which 1.1 reads as a string
_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X)
_KEPT_TAGS = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:merge"}
_KEPT_CONSTRUCTORS = {f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "str", "seq", "map")} | {None}


class _Refused(yaml.YAMLError):
    def __init__(self, message: str, mark=None):
        super().__init__(message)
        self.message, self.mark = message, mark


class BoundedLoader(yaml.SafeLoader):
    max_nodes = MAX_NODES
    max_depth = MAX_DEPTH

    def __init__(self, stream):
        super().__init__(stream)
        self._count = 0
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values in its expanded subtree

    def _add(self, n: int, mark) -> None:
        self._count += n
        if self._count > self.max_nodes:
            raise _Refused(f"more than {self.max_nodes} values (an alias *name counts as a copy of what it names); "
                           "a config needs a few hundred", mark)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:
                raise _Refused("an alias refers to the value that contains it (a recursive alias); remove it", mark)
            self._add(self._sizes[id(node)], mark)
            return node
        mark = self.peek_event().start_mark
        self._depth += 1
        if self._depth > self.max_depth:
            raise _Refused(f"nested more than {self.max_depth} levels deep; a config needs a handful", mark)
        before = self._count
        self._add(1, mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._sizes[id(node)] = self._count - before
        return node

    def construct_yaml_int(self, node):
        if len(node.value) > 40:  # int() of thousands of digits is slow, and str() of it raises
            raise _Refused("an integer of more than 40 digits; no setting needs one", node.start_mark)
        return super().construct_yaml_int(node)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            _refuse_duplicate_keys(self, node)
        return super().construct_mapping(node, deep=deep)


def _refuse_duplicate_keys(loader: BoundedLoader, node: MappingNode) -> None:
    first: dict[object, Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # keys merged in with `<<` may be overridden: that is what merging is for
        key = loader.construct_object(key_node)
        try:
            seen = first.setdefault(key, key_node)
        except TypeError:
            continue  # an unhashable key; construct_mapping reports it
        if seen is not key_node:
            raise _Refused(f"duplicate key {echo(key)} (line {key_node.start_mark.line + 1}, first at line "
                           f"{seen.start_mark.line + 1}); YAML would silently keep only the last one: merge them",
                           key_node.start_mark)


BoundedLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag in _KEPT_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
BoundedLoader.yaml_constructors = {tag: fn for tag, fn in yaml.SafeLoader.yaml_constructors.items()
                                   if tag in _KEPT_CONSTRUCTORS}
BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)


class _AgreeingDumper(yaml.SafeDumper):
    """PyYAML's SafeDumper quotes a string only where its own resolvers would read it as something else,
    and those are not this loader's: `0111906805729804` (a fingerprint of hex digits that happen to be
    all decimal) went out plain and came back as the float 111906805729804.0, and a pinned config's run
    then named every phase changed. Dumping with this loader's resolvers quotes what it would misread."""


_AgreeingDumper.yaml_implicit_resolvers = {first: list(resolvers)
                                           for first, resolvers in BoundedLoader.yaml_implicit_resolvers.items()}


def dump(data: object) -> str:
    """`data` as YAML that `load` reads back equal (plain strings, numbers, booleans, lists, mappings)."""
    return yaml.dump(data, Dumper=_AgreeingDumper, sort_keys=False, allow_unicode=True)


def load(text: str, source: str) -> object:
    """The single document of `text`; ConfigError naming `source`, line and column otherwise."""
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except _Refused as e:
        raise ConfigError(f"{source}:{_where(e.mark)} {e.message}") from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        code = e.character if isinstance(e.character, int) else ord(e.character)
        raise ConfigError(f"{source}: line {line}: character U+{code:04X} is not allowed in YAML text; "
                          "remove it (or write it as an escape in a double-quoted string)") from None
    except yaml.constructor.ConstructorError as e:
        tag = re.search(r"could not determine a constructor for the tag '(.*)'", str(e.problem))
        if not tag:
            raise ConfigError(f"{source}:{_where(e.problem_mark)} not valid YAML: "
                              f"{echo(e.problem, 200, quote=False)}") from None
        raise ConfigError(f"{source}:{_where(e.problem_mark)} unsupported YAML tag {echo(tag[1])}; a config holds "
                          "only plain strings, numbers, booleans, lists and mappings (no !!python/..., !!binary, "
                          "!!set, dates or custom tags)") from None
    except yaml.MarkedYAMLError as e:
        raise ConfigError(f"{source}:{_where(e.problem_mark)} not valid YAML: {echo(e.problem, 200, quote=False)}"
                          + (f" ({echo(e.context, 120, quote=False)})" if e.context else "")) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {echo(str(e), 200, quote=False)}") from None
    except RecursionError:  # not reachable with max_depth, kept so a deep structure never prints a traceback
        raise ConfigError(f"{source}: nested too deeply") from None


def _where(mark) -> str:
    return f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
