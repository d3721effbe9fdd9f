"""The project's wheel for the deploy tests, built from a copy of the checkout's working tree
(`pip wheel --no-deps`, as scripts/install installs it); for the upgrade, a higher version
(`<version>.post1`) carrying one more controller migration, so the test sees it applied."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
# what setuptools packs (its `where`)
SOURCE_DIRS = ("shared", "services", "cli", "sandbox", "admin")
PROBE_REVISION = "deploy_probe"  # the upgrade wheel's extra migration
PROBE_TABLE = "deploy_upgrade_probe"


def head_revision(versions: Path) -> str:
    """The controller's newest migration: the revision no other revision names as its parent."""
    revisions, parents = set(), set()
    for path in versions.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        found = re.search(r'^revision: str = "([^"]+)"', text, re.MULTILINE)
        parent = re.search(r'^down_revision: [^=]+= "([^"]+)"', text, re.MULTILINE)
        if found:
            revisions.add(found.group(1))
        if parent:
            parents.add(parent.group(1))
    heads = revisions - parents
    if len(heads) != 1:
        raise RuntimeError(f"{versions}: expected one head revision, found {sorted(heads)}")
    return heads.pop()


_PROBE_MIGRATION = '''"""{table}: made by the deploy test's upgrade wheel only."""

import sqlalchemy as sa
from alembic import op

revision = "{revision}"
down_revision = "{parent}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("{table}", sa.Column("id", sa.Integer(), primary_key=True))


def downgrade() -> None:
    op.drop_table("{table}")
'''


def project_version() -> str:
    found = re.search(
        r'^version = "([^"]+)"', (CHECKOUT / "pyproject.toml").read_text(), re.MULTILINE
    )
    if not found:
        raise RuntimeError("pyproject.toml has no version")
    return found.group(1)


def build_wheel(out_dir: Path, work_dir: Path, *, upgrade: bool = False) -> Path:
    """The wheel of this checkout (its working tree, as scripts/install installs it). With
    `upgrade`, version `<version>.post1` and one more controller migration on top."""
    source = work_dir / ("src-upgrade" if upgrade else "src")
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in SOURCE_DIRS:
        shutil.copytree(CHECKOUT / name, source / name, ignore=ignore)
    pyproject = (CHECKOUT / "pyproject.toml").read_text()
    version = project_version()
    if upgrade:
        pyproject = pyproject.replace(f'version = "{version}"', f'version = "{version}.post1"', 1)
        versions = source / "services/controller/lnk_controller/migrations/versions"
        (versions / "9999_deploy_probe.py").write_text(
            _PROBE_MIGRATION.format(
                table=PROBE_TABLE, revision=PROBE_REVISION, parent=head_revision(versions)
            )
        )
    (source / "pyproject.toml").write_text(pyproject)
    shutil.copy2(CHECKOUT / "setup.py", source / "setup.py")  # compiles the confiner, lnk-sandbox
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.whl"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-w",
            str(out_dir),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"pip wheel failed: {result.stderr}")
    made = sorted(set(out_dir.glob("*.whl")) - before)
    if len(made) != 1:
        raise RuntimeError(f"pip wheel made {made} in {out_dir}")
    return made[0]
