"""The tree's rooms, checked: each package imports only itself and `lnk_shared` (with the
exceptions stated here and why), and each source module has its own unit test module
(`tests/unit/<package>/test_<module>.py`), except the ones listed, which are tested end to end
today. Both lists are ratchets: an entry that no longer applies fails the test too, so the
lists only shrink."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "lnk_shared": ROOT / "shared" / "lnk_shared",
    "lnk_controller": ROOT / "services" / "controller" / "lnk_controller",
    "lnk_proxy": ROOT / "services" / "proxy" / "lnk_proxy",
    "lnk_bridge_store": ROOT / "services" / "bridge-store" / "lnk_bridge_store",
    "lnk_ssh_gate": ROOT / "services" / "ssh-gate" / "lnk_ssh_gate",
    "lnk_cli": ROOT / "cli" / "lnk_cli",
    "lnk_inside": ROOT / "sandbox" / "lnk_inside",  # what runs inside a sandbox
    "lnk_admin": ROOT / "admin" / "lnk_admin",
}
SKIPPED_PARTS = {"migrations", "__pycache__"}  # Alembic's generated revisions; caches

# (importer, imported): why the room is crossed.
CROSSINGS = {
    # root's one-shot admin commands write the SSH gate's files with the gate's own code: `lnk
    # box authorize` its key lines (one writer of the line format the gate reads at login),
    # `lnk box up` its sshd drop-in. Both run as root, as the gate's writer is meant to.
    ("lnk_admin", "lnk_ssh_gate"): {"authorize_command.py", "box_commands.py"},
    # `lnk box up` reads the services' log settings from controller.toml with the controller's
    # own model: one reader of that file, and a bad one refused before any service starts.
    ("lnk_admin", "lnk_controller"): {"service_logs.py"},
    # `lnk sandbox enter` is the gate's forced command: the CLI's glue that plans the session
    # with the gate's code, then launches it with the CLI's own launch client.
    ("lnk_cli", "lnk_ssh_gate"): {"enter_command.py"},
    # `lnk sandbox check` plans the steps the probe program runs inside and reads its results:
    # the plan and the verdicts share the probe's constants (MARKER_TIME, KERNEL_CALLS, ...).
    # Outside reads inside, never the other way (lnk_inside imports nothing of the box).
    ("lnk_cli", "lnk_inside"): {
        "check/caller_side.py",
        "check/plan_left.py",
        "check/runner.py",
        "check/verdicts.py",
    },
}

# Modules tested end to end (tests/e2e) but without a unit test module of their own.
UNTESTED_ALONE = {
    "lnk_shared": {
        "frames.py",
        "oom_scores.py",
        "proof_client.py",
        "protected_names.py",
        "service_identity.py",
    },
    "lnk_controller": {
        "agents_api.py",
        "denial_hints.py",
        "denial_records.py",
        "forget_account.py",
        "launch.py",
        "launch_socket.py",
        "models.py",
        "proxy_link.py",
        "seccomp_host_net.py",
        "service.py",
        "specs_api.py",
        "spawn.py",
    },
    "lnk_proxy": {"machine_watch.py", "policy_memo.py"},
    "lnk_bridge_store": {"db.py", "limits.py", "models.py"},
    "lnk_ssh_gate": {"authorize.py", "gate_paths.py"},
    "lnk_admin": {"authorize_command.py", "box_commands.py"},
    "lnk_cli": {
        "app.py",
        "check/command.py",
        "check/login_path.py",
        "enter_command.py",
        "launch_client.py",
    },
}


def _modules(package: str) -> list[Path]:
    root = PACKAGES[package]
    return sorted(
        path
        for path in root.rglob("*.py")
        if not SKIPPED_PARTS.intersection(path.relative_to(root).parts)
    )


def _imported(path: Path) -> set[str]:
    """The top-level package of every absolute import in `path`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def crossings() -> dict[tuple[str, str], set[str]]:
    """(importer, imported) -> the importer's modules, for every import of another package."""
    out: dict[tuple[str, str], set[str]] = {}
    for package, root in PACKAGES.items():
        for path in _modules(package):
            for other in _imported(path) & set(PACKAGES):
                if other not in (package, "lnk_shared"):
                    out.setdefault((package, other), set()).add(str(path.relative_to(root)))
    return out


