"""The picture of docs/architecture.md, held: which layer of ``tokenization/`` may import which, and what the
Airflow glue may import. ``make lint`` runs it; it prints each import that breaks a rule (file:line, importer,
imported, the rule) and exits 1. It also keeps the doc's "imports" column true: the column is made from the code,
and ``--write`` rewrites it when a change of the code makes it stale.

The import graph is read with ``ast``, every ``import`` statement counted, inside functions and ``TYPE_CHECKING``
blocks too: a lazy import is still an import of that layer.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

# The layers of tokenization/, from the bottom, as the rows of docs/architecture.md's table: each imports only
# layers before it, never one after it.
LAYERS = (
    "version",
    "errors",
    "progress",
    "wording",
    "storage",
    "options",
    "records",
    "orderings",
    "formats",
    "mixing",
    "rendering",
    "inputs",
    "tokenizer",
    "output",
    "stages",
    "builds",
    "cli",
)
# What a layer never imports although the order would let it, or where the reason is worth a line of its own.
NEVER = {
    "tokenizer": {"output": "the engines import nothing of the output protocol"},
    "output": {
        "tokenizer": "the output protocol knows no tokenizer",
        "stages": "the output protocol knows no stage",
    },
}
# The whole of what the Airflow glue (plugins/, dags/) may import of the library: the build, its config (which also
# answers a deployment's questions), its report and pages, and the errors. A module counts with its submodules.
GLUE_MAY_IMPORT = (
    "tokenization.builds.run",
    "tokenization.builds.config",
    "tokenization.builds.report",
    "tokenization.builds.pages",
    "tokenization.errors",
)
GLUE = ("plugins", "dags")
# Modules private to their package: imported from inside it only, whatever the layers allow. The fsspec functions
# under ``Folder``: the layers above reach a store through ``storage.folder`` (a Folder; a file is a folder and a name).
PRIVATE = {"tokenization.storage.files": "tokenization.storage"}
# Imports that break a rule today, (importer, imported), each kept until its code moves. A known exception that no
# longer occurs is an error too, so this list stays true.
KNOWN = {
    # The glue's task checks read a mixture file (load_mixture_file), a type of the storage options (StorageOptions)
    # and the URL check of the allowed locations (malformed_url) below the build, not through its config.
    ("plugins.tokenization_airflow.tasks", "tokenization.mixing.spec"),
    ("plugins.tokenization_airflow.tasks", "tokenization.storage.folder"),
    ("plugins.tokenization_airflow.tasks", "tokenization.storage.locations"),
}
DOC = Path("docs") / "architecture.md"
ROW = re.compile(r"^\| `(?P<layer>\w+)(?:\.py|/)` \|(?P<holds>.*)\|(?P<imports>[^|]*)\|\s*$")


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it stands."""

    path: Path  # relative to the root
    line: int
    importer: str  # a dotted module name
    imported: str


