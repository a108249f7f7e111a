"""Lines per package, the largest files and the largest functions of the product code, at
a git revision or in the working tree:

    .venv/bin/python tests/architecture/layout_report.py            # the working tree
    .venv/bin/python tests/architecture/layout_report.py 26cbd8f    # a revision

The numbers docs/architecture.md and the issues quote come from here. Tests, e2e and
docs are not product code and are left out."""

from __future__ import annotations

import ast
import collections
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRODUCT = ("waltz_client/", "images/server/", "images/storage/", "operator/")
SUBPACKAGES = ("wire", "runtime", "cluster", "tools", "spark")


def package_of(path: str) -> str:
    """The room a file lives in: a daemon, a subpackage of waltz_client, or its top level
    (the client API; at older revisions the top level also held what moved out since)."""
    for prefix, name in (
        ("images/server/", "waltz_server"),
        ("images/storage/", "waltz_storage"),
        ("operator/", "waltz_operator"),
    ):
        if path.startswith(prefix):
            return name
    parts = path.split("/")
    if len(parts) > 2 and parts[1] in SUBPACKAGES:
        return f"waltz_client.{parts[1]}"
    if len(parts) > 2:
        return f"waltz_client.{parts[1]} (old place)"
    return "waltz_client (top level)"


def sources(revision: str | None) -> dict[str, str]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout

    if revision is None:
        names = git("ls-files", "--cached", "--others", "--exclude-standard").split("\n")
    else:
        names = git("ls-tree", "-r", "--name-only", revision).split("\n")
    names = [n for n in names if n.endswith(".py") and n.startswith(PRODUCT)]
    if revision is None:
        return {n: (ROOT / n).read_text() for n in names if (ROOT / n).exists()}
    return {n: git("show", f"{revision}:{n}") for n in names}


def functions(path: str, text: str) -> list[tuple[int, str]]:
    """(lines, path:qualified name) of every function and method."""
    out: list[tuple[int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                span = (child.end_lineno or child.lineno) - child.lineno + 1
                out.append((span, f"{path}:{prefix}{child.name}"))
                walk(child, f"{prefix}{child.name}.")

    walk(ast.parse(text), "")
    return out


def main(argv: list[str]) -> int:
    revision = argv[1] if len(argv) > 1 else None
    files = sources(revision)
    lines = {path: text.count("\n") for path, text in files.items()}
    per_package: collections.Counter[str] = collections.Counter()
    for path, n in lines.items():
        per_package[package_of(path)] += n
    print(f"product code at {revision or 'the working tree'}: {sum(lines.values()):,} lines")
    print("\nlines per package:")
    for name, n in sorted(per_package.items(), key=lambda kv: -kv[1]):
        print(f"  {n:>7,}  {name}")
    print("\nlargest files:")
    for path, n in sorted(lines.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {n:>7,}  {path}")
    every = [f for path, text in files.items() for f in functions(path, text)]
    print("\nlargest functions:")
    for span, name in sorted(every, reverse=True)[:12]:
        print(f"  {span:>7,}  {name}")
    over = sum(1 for n in lines.values() if n > 600)
    print(f"\nfiles over 600 lines: {over}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
