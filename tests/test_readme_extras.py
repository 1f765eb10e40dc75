"""Every README code block is installable by what the README says to install: the modules each
runnable Python block imports come from shardstream itself, the standard library, or a
distribution that the extras the README names (``pip install '.[train,s3]'``,
``'.[train,text]'``) bring in, directly or through their own requirements, as resolved in this
environment. (The blocks themselves run in tests/test_docs_examples.py, in the full test
environment; this checks they would not need a package the README never asked for.)"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys

from docs_blocks import ROOT, page_blocks
from packaging.requirements import Requirement

README = ROOT / "README.md"


def named_extras() -> set[str]:
    text = README.read_text(encoding="utf-8")
    return {
        e.strip() for group in re.findall(r"pip install '\.\[([\w,]+)\]'", text) for e in group.split(",")
    }


def closure(requirements: list[str]) -> set[str]:
    """Normalised names of the installed distributions these requirements pull in."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # not installed here (an optional or platform-specific requirement)
        seen.add(name)
        for extra in req.extras or {""}:
            for sub in dist.requires or []:
                child = Requirement(sub)
                if child.marker is None or child.marker.evaluate({"extra": extra}):
                    todo.append(child)
    return seen


def imports(code: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_readme_names_the_extras_it_uses() -> None:
    import tomllib  # Python 3.11+, as the test environment is

    extras = named_extras()
    assert {"train", "s3", "text"} <= extras, extras
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    available = closure(requirements)
    by_module = metadata.packages_distributions()
    missing = []
    for block in page_blocks(README):
        if block.not_run is not None or block.language != "python":
            continue
        for module in sorted(imports(block.code)):
            if module == "shardstream" or module in sys.stdlib_module_names:
                continue
            dists = {re.sub(r"[-_.]+", "-", d).lower() for d in by_module.get(module, [])}
            if not dists & available:
                missing.append(
                    f"README.md:{block.line}: {module} ({', '.join(sorted(dists)) or 'not installed'})"
                )
    assert missing == [], f"imported by a README block, brought by no extra it names: {missing}"


def test_the_check_sees_a_package_no_extra_brings() -> None:
    available = closure(["numpy>=1.23"])
    assert "numpy" in available and "pyarrow" not in available
    assert imports("import pyarrow.parquet as pq\nfrom tokenizers import Tokenizer\n") == {
        "pyarrow",
        "tokenizers",
    }