# Import cycles inside a package (lazy imports in functions included): each stated with why.
CYCLES: set[frozenset[str]] = {
    # the spec model and its sections' models refer to each other; a split of the spec is due
    frozenset({"lnk_shared.spec", "lnk_shared.spec_models", "lnk_shared.spec_services"}),
}


def _module_name(package: str, path: Path) -> str:
    parts = path.relative_to(PACKAGES[package]).with_suffix("").parts
    return ".".join((package, *parts)).removesuffix(".__init__")


def _imports_within(package: str, path: Path) -> set[str]:
    """Every module of `package` that `path` imports, at its top or in a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] == package}


def cycles(package: str) -> set[frozenset[str]]:
    """The package's import cycles: each a set of modules that import their way back."""
    graph = {_module_name(package, p): _imports_within(package, p) for p in _modules(package)}
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo.extend(graph[module])
        reach[start] = seen
    return {frozenset({m} | {o for o in reach[m] if m in reach[o]}) for m in graph if m in reach[m]}


def untested_alone() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for package, root in PACKAGES.items():
        for path in _modules(package):
            relative = path.relative_to(root)
            if path.name in ("__init__.py", "__main__.py"):
                continue
            name = "test_" + "_".join(relative.with_suffix("").parts) + ".py"
            test = ROOT / "tests" / "unit" / package / name
            alone = ROOT / "tests" / "unit" / package / ("test_" + path.name)
            if not test.exists() and not alone.exists():
                out.setdefault(package, set()).add(relative.as_posix())
    return out


def test_each_package_imports_only_itself_lnk_shared_and_the_stated_crossings() -> None:
    assert crossings() == CROSSINGS


def test_lnk_shared_imports_no_other_package_of_the_box() -> None:
    assert not any(importer == "lnk_shared" for importer, _ in crossings())


def test_what_runs_inside_a_sandbox_imports_nothing_of_the_box_but_itself() -> None:
    """lnk_inside is hostile ground started with `python -I -S` and its own folder on the path:
    not even lnk_shared (the standard library only), so no service's code is importable there."""
    found = {
        str(path.relative_to(PACKAGES["lnk_inside"])): others
        for path in _modules("lnk_inside")
        if (others := (_imported(path) & set(PACKAGES)) - {"lnk_inside"})
    }
    assert found == {}


def test_each_source_module_has_its_unit_test_module_except_those_stated() -> None:
    found = untested_alone()
    new = {p: sorted(m - UNTESTED_ALONE.get(p, set())) for p, m in found.items()}
    assert not {p: m for p, m in new.items() if m}, "add tests/unit/<package>/test_<module>.py"
    stale = {p: sorted(m - found.get(p, set())) for p, m in UNTESTED_ALONE.items()}
    assert not {p: m for p, m in stale.items() if m}, "now tested alone: take them off the list"


def test_no_package_has_an_import_cycle_but_those_stated() -> None:
    found = set().union(*(cycles(package) for package in PACKAGES))
    assert found == CYCLES


def test_the_scan_sees_a_lazy_import_cycle(tmp_path: Path) -> None:
    """A cycle hidden by an import inside a function is still a cycle (not vacuous)."""
    package = tmp_path / "lnk_fake"
    package.mkdir()
    (package / "a.py").write_text("from lnk_fake.b import x\n")
    (package / "b.py").write_text("def x():\n    from lnk_fake import a\n")
    (package / "c.py").write_text("import lnk_fake.a\n")
    PACKAGES["lnk_fake"] = package
    try:
        assert cycles("lnk_fake") == {frozenset({"lnk_fake.a", "lnk_fake.b"})}
    finally:
        del PACKAGES["lnk_fake"]


def test_the_scan_sees_a_crossing(tmp_path: Path) -> None:
    """The scan would see a wrong import (the check is not vacuous)."""
    module = tmp_path / "bad.py"
    module.write_text("from lnk_controller import launch\nimport lnk_proxy.server\n")
    assert _imported(module) == {"lnk_controller", "lnk_proxy"}
