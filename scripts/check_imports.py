"""Checks wick's layering from its `use crate::…` paths (tests excluded).

    python3 scripts/check_imports.py

Each top-level module under src/ (a folder, or a file such as vec_math.rs)
is a node; a file's reference to `crate::X` is an edge to X. Fails (exit 1,
naming the offending files) when the graph between modules has a cycle, or
when a layer imports one it must stay below:

- kv (the KV pool's memory, the flat batch, the step's metadata) imports
  none of attention, models, engine, load, server, cli;
- attention and models import none of engine, server, cli.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

BELOW = {
    "kv": {"attention", "models", "engine", "load", "server", "cli"},
    "attention": {"engine", "server", "cli"},
    "models": {"engine", "server", "cli"},
}

PATH = re.compile(r"(?<![\w:])crate::(\w+)")


def code_of(path: Path) -> str:
    """The file's text without comments and without its test module."""
    text = path.read_text()
    text = text.split("#[cfg(test)]")[0]
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def edges() -> dict[str, dict[str, set[str]]]:
    """module -> module it refers to -> the files that do."""
    out: dict[str, dict[str, set[str]]] = {}
    for path in sorted(SRC.rglob("*.rs")):
        rel = path.relative_to(SRC)
        if rel.name == "tests.rs":
            continue
        module = rel.parts[0].removesuffix(".rs")
        for target in set(PATH.findall(code_of(path))):
            if target != module:
                out.setdefault(module, {}).setdefault(target, set()).add(str(rel))
    return out


def cycle(graph: dict[str, dict[str, set[str]]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def main() -> int:
    graph = edges()
    problems = []
    for module, banned in BELOW.items():
        for target in sorted(banned & set(graph.get(module, {}))):
            files = ", ".join(sorted(graph[module][target]))
            problems.append(f"{module} imports {target} ({files})")
    if found := cycle(graph):
        steps = [f"{a} -> {b} ({', '.join(sorted(graph[a][b]))})" for a, b in zip(found, found[1:])]
        problems.append("import cycle: " + "; ".join(steps))
    for p in problems:
        print(p)
    modules = set(graph) | {t for targets in graph.values() for t in targets}
    print(f"imports: {len(modules)} modules, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
