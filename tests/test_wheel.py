"""The distribution as a platform installs it: the wheel is built, installed into a fresh virtual
environment next to an application with its own ``workflows`` and ``activities`` packages (the
example of docs/embedding.md, written from the page as it is), and that application's worker, with
``ResumptionPlugin``, runs a replay as the child of its own workflow.

The wheel is built by ``make wheel`` in a copy of the files the build reads and the Makefile (so
the checkout gets no ``build/``): a venv of its own with pyproject.toml's build requirements and
nothing else (setuptools from the registry), then pip offline (``--no-build-isolation
--no-index``). The test checks that the build environment holds pip and setuptools only, and
that no dev environment was made. The fresh venv the application runs in has no pip and no packages of
its own; the wheel goes in with ``--no-deps``, and the third-party packages (temporalio, redis-py,
pydantic...) come from the project venv's ``site-packages`` through one ``.pth`` line, added as a
plain path: the ``.pth`` files in that directory, among them the editable install that maps
``xmc_resumption`` to this checkout, are not run. A probe in the fresh venv shows that
``xmc_resumption`` is the wheel's copy, that no ``sys.path`` entry is the checkout or inside it
(but for the project venv's ``site-packages``), and that ``workflows``, ``activities`` and
``worker`` are the application's.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from temporalio.testing import WorkflowEnvironment

import xmc_resumption
from tests.support.helpers import GROUP, ROOT, STREAM, hold_tasks, scrape, stream_tasks, worker_polling
from xmc_resumption.services import free_port

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

BUILT_FROM = ("pyproject.toml", "README.md", "LICENSE", "xmc_resumption", "workflows", "activities", "Makefile")
"""What the build reads (pyproject.toml's packages, package-dir, readme and license-files), and the Makefile."""

EXAMPLE = ROOT / "docs" / "embedding.md"

APP_TASK_QUEUE = "platform"
"""The task queue of the example's worker (docs/embedding.md)."""

PROBE = """
import importlib.metadata, importlib.util, json, sys
import activities, workflows, xmc_resumption, xmc_resumption.workflows
import activities.notify, workflows.experiments
dist = importlib.metadata.distribution("xmc-resumption")
print(json.dumps({
    "package": xmc_resumption.__file__,
    "package_workflows": xmc_resumption.workflows.__file__,
    "version": xmc_resumption.__version__,
    "workflows": workflows.__file__,
    "activities": activities.__file__,
    "worker": importlib.util.find_spec("worker").origin,
    "installed": [str(f) for f in dist.files],
    "sys_path": sys.path,
}))
"""


def example_files(markdown: str) -> dict[str, str]:
    """The files of the docs' example: each fenced Python block right after a line naming it."""
    return dict(re.findall(r"^`([\w/]+\.py)`:\n\n```python\n(.*?)^```$", markdown, re.MULTILINE | re.DOTALL))


def build_wheel(out: Path) -> Path:
    """``make wheel`` in a copy of the checkout's files; returns the wheel's path."""
    src = out / "src"
    for name in BUILT_FROM:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, src / name)
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    env |= {k: v for k, v in os.environ.items() if k.startswith("PIP_")}  # the registry, as configured here
    subprocess.run(["make", "-s", "wheel", f"PYTHON={sys.executable}"], cwd=src, env=env, check=True, timeout=300)
    (wheel,) = (src / "dist").glob("*.whl")
    return wheel


