"""What a wheel installs: every package under diag's namespace, none at top level.

A job with its own `collectors` or `analyzers` package must not be able to shadow diag's (issue 10):
the repository folders install as `diag.collectors` and `diag.analyzers`."""

from __future__ import annotations

import os

import tomllib

import diag

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _source_dir(package: str, package_dir: dict[str, str]) -> str:
    for prefix in sorted(package_dir, key=len, reverse=True):
        if package == prefix or package.startswith(prefix + "."):
            rest = package[len(prefix) :].lstrip(".").split(".") if package != prefix else []
            return os.path.join(ROOT, package_dir[prefix], *[p for p in rest if p])
    return os.path.join(ROOT, *package.split("."))


def test_every_package_folder_is_listed_under_diag() -> None:
    cfg = _config()
    listed = set(cfg["packages"])
    assert all(p == "diag" or p.startswith("diag.") for p in listed)
    found = set()
    for top, name in (("diag", "diag"), ("collectors", "diag.collectors"), ("analyzers", "diag.analyzers")):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, os.path.join(ROOT, top))
                found.add(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    assert found == listed
    for package in listed:
        assert os.path.isfile(os.path.join(_source_dir(package, cfg["package-dir"]), "__init__.py")), package


def test_sub_packages_import_under_diag_only() -> None:
    import diag.analyzers
    import diag.collectors

    assert diag.collectors.__name__ == "diag.collectors"
    assert os.path.basename(os.path.dirname(diag.analyzers.__file__)) == "analyzers"


def test_version_stated_once() -> None:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert _config()["dynamic"]["version"] == {"attr": "diag.__version__"}
    assert diag.__version__.count(".") == 2
