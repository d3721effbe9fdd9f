"""The grants hash: unchanged by how a spec is written, changed by anything it opens."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lnk_shared.discovery import context_for, resolve_spec
from lnk_shared.grants import GRANTS_VERSION, Grants
from lnk_shared.paths import BoxPaths
from lnk_shared.refusals import judge
from lnk_shared.spec_file import load_spec_file

FAST = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# (section, key) -> id of what is opened -> every spelling of it (each resolves the same).
# Paths: "{home}" is the owner's home; relative paths are read against the spec's folder,
# tmp_path/specs, next to tmp_path/home.
SPELLINGS: dict[tuple[str, str], dict[object, list[object]]] = {
    ("folders", "read"): {
        "r1": ["~/r1", "{home}/r1", "~/r1/../r1", "../home/r1", "~/./r1/", "~/link-r1"],
        "r2": ["~/r2", "{home}/r2", "../home/r2/", "~/r1/../r2"],
        "home": ["~", "{home}", "../home", "~/r1/.."],
    },
    ("folders", "write"): {
        "w1": ["~/w1", "{home}/w1", "~/w1/../w1", "../home/w1"],
        "w2": ["~/w2", "{home}/w2/", "~/link-w2"],
    },
    ("commands", "allow"): {
        "true": ["/usr/bin/true", "true", "/bin/true", "/usr/bin/../bin/true"],
        "python3": ["python3", "/usr/bin/python3", os.path.realpath("/usr/bin/python3")],
        "env": ["env", "/usr/bin/env"],
    },
    ("internet", "hosts"): {
        "pypi.org": ["pypi.org", "PyPI.org", "pypi.org."],
        "*.pythonhosted.org": ["*.pythonhosted.org", "*.PythonHosted.ORG."],
        "github.com:443": ["github.com:443", "GitHub.com.:443"],
        "bücher.example": ["bücher.example", "xn--bcher-kva.example", "BÜCHER.example."],
    },
    ("lan", "hosts"): {
        "10.0.0.0/8": ["10.0.0.0/8"],
        "192.168.1.20": ["192.168.1.20", "192.168.1.20/32"],
        "nas.home.arpa": ["nas.home.arpa", "NAS.home.arpa."],
    },
    ("browser", "hosts"): {
        "accounts.example.com": ["accounts.example.com", "Accounts.Example.com."],
        "login.example.org": ["login.example.org"],
    },
    ("localhost", "ports"): {8080: [8080], 11434: [11434]},
}

Selection = dict[tuple[str, str], frozenset[object]]

selections = st.fixed_dictionaries(
    {key: st.frozensets(st.sampled_from(list(ids))) for key, ids in SPELLINGS.items()}
)


def toml_value(value: object, home: Path) -> str:
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value).replace("{home}", str(home)), ensure_ascii=False)


def toml_list(values: list[str], space: str, multiline: bool) -> str:
    if multiline:
        return "[\n" + "".join(f"  {v},  # entry\n" for v in values) + "]"
    return f"[{space}{', '.join(values)}{space}]"


def render(selection: Selection, data: st.DataObject, home: Path) -> str:
    """One of many TOML texts for `selection`: any spelling, order, duplicates, comments, layout."""
    top: list[str] = []  # dotted keys and inline tables: before the first [header]
    tables: list[str] = []
    sections = sorted({section for section, _ in selection})
    for section in data.draw(st.permutations(sections)):
        keys = [k for s, k in selection if s == section]
        entries: list[tuple[str, str, list[str], bool]] = []
        for key in data.draw(st.permutations(keys)):
            items = [
                data.draw(st.sampled_from(SPELLINGS[section, key][ident]))
                for ident in sorted(selection[section, key], key=str)
                for _ in range(data.draw(st.integers(1, 3)))
            ]
            if not items and data.draw(st.booleans()):
                continue  # an absent key opens what an empty list opens: nothing
            values = [toml_value(v, home) for v in data.draw(st.permutations(items))]
            space = data.draw(st.sampled_from(["", " ", "  ", "\t"]))
            entries.append((key, space, values, data.draw(st.booleans())))
        comment = data.draw(st.sampled_from(["", "  # a comment", " #", "\n# between\n"]))
        layout = data.draw(st.sampled_from(["table", "dotted", "inline"]))
        if layout == "table":
            body = "".join(
                f"{sp}{k}{sp}={sp}{toml_list(v, sp, m)}{comment}\n" for k, sp, v, m in entries
            )
            tables.append(f"{comment}\n[{section}]{comment}\n{body}")
        elif layout == "dotted":
            top += [f"{section}.{k} = {toml_list(v, sp, m)}{comment}\n" for k, sp, v, m in entries]
        elif entries:  # an inline table is one line, and so are its lists
            inline = ", ".join(f"{k} = {toml_list(v, sp, False)}" for k, sp, v, _ in entries)
            top.append(f"{section} = {{ {inline} }}{comment}\n")
    return "".join(top) + "".join(tables) + data.draw(st.sampled_from(["", "\n\n", "# end\n"]))


class Machine:
    """A home with folders and links, and a place for spec files, all under one temp dir."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.specs = root / "specs"
        self._names = itertools.count()
        for d in ("r1", "r2", "w1", "w2", "specs"):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        self.specs.mkdir(exist_ok=True)
        for link, target in (("link-r1", "r1"), ("link-w2", "w2")):
            if not (self.home / link).is_symlink():
                (self.home / link).symlink_to(target)

    def grants(self, text: str) -> Grants:
        path = self.specs / f"spec{next(self._names)}.toml"
        path.write_text(text, encoding="utf-8")
        spec = load_spec_file(path).build()
        box = BoxPaths(self.root / "box/c", self.root / "box/s", self.root / "box/r")
        env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(self.root / "xdg")}
        ctx = context_for(os.getuid(), env=env, box=box, spec_file=str(path), home=str(self.home))
        return judge(resolve_spec(spec, ctx, path_env="/usr/bin:/bin"), ctx)


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


