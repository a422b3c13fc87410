"""Checks wick's layering from the module paths in src/ (tests excluded).

    python3 scripts/check_imports.py

Three graphs, all built from the same references: every path in a `use`
(braces expanded) and every `crate::…`, `super::…` and `self::…` path in
the code, plus bare paths whose first segment is a child module declared
where they stand. A path resolves to the module its longest prefix names
(`crate::engine::scheduler::Scheduler` is `engine::scheduler`; `super::`
and `self::` count from the module they are written in, inline modules
included), and that module to the file defining it (`x.rs` or `x/mod.rs`;
an inline `mod x { … }` is its file's). The graphs:

- modules: each top-level module under src/ (a folder, or a file such as
  vec_math.rs) is a node; a file's reference into another is an edge.
- files: each file of the library (reachable from lib.rs through `mod`
  declarations) is a node; a reference to another file's module is an
  edge. A file's references to the child modules it declares itself with
  `mod x;` are not edges (its references to their own children are): a
  parent declaring, re-exporting or calling its children is the module
  tree, not an import.
- folders: inside each folder below src/, its entries (files and
  sub-folders, a sub-folder standing for every file under it) are nodes,
  with an edge where a file in one refers to a file in another. Only cycles
  through a sub-folder are reported here: one of files alone is a file
  cycle. (src/ itself is the modules graph.)

Tests are left out: items under `#[cfg(test)]` (a `mod tests { … }`, a test
helper) and the files only such a `mod` declares (tests.rs).

Fails (exit 1), printing each problem, when a layer imports a module it
must stay below:

- kv (the KV pool's memory, the flat batch, the step's metadata) imports
  none of attention, models, engine, load, server, cli;
- attention and models import none of engine, server, cli;
- media (image decoding and preprocessing) imports none of kv,
  attention, models, engine, load, server, cli;

or when any of the three graphs has a cycle. A modules cycle is printed as
one cycle with the files making each step; a files or folders cycle as its
strongly connected component (every file or folder on some cycle with the
others), then the edges inside it, each with a path that makes it.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

SRC = Path(__file__).resolve().parent.parent / "src"

BELOW = {
    "kv": {"attention", "models", "engine", "load", "server", "cli"},
    "attention": {"engine", "server", "cli"},
    "models": {"engine", "server", "cli"},
    "media": {"kv", "attention", "models", "engine", "load", "server", "cli"},
}

Module = tuple[str, ...]

# --- reading a file ------------------------------------------------------------


RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"'(\\.[^']*|[^\\'\n])'")


def strip_comments_and_literals(text: str) -> str:
    """The code with comments removed and string and char literals emptied
    (so that neither a doc link nor a brace in a string counts). Offsets
    are not kept."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
        elif (m := RAW_STRING.match(text, i)) and (i == 0 or not _ident(text[i - 1])):
            close = '"' + m.group(1)
            end = text.find(close, m.end())
            i = n if end < 0 else end + len(close)
            out.append('""')
        elif c == '"' or (c == "b" and text.startswith('b"', i) and (i == 0 or not _ident(text[i - 1]))):
            i = text.index('"', i) + 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and (m := CHAR.match(text, i)):
            i = m.end()
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _ident(c: str) -> bool:
    return c.isalnum() or c == "_"


