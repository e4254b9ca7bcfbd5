"""The wheel as a new user gets it: built with ``pip wheel``, installed into a fresh venv
apart from the checkout, a 3-node cluster started with the installed ``quorumlog``
command, and a topic read with ``spark.read.format("quorumlog")`` from the installed
package. Every other test runs from the checkout, where a package the wheel forgets is
still importable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.spark import REPO, SHORT_JVM

#: What the build reads; a copy keeps the checkout free of build/ and egg-info.
SOURCES = ["pyproject.toml", "setup.py", "README.md", "pyspark_quorumlog.py"]
PACKAGES = {"replica": "quorumlog.replica", "connector": "quorumlog.connector"}

#: Run by the venv's python, which cannot import tests.support (that would put the
#: checkout on sys.path): hence its own small session.
SPARK_READ = """
import json, os, sys
import pyspark_quorumlog, quorumlog.replica
from pyspark.sql import SparkSession

bootstrap, topic = sys.argv[1], sys.argv[2]
spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .getOrCreate()
)
try:
    df = spark.read.format("quorumlog").option("bootstrap", bootstrap).option("topic", topic).load()
    values = sorted(bytes(r["value"]).decode() for r in df.select("value").collect())
finally:
    spark.stop()
found = {"source": pyspark_quorumlog.__file__, "replica": quorumlog.replica.__file__,
         "path": sys.path, "values": values}
print("RESULT " + json.dumps(found))
"""


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip wheel --no-deps`` builds from a copy of the checkout's sources."""
    src = tmp_path_factory.mktemp("wheel-src")
    for name in SOURCES:
        shutil.copy2(REPO / name, src / name)
    for folder in PACKAGES:
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
        src,
        dict(os.environ),
        300,
    )
    (built,) = dist.glob("quorumlog-*.whl")
    return built


def test_wheel_holds_every_package(wheel: Path) -> None:
    """Every package folder under replica/ and connector/ is in the wheel, with the Spark
    discovery module and the console script."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, package in PACKAGES.items():
        for init in sorted((REPO / folder).rglob("__init__.py")):
            rel = init.relative_to(REPO / folder).with_suffix("")
            path = "/".join([*package.split("."), *rel.parts]) + ".py"
            assert path in names, f"{init.relative_to(REPO)} is not in the wheel as {path}"
    assert "pyspark_quorumlog.py" in names
    (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "quorumlog = quorumlog.replica.cli.main:main" in text


@pytest.fixture
def venv(wheel: Path, tmp_path: Path) -> Path:
    """A fresh venv with the wheel installed. Its dependencies (pyspark is hundreds of MB)
    come from the project venv's site-packages, named by a .pth line: a plain path, so the
    .pth files there (the editable install's finder, the checkout's discovery module) are
    not run and the checkout stays off sys.path."""
    env_dir = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], tmp_path, _env(), 120)
    python = env_dir / "bin" / "python"
    purelib = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        tmp_path,
        _env(),
        60,
    ).strip()
    Path(purelib, "zz-project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install"]
        + ["--no-deps", "--no-index", "-q", str(wheel)],
        tmp_path,
        _env(),
        300,
    )
    return env_dir


def _env(**extra: str) -> dict[str, str]:
    """The environment without anything that would put the checkout on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    return {**env, **extra}


@pytest.fixture
def installed_cluster(venv: Path, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``quorumlog cluster up --nodes 3 --metrics`` from the venv's console script: its
    bootstrap and its metrics endpoints."""
    proc = subprocess.Popen(
        [str(venv / "bin" / "quorumlog"), "cluster", "up", "--nodes", "3", "--metrics"]
        + ["--data-dir", str(tmp_path / "data"), "--log-level", "WARNING"],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        found: dict[str, str] = {}
        # cluster up gives up after its 60 s start timeout and exits: readline ends then.
        for _ in range(10_000):
            line = proc.stdout.readline()
            if not line:
                raise AssertionError("cluster up exited:\n" + "".join(seen))
            seen.append(line)
            for key in ("bootstrap", "metrics endpoints"):
                if line.startswith(key):
                    found[key] = line.split(": ", 1)[1].strip()
            if len(found) == 2:
                yield found["bootstrap"], found["metrics endpoints"]
                break
    finally:
        proc.terminate()  # cluster up stops its nodes on SIGTERM
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.cluster
@pytest.mark.spark
@pytest.mark.timeout(240)
def test_installed_wheel_serves_and_spark_reads(
    venv: Path, installed_cluster: tuple[str, str], tmp_path: Path
) -> None:
    bootstrap, endpoints = installed_cluster
    quorumlog = str(venv / "bin" / "quorumlog")
    python = str(venv / "bin" / "python")
    env = _env(
        PYSPARK_PYTHON=python,
        PYSPARK_DRIVER_PYTHON=python,
        SPARK_LOCAL_IP="127.0.0.1",
        JAVA_TOOL_OPTIONS=SHORT_JVM,  # a JVM that lives seconds
    )
    b = ["--bootstrap", bootstrap]
    _run([quorumlog, "topic", "create", "installed", "-p", "2", *b], tmp_path, env, 60)
    values = [f"v{i:03}" for i in range(50)]
    proc = subprocess.run(
        [quorumlog, "produce", "installed", *b],
        input="\n".join(values) + "\n",
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "spark_read.py"
    script.write_text(SPARK_READ)
    out = _run([python, str(script), bootstrap, "installed"], tmp_path, env, 180)
    (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
    found = json.loads(line[len("RESULT ") :])
    assert found["values"] == values
    site = str(venv)
    assert found["source"].startswith(site) and found["replica"].startswith(site), found
    # The checkout itself (its folders or the script's own) is not where imports come from.
    checkout = {str(REPO), str(REPO / "replica"), str(REPO / "connector")}
    assert not checkout & set(found["path"]), found["path"]
    # The metrics endpoints (prometheus-client comes with the install) and the live view.
    frame = _run(
        [quorumlog, "top", "-b", endpoints, "--once", "--interval", "0.2"], tmp_path, env, 60
    )
    assert frame.startswith("quorumlog top: 3 of 3 nodes up") and "installed" in frame, frame