@FAST
@given(selection=selections, data=st.data())
def test_hash_is_unchanged_by_comments_whitespace_order_duplicates_and_spelling(
    machine: Machine, selection: Selection, data: st.DataObject
) -> None:
    one = machine.grants(render(selection, data, machine.home))
    two = machine.grants(render(selection, data, machine.home))
    assert one.canonical() == two.canonical()
    assert one.digest() == two.digest()


@FAST
@given(first=selections, second=selections, data=st.data())
def test_hash_changes_when_any_resolved_grant_changes(
    machine: Machine, first: Selection, second: Selection, data: st.DataObject
) -> None:
    one = machine.grants(render(first, data, machine.home))
    two = machine.grants(render(second, data, machine.home))
    assert (one.digest() == two.digest()) == (first == second)


@pytest.mark.parametrize(
    ("section", "key", "ident"),
    [(s, k, i) for (s, k), ids in SPELLINGS.items() for i in ids],
)
def test_adding_any_one_grant_changes_the_hash(
    machine: Machine, section: str, key: str, ident: object
) -> None:
    base = machine.grants("")
    value = toml_value(SPELLINGS[section, key][ident][0], machine.home)
    assert machine.grants(f"[{section}]\n{key} = [{value}]\n").digest() != base.digest()


@pytest.mark.parametrize(
    ("text", "other"),
    [
        ('internet.hosts = ["pypi.org"]', 'internet.hosts = ["*"]'),
        ('lan.hosts = ["10.0.0.0/8"]', 'lan.hosts = ["*"]'),
        ('commands.allow = ["true"]', 'commands.allow = ["*"]'),
        ('folders.read = ["~/w1"]', 'folders.write = ["~/w1"]'),
        ("", 'network.mode = "host"'),
        ('internet.hosts = ["github.com"]', 'internet.hosts = ["github.com:443"]'),
        ('internet.hosts = ["pypi.org"]', 'internet.hosts = ["*.pypi.org"]'),
        ('internet.hosts = ["pypi.org"]', 'browser.hosts = ["pypi.org"]'),
        ('internet.hosts = ["github.com"]', 'internet.hosts = ["github.com:22"]'),
        ('internet.hosts = ["*"]', 'internet.hosts = ["*", "github.com:22"]'),
    ],
)
def test_widening_a_grant_changes_the_hash(machine: Machine, text: str, other: str) -> None:
    assert machine.grants(text + "\n").digest() != machine.grants(other + "\n").digest()