def module_name(path: Path) -> str:
    parts = path.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(root: Path, path: Path) -> list[Import]:
    """Every module ``path`` imports, ``from tokenization import errors`` read as ``tokenization.errors``."""
    importer = module_name(path)
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse((root / path).read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(path, node.lineno, importer, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(path, node.lineno, importer, sub if is_module(root, sub) else base))
    return found


def is_module(root: Path, name: str) -> bool:
    """Whether ``name`` is a module (``from a import b``, b a module) rather than a name inside one."""
    path = root.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def layer_of(module: str) -> str | None:
    """The layer of a module of the library; ``tokenization`` itself (the public API) stands above every layer."""
    parts = module.split(".")
    if parts[0] != "tokenization":
        return None
    return parts[1] if len(parts) > 1 else "tokenization"


def rank(layer: str) -> int:
    return LAYERS.index(layer)


def broken_rule(imp: Import) -> str | None:
    """The rule ``imp`` breaks, in words, or None."""
    top = imp.imported.split(".")[0]
    for private, package in PRIVATE.items():
        if (imp.imported == private or imp.imported.startswith(private + ".")) and not (
            imp.importer == package or imp.importer.startswith(package + ".")
        ):
            return f"{private} is private to {package}: reach a store through a Folder (storage.folder)"
    if imp.importer.split(".")[0] in GLUE:
        if top == "tokenization" and not any(
            imp.imported == allowed or imp.imported.startswith(allowed + ".") for allowed in GLUE_MAY_IMPORT
        ):
            return "the Airflow glue imports only the build, its config, report and pages, and the errors"
        return None
    if top == "airflow":
        return "the library never imports Airflow"
    importer, imported = layer_of(imp.importer), layer_of(imp.imported)
    if importer not in LAYERS or imported is None or imported == importer or imported not in (*LAYERS, "tokenization"):
        return None  # outside the library, the public API's own lazy imports, or outside the layers (named apart)
    if imported == "tokenization":
        return "nothing imports a layer above it: the public API (tokenization/__init__.py) stands above every layer"
    if imported in NEVER.get(importer, {}):
        return f"{importer} never imports {imported}: {NEVER[importer][imported]}"
    if rank(imported) > rank(importer):
        return f"nothing imports a layer above it: {imported} stands above {importer} in the table"
    return None


def sources(root: Path) -> list[Path]:
    return sorted(
        path.relative_to(root)
        for top in ("tokenization", *GLUE)
        for path in (root / top).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def violations(graph: list[Import]) -> list[str]:
    """A line naming each import that breaks a rule, and each known exception no longer met."""
    lines, met = [], set()
    for imp in graph:
        rule = broken_rule(imp)
        if rule is None:
            continue
        if (imp.importer, imp.imported) in KNOWN:
            met.add((imp.importer, imp.imported))
        else:
            lines.append(f"{imp.path}:{imp.line}: {imp.importer} imports {imp.imported}: {rule}")
    return lines + [f"{i} imports {m}: a known exception no longer met" for i, m in sorted(KNOWN - met)]


def layer_imports(graph: list[Import]) -> dict[str, list[str]]:
    """What each layer imports besides itself, in table order: the doc's "imports" column. An import that breaks a
    rule is not in it (it is named on its own, and the table never shows a rule broken)."""
    found: dict[str, set[str]] = {layer: set() for layer in LAYERS}
    for imp in graph:
        importer, imported = layer_of(imp.importer), layer_of(imp.imported)
        if importer in found and imported in found and imported != importer and broken_rule(imp) is None:
            found[importer].add(imported)
    return {layer: sorted(found[layer], key=rank) for layer in LAYERS}


def column(layer: str, imported: list[str]) -> str:
    """A row's imports column: what the layer imports, then what it never imports."""
    if imported and imported == list(LAYERS[: LAYERS.index(layer)]):
        text = "every layer before it"
    else:
        text = ", ".join(f"`{name}`" for name in imported) or "nothing"
    if layer in NEVER:
        text += "; never " + ", ".join(f"`{name}`" for name in NEVER[layer])
    return text


def table_checked(doc: str, imports: dict[str, list[str]]) -> tuple[str, list[str]]:
    """The doc with its imports column made from the code, and what was stale or missing in it."""
    lines, stale = doc.splitlines(keepends=True), []
    for i, line in enumerate(lines):
        match = ROW.match(line)
        if match is None or match["layer"] not in imports:
            continue
        layer = match["layer"]
        made = column(layer, imports[layer])
        if match["imports"].strip() != made:
            stale.append(f"{DOC}:{i + 1}: {layer}: the table says {match['imports'].strip()!r}, the code: {made!r}")
            lines[i] = line[: match.start("imports")] + f" {made} |\n"
    return "".join(lines), stale


def rows_differ(doc: str) -> list[str]:
    """The table's rows against ``LAYERS``: the order the doc shows is the order held."""
    rows = [match["layer"] for line in doc.splitlines() if (match := ROW.match(line))]
    return [] if rows == list(LAYERS) else [f"{DOC}: the table's layers are {rows}, those held are {list(LAYERS)}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the repository")
    parser.add_argument("--write", action="store_true", help="rewrite the doc's imports column from the code")
    args = parser.parse_args(argv)
    graph = [imp for path in sources(args.root) for imp in imports_of(args.root, path)]
    errors = violations(graph) + [
        f"{path}: {layer} is no layer of {DOC}'s table (nor of LAYERS here)"
        for path in sources(args.root)
        if (layer := layer_of(module_name(path))) not in (*LAYERS, "tokenization", None)
    ]
    text = (args.root / DOC).read_text()
    errors += rows_differ(text)
    doc, stale = table_checked(text, layer_imports(graph))
    if args.write:
        (args.root / DOC).write_text(doc)
    else:
        errors += [f"{line} (python scripts/check_layers.py --write makes it)" for line in stale]
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
