"""What the engine extra asks of torch: a compatible range for everyone who installs it, the one tested
version pinned in CI only."""

import pathlib
import re
import tomllib

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _torch_requirement() -> Requirement:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return next(r for r in map(Requirement, extras["engine"]) if r.name == "torch")


def test_the_engine_extra_takes_a_range_of_torch_not_one_version():
    spec = _torch_requirement().specifier
    assert not any(s.operator in ("==", "===") for s in spec), spec
    assert Version("2.5.0") in spec and Version("2.4.1") not in spec  # F.rms_norm 2.4, SDPA enable_gqa 2.5


def test_ci_pins_a_torch_inside_that_range():
    pins = re.findall(r"'torch==([0-9.]+)'", (ROOT / ".ci" / "run").read_text())
    assert len(pins) == 1 and Version(pins[0]) in _torch_requirement().specifier