def test_link_retargeted_under_a_granted_folder_changes_the_hash(machine: Machine) -> None:
    (machine.home / "dir/x").mkdir(parents=True)
    (machine.home / "dir/y").mkdir()
    link = machine.home / "dir/link"
    link.symlink_to("x")
    text = 'folders.read = ["~/dir/link"]\n'
    before = machine.grants(text)
    link.unlink()
    link.symlink_to("y")
    after = machine.grants(text)
    assert before.digest() != after.digest()
    assert after.read[0].real == str(machine.home / "dir/y")


def test_link_retargeted_to_the_same_place_keeps_the_hash(machine: Machine) -> None:
    (machine.home / "dir/x").mkdir(parents=True)
    link = machine.home / "dir/link"
    link.symlink_to("x")
    text = 'folders.write = ["~/dir/link"]\n'
    before = machine.grants(text)
    link.unlink()
    (machine.home / "dir/other").symlink_to(machine.home / "dir/x")
    link.symlink_to("other")
    assert machine.grants(text).digest() == before.digest()


def test_link_retargeted_above_a_granted_path_changes_the_hash(machine: Machine) -> None:
    for d in ("a/sub", "b/sub"):
        (machine.home / d).mkdir(parents=True)
    (machine.home / "top").symlink_to("a")
    text = 'folders.read = ["~/top/sub"]\n'
    before = machine.grants(text)
    (machine.home / "top").unlink()
    (machine.home / "top").symlink_to("b")
    assert machine.grants(text).digest() != before.digest()


def test_program_replaced_on_path_changes_the_hash(machine: Machine) -> None:
    bin_dir = machine.root / "bin"
    (machine.root / "real").mkdir()
    for name in ("tool-1", "tool-2"):
        (machine.root / "real" / name).write_text("#!/bin/sh\n")
        (machine.root / "real" / name).chmod(0o755)
    bin_dir.mkdir()
    (bin_dir / "tool").symlink_to("../real/tool-1")
    path = machine.specs / "tool.toml"
    path.write_text('commands.allow = ["tool"]\n')
    box = BoxPaths(machine.root / "c", machine.root / "s", machine.root / "r")
    ctx = context_for(os.getuid(), env={}, box=box, spec_file=str(path), home=str(machine.home))

    def digest() -> str:
        spec = load_spec_file(path).build()
        # Judged without the /tmp command rule: only the hash is under test here.
        return Grants(resolve_spec(spec, ctx, path_env=str(bin_dir)), (), ()).digest()

    before = digest()
    (bin_dir / "tool").unlink()
    (bin_dir / "tool").symlink_to("../real/tool-2")
    assert digest() != before


def test_canonical_document_is_versioned_sorted_json(machine: Machine) -> None:
    grants = machine.grants('internet.hosts = ["b.example", "a.example"]\n')
    doc = json.loads(grants.canonical_json())
    assert doc["version"] == GRANTS_VERSION
    assert doc["internet"] == ["a.example", "b.example"]
    assert grants.canonical_json() == json.dumps(doc, sort_keys=True, separators=(",", ":"))
    assert len(grants.digest()) == 64
    assert int(grants.digest(), 16) >= 0


def test_hash_ignores_the_written_form_and_the_spec_source(machine: Machine) -> None:
    one = machine.grants('folders.read = ["~/r1"]\n')
    two = machine.grants(f'[folders]\nread = ["{machine.home}/link-r1"]\n')
    assert one.read[0].written != two.read[0].written
    assert one.spec.source != two.spec.source
    assert one.digest() == two.digest()


def test_star_alone_hashes_as_it_did_before_port_22_was_kept_beside_it(machine: Machine) -> None:
    star = machine.grants('internet.hosts = ["*"]\n')
    assert star.canonical()["internet"] == "*"
    both = machine.grants('internet.hosts = ["*", "pypi.org", "github.com:22"]\n')
    assert both.canonical()["internet"] == ["*", "github.com:22"]


def test_a_store_is_in_the_hash_only_when_kept(machine: Machine) -> None:
    plain = machine.grants("")
    assert "store" not in plain.canonical()  # specs without one keep the hash they had
    kept = machine.grants('[store]\ndriver = "sqlite"\n')
    assert kept.canonical()["store"] == "sqlite"
    assert kept.digest() != plain.digest()
    assert kept.digest() != machine.grants('[store]\ndriver = "postgresql"\n').digest()
