"""Every patch of the workflow is registered in workflows/versions.py, and every registered one is covered by the
recorded histories (docs/development.md, "Changing the workflow").

The IDs are found by reading the source (AST): every ``workflow.patched(...)`` and ``workflow.deprecate_patch(...)``
call under workflows/, whose argument is a string or a module-level string constant of the same file.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from tests.record_histories import HISTORIES, releases
from tests.support.helpers import ROOT
from xmc_resumption.workflows.versions import PATCHES, Patch

PATCH_CALLS = ("patched", "deprecate_patch")


def patch_ids(source: str, where: str) -> dict[str, str]:
    """The patch IDs ``source`` asks for, each with where (``file:line``).

    Raises:
        AssertionError: a call whose ID is neither a string nor a module-level string constant of ``source``.
    """
    tree = ast.parse(source)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name not in PATCH_CALLS:
            continue
        arg = node.args[0] if node.args else None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found[arg.value] = f"{where}:{node.lineno}"
        elif isinstance(arg, ast.Name) and arg.id in constants:
            found[constants[arg.id]] = f"{where}:{node.lineno}"
        else:
            raise AssertionError(f"{where}:{node.lineno}: {name}() needs a string or a module constant, as an ID")
    return found


def marked(path: Path) -> set[str]:
    """The patch IDs recorded in a history's ``core_patch`` markers."""
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    ids = set()
    for event in history.events:
        attributes = event.marker_recorded_event_attributes
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED and attributes.marker_name == "core_patch":
            ids.add(json.loads(attributes.details["patch-data"].payloads[0].data)["id"])
    return ids


def problems(used: dict[str, str], registry: tuple[Patch, ...], histories: Path) -> list[str]:
    """What is wrong between the patch IDs ``used`` (ID -> where), the ``registry`` and the recorded ``histories``."""
    found: list[str] = []
    registered = {p.id: p for p in registry}
    for patch_id, where in sorted(used.items()):
        if patch_id not in registered:
            found.append(f"{patch_id} ({where}) is not registered in workflows/versions.py")
    for patch in registry:
        if patch.id not in used:
            found.append(f"{patch.id} is registered but no longer asked for: remove it from workflows/versions.py")
        missing = [h for h in patch.histories if not (histories / h).is_file()]
        if missing:
            found.append(f"{patch.id}: no recorded history {', '.join(missing)}")
            continue
        with_marker = [h for h in patch.histories if patch.id in marked(histories / h)]
        if not with_marker:
            found.append(f"{patch.id}: no listed history was recorded with it (its marker): the new branch is untested")
        if len(with_marker) == len(patch.histories) and patch.deprecated_in is None:
            found.append(f"{patch.id}: every listed history has its marker: none replays the old branch")
    return found


def test_every_patch_under_workflows_is_registered_and_covered() -> None:
    used: dict[str, str] = {}
    for path in sorted((ROOT / "workflows").glob("*.py")):
        used |= patch_ids(path.read_text(), f"workflows/{path.name}")
    assert problems(used, PATCHES, HISTORIES) == []


PLANTED = """
from temporalio import workflow

FASTER_LOOP = "faster-loop"

async def turn() -> None:
    if workflow.patched(FASTER_LOOP):
        ...
    workflow.deprecate_patch("older-wait")
"""
"""A workflow module that asks for two patches, one by a constant and one by a literal."""


def test_a_planted_unregistered_patch_fails() -> None:
    used = patch_ids(PLANTED, "planted.py")
    assert used == {"faster-loop": "planted.py:7", "older-wait": "planted.py:9"}
    assert problems(used, (), HISTORIES) == [
        "faster-loop (planted.py:7) is not registered in workflows/versions.py",
        "older-wait (planted.py:9) is not registered in workflows/versions.py",
    ]


def test_a_registered_patch_needs_histories_of_both_branches(tmp_path: Path) -> None:
    release = releases()[-1].name
    recorded = f"{release}/completed_after_throttles.json"
    # without a history, then with only histories that never asked for it (no marker: the new branch untested)
    absent = Patch("faster-loop", "9.9.9", "scripts in rounds", ("9.9.9/none.json",))
    unmarked = Patch("faster-loop", "9.9.9", "scripts in rounds", (recorded,))
    used = {"faster-loop": "planted.py:7"}
    assert problems(used, (absent,), HISTORIES) == ["faster-loop: no recorded history 9.9.9/none.json"]
    assert problems(used, (unmarked,), HISTORIES) == [
        "faster-loop: no listed history was recorded with it (its marker): the new branch is untested"
    ]
    # a history recorded with the patch beside one from before it: covered
    marker = {
        "eventId": "99",
        "eventType": "EVENT_TYPE_MARKER_RECORDED",
        "markerRecordedEventAttributes": {
            "markerName": "core_patch",
            "details": {"patch-data": {"payloads": [{"data": "eyJpZCI6ImZhc3Rlci1sb29wIn0="}]}},  # {"id":"faster-loop"}
        },
    }
    history = json.loads((HISTORIES / recorded).read_text())
    history["events"].insert(4, marker)
    (tmp_path / "9.9.9").mkdir()
    (tmp_path / "9.9.9" / "with.json").write_text(json.dumps(history))
    (tmp_path / release).mkdir()
    (tmp_path / recorded).write_text((HISTORIES / recorded).read_text())
    both = Patch("faster-loop", "9.9.9", "scripts in rounds", (recorded, "9.9.9/with.json"))
    assert problems(used, (both,), tmp_path) == []
    assert problems({}, (both,), tmp_path) == [
        "faster-loop is registered but no longer asked for: remove it from workflows/versions.py"
    ]