def block_end(code: str, i: int) -> int:
    """Index just past the item starting at `i`: its `;` or its `{ … }`,
    whichever comes first outside brackets."""
    depth = 0
    while i < len(code):
        c = code[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == ";" and depth == 0:
            return i + 1
        elif c == "{" and depth == 0:
            level = 0
            while i < len(code):
                if code[i] == "{":
                    level += 1
                elif code[i] == "}":
                    level -= 1
                    if level == 0:
                        return i + 1
                i += 1
            return i
        i += 1
    return i


CFG_TEST = re.compile(r"#\[cfg\(test\)\]")
ATTR = re.compile(r"\s*#!?\[[^\]]*\]")


def without_tests(code: str) -> str:
    """The code less every item under `#[cfg(test)]`."""
    while m := CFG_TEST.search(code):
        i = m.end()
        while a := ATTR.match(code, i):
            i = a.end()
        code = code[: m.start()] + code[block_end(code, i) :]
    return code


# --- the module tree -------------------------------------------------------------


@dataclass
class Scope:
    """A module written in a file: the file's own, or an inline `mod x { … }`
    (its code being that block's)."""

    module: Module
    code: str
    children: dict[str, Module] = field(default_factory=dict)


@dataclass
class Tree:
    file_of: dict[Module, Path] = field(default_factory=dict)
    scopes: list[tuple[Path, Scope]] = field(default_factory=list)
    # file -> the modules it declares with `mod x;`
    declared: dict[Path, set[Module]] = field(default_factory=dict)


MOD = re.compile(r"(?<![\w:])mod\s+(\w+)\s*([;{])")


def child_dir(path: Path) -> Path:
    """Where the files of `path`'s `mod x;` children live."""
    if path.name in ("mod.rs", "lib.rs", "main.rs"):
        return path.parent
    return path.parent / path.stem


def load_tree(root: Path) -> Tree:
    tree = Tree()

    def add_file(path: Path, module: Module) -> None:
        tree.file_of[module] = path
        code = without_tests(strip_comments_and_literals(path.read_text()))
        add_scope(path, module, code, child_dir(path))

    def add_scope(path: Path, module: Module, code: str, folder: Path) -> None:
        scope = Scope(module, "")
        tree.scopes.append((path, scope))
        own = []  # the code outside inline child modules
        i = 0
        while m := MOD.search(code, i):
            name, kind = m.group(1), m.group(2)
            child = module + (name,)
            scope.children[name] = child
            if kind == ";":
                for candidate in (folder / f"{name}.rs", folder / name / "mod.rs"):
                    if candidate.exists():
                        tree.declared.setdefault(path, set()).add(child)
                        add_file(candidate, child)
                        break
                own.append(code[i : m.end()])
                i = m.end()
            else:
                end = block_end(code, m.end() - 1)
                tree.file_of[child] = path
                add_scope(path, child, code[m.end() : end - 1], folder / name)
                own.append(code[i : m.start()])
                i = end
        own.append(code[i:])
        scope.code = " ".join(own)

    add_file(root, ())
    return tree


# --- references ----------------------------------------------------------------

USE = re.compile(r"(?<![\w:])use\s+(?=[\w{:])")
PUB_IN = re.compile(r"pub\s*\(\s*in\s+[^)]*\)")
PATH = re.compile(r"(?<![\w:$])(?:crate|super|self)(?:::\w+)+")
BARE = re.compile(r"(?<![\w:$.])(\w+)(?:::\w+)+")


def use_paths(tree_text: str) -> list[list[str]]:
    """The paths a use tree names, braces expanded, `self` leaves meaning
    their prefix and `*` dropped."""
    tokens = re.findall(r"\w+|::|[{},*]", tree_text)
    pos = 0

    def parse(prefix: list[str]) -> list[list[str]]:
        nonlocal pos
        path = list(prefix)
        while pos < len(tokens):
            t = tokens[pos]
            if t == "{":
                pos += 1
                found = []
                while pos < len(tokens) and tokens[pos] != "}":
                    if tokens[pos] == ",":
                        pos += 1
                        continue
                    found += parse(path)
                pos += 1
                return found
            if t == "*":
                pos += 1
                return [path]
            if t == "::":
                pos += 1
                continue
            if t in (",", "}"):
                return [path]
            if t == "as":
                pos += 2  # the alias
                return [path]
            pos += 1
            if t != "self" or not path:
                path.append(t)
        return [path]

    return parse([])


def references(scope: Scope) -> list[list[str]]:
    """Every path `scope`'s code refers to, as segments."""
    code = PUB_IN.sub(" ", scope.code)
    paths: list[list[str]] = []
    rest: list[str] = []
    i = 0
    while m := USE.search(code, i):
        end = block_end(code, m.end())
        paths += use_paths(code[m.end() : end - 1])
        rest.append(code[i : m.start()])
        i = end
    rest.append(code[i:])
    other = " ".join(rest)
    paths += [p.split("::") for p in PATH.findall(other)]
    paths += [
        m.group(0).split("::")
        for m in BARE.finditer(other)
        if m.group(1) in scope.children
    ]
    return paths


def resolve(tree: Tree, scope: Scope, segments: list[str]) -> Module | None:
    """The module a path written in `scope` leads to: its longest prefix
    that names a module; None for a path outside the crate."""
    if not segments:
        return None
    first, rest = segments[0], segments[1:]
    if first == "crate":
        base: Module = ()
    elif first == "self":
        base = scope.module
    elif first == "super":
        base = scope.module[:-1]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    elif first in scope.children:
        base, rest = scope.module, segments
    else:
        return None
    for seg in rest:
        if base + (seg,) not in tree.file_of:
            break
        base = base + (seg,)
    return base


# --- graphs ----------------------------------------------------------------------

Graph = dict[str, dict[str, str]]  # node -> node -> a path that makes the edge


def file_graph(tree: Tree) -> Graph:
    graph: Graph = {}
    for path, scope in tree.scopes:
        src = str(path.relative_to(SRC.parent))
        graph.setdefault(src, {})
        for segments in references(scope):
            target = resolve(tree, scope, segments)
            if target is None:
                continue
            if target in tree.declared.get(path, set()):
                continue  # a parent and the child it declares
            dst_path = tree.file_of[target]
            if dst_path == path:
                continue
            dst = str(dst_path.relative_to(SRC.parent))
            graph[src].setdefault(dst, "::".join(segments))
    return graph


def module_of(file: str) -> str:
    return Path(file).relative_to("src").parts[0].removesuffix(".rs")


def lifted(graph: Graph, node_of) -> dict[str, dict[str, set[str]]]:
    """`graph` with each file replaced by `node_of(file)` (None: left out):
    node -> node -> the files whose references make the edge."""
    out: dict[str, dict[str, set[str]]] = {}
    for src, targets in graph.items():
        a = node_of(src)
        for dst in targets:
            b = node_of(dst)
            if a is not None and b is not None and a != b:
                out.setdefault(a, {}).setdefault(b, set()).add(src)
    return out


def strongly_connected(graph) -> list[list[str]]:
    """The components of more than one node, each sorted, in order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    nodes = sorted(set(graph) | {t for ts in graph.values() for t in ts})

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(1000, 4 * len(nodes)))
    for v in nodes:
        if v not in index:
            visit(v)
    return sorted(found)


def cycle(graph) -> list[str] | None:
    """One cycle of `graph` as its nodes, the first repeated last."""
    for component in strongly_connected(graph):
        inside = set(component)
        path = [component[0]]
        while True:
            nxt = min(t for t in graph[path[-1]] if t in inside)
            if nxt in path:
                return path[path.index(nxt) :] + [nxt]
            path.append(nxt)
    return None


def folder_nodes(files: list[str]) -> dict[str, Callable[[str], str | None]]:
    """For each folder below src/ holding a sub-folder: a map from a file
    under it to its entry there (None for files elsewhere)."""
    folders = sorted({str(Path(f).parent) for f in files} - {"src"})
    out = {}
    for folder in folders:
        depth = len(Path(folder).parts)
        if not any(len(Path(f).parts) > depth + 1 and f.startswith(folder + "/") for f in files):
            continue

        def entry(f: str, folder=folder, depth=depth) -> str | None:
            if not f.startswith(folder + "/"):
                return None
            parts = Path(f).parts
            return "/".join(parts[: depth + 1]) + ("/" if len(parts) > depth + 1 else "")

        out[folder] = entry
    return out


def main() -> int:
    tree = load_tree(SRC / "lib.rs")
    files = file_graph(tree)
    problems = []

    modules = lifted(files, module_of)
    for module, banned in BELOW.items():
        for target in sorted(banned & set(modules.get(module, {}))):
            names = ", ".join(sorted(modules[module][target]))
            problems.append(f"{module} imports {target} ({names})")
    if found := cycle(modules):
        steps = [f"{a} -> {b} ({', '.join(sorted(modules[a][b]))})" for a, b in zip(found, found[1:])]
        problems.append("module import cycle: " + "; ".join(steps))

    for component in strongly_connected(files):
        inside = set(component)
        lines = [f"file cycle ({len(component)} files): " + ", ".join(component)]
        for a in component:
            for b in sorted(t for t in files[a] if t in inside):
                lines.append(f"    {a} -> {b} (`{files[a][b]}`)")
        problems.append("\n".join(lines))

    for folder, entry in folder_nodes(sorted(files)).items():
        graph = lifted(files, entry)
        for component in strongly_connected(graph):
            if not any(node.endswith("/") for node in component):
                continue  # files only: reported as a file cycle
            inside = set(component)
            lines = [f"folder cycle in {folder}/: " + ", ".join(component)]
            for a in component:
                for b in sorted(t for t in graph.get(a, {}) if t in inside):
                    lines.append(f"    {a} -> {b} ({', '.join(sorted(graph[a][b]))})")
            problems.append("\n".join(lines))

    for p in problems:
        print(p)
    names = set(modules) | {t for targets in modules.values() for t in targets}
    print(
        f"imports: {len(names)} modules, {len(files)} files, "
        f"{sum(map(len, files.values()))} file edges, {len(problems)} problems"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