def test_make_wheel_needs_only_the_build_requirements(installed: tuple[Path, Path, Path]) -> None:
    """The build environment ``make wheel`` made holds pip and pyproject.toml's build requirements
    only; the dev environment (``.venv``) was never made."""
    wheel, _, _ = installed
    src = wheel.parent.parent
    assert not (src / ".venv").exists()
    listed = subprocess.run(
        [src / ".venv-build" / "bin" / "python", "-m", "pip", "list", "--format=json"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert sorted(p["name"] for p in json.loads(listed.stdout)) == ["pip", "setuptools"]


def fresh_venv(where: Path, wheel: Path) -> Path:
    """A venv without pip or packages, the project venv's third-party packages on a ``.pth`` line
    (``xmc_resumption`` is then not importable: checked), the wheel installed with ``--no-deps``;
    returns its ``bin`` directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=60)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "project_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    before = subprocess.run(
        [python, "-c", "import xmc_resumption"], cwd=where, env=app_env(), capture_output=True, text=True
    )
    assert "No module named 'xmc_resumption'" in before.stderr  # the checkout is out of reach
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index", wheel],
        check=True,
        timeout=120,
    )
    return where / "bin"


def write_app(app: Path) -> dict[str, str]:
    """The docs' example application in ``app``; returns its files."""
    files = example_files(EXAMPLE.read_text())
    for name, text in files.items():
        path = app / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in ("workflows", "activities"):
        (app / package / "__init__.py").write_text("")
    return files


def app_env(**extra: str) -> dict[str, str]:
    """The environment of a process of the application: no PYTHONPATH, nothing of the tests."""
    return {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), **extra}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """(the wheel, the fresh venv's bin directory, the application's directory)."""
    root = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(root)
    bin_dir = fresh_venv(root / "venv", wheel)
    app = root / "app"
    write_app(app)
    yield wheel, bin_dir, app


def test_the_docs_example_is_three_files() -> None:
    files = example_files(EXAMPLE.read_text())
    assert sorted(files) == ["activities/notify.py", "worker.py", "workflows/experiments.py"]
    assert f'task_queue="{APP_TASK_QUEUE}"' in files["worker.py"]


def test_the_wheel_holds_one_import_package_and_the_xmc_command(installed: tuple[Path, Path, Path]) -> None:
    wheel, _, _ = installed
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        info = f"xmc_resumption-{xmc_resumption.__version__}.dist-info"
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
        top_level = whl.read(f"{info}/top_level.txt").decode().split()
    assert {n.split("/")[0] for n in names} == {"xmc_resumption", info}
    assert top_level == ["xmc_resumption"]
    assert entry_points.split() == ["[console_scripts]", "xmc", "=", "xmc_resumption.cli:main"]
    # what the package needs at run time beside its modules
    assert "xmc_resumption/py.typed" in names and "xmc_resumption/redisclient/lua/publish.lua" in names
    sources = {  # every module and script of the source tree, under its installed name
        ("" if top == "xmc_resumption" else "xmc_resumption/") + path.relative_to(ROOT).as_posix()
        for top in ("xmc_resumption", "workflows", "activities")
        for path in (ROOT / top).rglob("*")
        if path.suffix in (".py", ".lua") and "__pycache__" not in path.parts
    }
    assert sources - set(names) == set(), "modules missing from the wheel (pyproject.toml's packages)"
    assert f"{info}/licenses/LICENSE" in names


def test_installed_beside_an_application_with_its_own_packages(installed: tuple[Path, Path, Path]) -> None:
    _, bin_dir, app = installed
    probe = subprocess.run(
        [bin_dir / "python", "-c", PROBE], cwd=app, env=app_env(), capture_output=True, text=True, timeout=60
    )
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    venv = bin_dir.parent.resolve()
    assert Path(seen["package"]).resolve().is_relative_to(venv)
    assert Path(seen["package_workflows"]).resolve().is_relative_to(venv)
    assert seen["version"] == xmc_resumption.__version__
    assert Path(seen["workflows"]).resolve() == app / "workflows" / "__init__.py"
    assert Path(seen["activities"]).resolve() == app / "activities" / "__init__.py"
    assert Path(seen["worker"]).resolve() == app / "worker.py"
    project_venv = Path(sysconfig.get_paths()["purelib"]).resolve()
    for entry in seen["sys_path"]:
        path = (app / entry).resolve()  # "" is the working directory, the application's
        assert not path.is_relative_to(ROOT) or path == project_venv, entry  # never the checkout
    # installed: one package, its dist-info, and the xmc script (in bin/, outside site-packages)
    tops = {f.split("/")[0] for f in seen["installed"] if not f.startswith("..")}
    assert tops == {"xmc_resumption", f"xmc_resumption-{xmc_resumption.__version__}.dist-info"}
    assert [f for f in seen["installed"] if f.startswith("..")] == ["../../../bin/xmc"]
    version = subprocess.run([bin_dir / "xmc", "--version"], cwd=app, env=app_env(), capture_output=True, text=True)
    assert (version.returncode, version.stdout) == (0, f"xmc {xmc_resumption.__version__}\n")


async def test_the_applications_worker_replays_as_the_child_of_its_own_workflow(
    installed: tuple[Path, Path, Path], temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str
) -> None:
    _, bin_dir, app = installed
    client = temporal_env.client
    port = free_port()
    env = app_env(
        TEMPORAL_ADDRESS=client.service_client.config.target_host,
        XMC_REDIS_URL=redis_url,
        METRICS_BIND=f"127.0.0.1:{port}",
    )
    worker = subprocess.Popen(
        [bin_dir / "python", "worker.py"], cwd=app, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        await worker_polling(client, APP_TASK_QUEUE)
        e = f"E{uuid.uuid4().hex[:6]}"
        names = await hold_tasks(redis, e, 30)
        await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)  # the consumers' group: the replay waits for it
        said = await asyncio.wait_for(
            client.execute_workflow(
                "ResumeExperiment", e, id=f"platform-{e}", task_queue=APP_TASK_QUEUE, result_type=str
            ),
            60,
        )
        assert said == f"{e}: completed, 30 tasks replayed"  # the app's own activity ran after the child
        assert await stream_tasks(redis) == names  # every held task exactly once, in order
        child = await client.get_workflow_handle(f"resumption-{e}").describe()
        assert (child.task_queue, child.parent_id) == (APP_TASK_QUEUE, f"platform-{e}")
        replayed = scrape(port).values
        assert [v for (name, _), v in replayed.items() if name == "xmc_resumption_replayed_tasks_total"] == [30]
    finally:
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=30)
    assert "Traceback" not in output, output
