"""Package discovery for the wheel: every package under ``replica/`` and ``connector/``,
named ``quorumlog.replica.*`` and ``quorumlog.connector.*``. pyproject.toml's
``[tool.setuptools.packages.find]`` names packages after their folders and has no prefix,
so the one rule it cannot say lives here; everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[
        f"quorumlog.{name}"
        for name in find_packages(include=["replica", "replica.*", "connector", "connector.*"])
    ]
)
