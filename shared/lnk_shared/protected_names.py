"""The one maintained table of names at the top of a write folder that tools read or run outside
the sandbox, and of the files inside `.git` that redirect git: each kept read-only inside every
write grant (one that does not exist is reserved by the wall with a placeholder, see the
controller's staging.py).

Each entry names the tool it belongs to and why a sandbox must not write it. The rule for what
belongs here: a file that makes a tool run code, or pick a program, *without the owner asking
for that code* — on entering the folder (direnv, mise), on opening it in an editor or an agent
(VS Code, Claude Code, Cursor, vim's exrc, Emacs' dir-locals), on any git command (hooks,
config, the files that point git at other config), on a push (CI definitions), or in place of
the program the owner named (a toolchain file, a package manager's own path setting).

Deliberately NOT here, and why:
- Non-dot build files (`Makefile`, `package.json` scripts, `setup.py`, `build.rs`, `justfile`,
  the project's own sources): they run only when the owner asks that build to run, and they are
  the work a sandbox is granted a project to do; the owner reviews them as the project's code.
  `mise.toml` is the exception: mise runs its hooks on entering the folder.
- `.gitattributes`: it can only select filter and diff drivers the owner's own git config
  already defines; `.env`: read as data by dotenv loaders, and sandboxes write it routinely.
- Instructions files (`AGENTS.md`, `CLAUDE.md`): text an agent reads, not code a tool runs.
- Names below the top of a write folder (a nested `sub/.git/hooks`, `sub/.envrc`): only the top
  of each write grant is covered; `lnk sandbox check` reports the deeper ones as a known gap.
- Names a tool derives from a pattern (`mise.<env>.toml`, `*.code-workspace`): not listable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["GIT_REDIRECTS", "PROTECTED_NAMES", "ProtectedName", "protected_paths"]


@dataclass(frozen=True)
class ProtectedName:
    """`path`: relative to the top of a write folder. `kind`: what the tool expects there (a
    placeholder at the top is always an empty folder, which git never lists; see staging.py)."""

    path: str
    kind: Literal["file", "folder"]
    tool: str
    why: str


def _n(path: str, kind: Literal["file", "folder"], tool: str, why: str) -> ProtectedName:
    return ProtectedName(path, kind, tool, why)


# Inside `.git` (only when `.git` is a folder; a worktree's `.git` file is bound read-only).
GIT_REDIRECTS = (
    _n(".git/config", "file", "git", "core.fsmonitor, core.hooksPath, aliases, filters"),
    _n(".git/hooks", "folder", "git", "run on commit, checkout, merge, push"),
    _n(".git/commondir", "file", "git", "points git at another folder's config and hooks"),
    _n(".git/config.worktree", "file", "git", "read as config with extensions.worktreeConfig"),
    _n(".git/info", "folder", "git", "attributes and exclude git applies; sparse patterns"),
    _n(".git/modules", "folder", "git", "each submodule's own config and hooks"),
    _n(".git/worktrees", "folder", "git", "each worktree's commondir and config.worktree"),
)

PROTECTED_NAMES = (
    *GIT_REDIRECTS,
    _n(".gitmodules", "file", "git", "submodule URLs and update commands"),
    _n(".lfsconfig", "file", "git-lfs", "lfs endpoints and transfer agents git-lfs runs"),
    _n(".hg", "folder", "Mercurial", ".hg/hgrc hooks run by every hg command"),
    _n(".jj", "folder", "Jujutsu", "repo config with commands jj runs"),
    _n(".github", "folder", "GitHub Actions", "workflows run with the owner's push"),
    _n(".gitlab-ci.yml", "file", "GitLab CI", "jobs run with the owner's push"),
    _n(".circleci", "folder", "CircleCI", "jobs run with the owner's push"),
    _n(".pre-commit-config.yaml", "file", "pre-commit", "hooks run on each commit"),
    _n(".husky", "folder", "husky", "git hooks husky points git at"),
    _n(".envrc", "file", "direnv", "run on entering the folder"),
    _n(".direnv", "folder", "direnv", "layouts (a virtualenv's bin) .envrc puts on PATH"),
    _n("mise.toml", "file", "mise", "env hooks and tasks run on entering the folder"),
    _n(".mise.toml", "file", "mise", "env hooks and tasks run on entering the folder"),
    _n("mise.local.toml", "file", "mise", "env hooks and tasks run on entering the folder"),
    _n(".mise.local.toml", "file", "mise", "env hooks and tasks run on entering the folder"),
    _n(".mise", "folder", "mise", "its config.toml, read on entering the folder"),
    _n(".config", "folder", "mise", ".config/mise.toml and .config/mise/, read on entering"),
    _n(".tool-versions", "file", "asdf, mise", "which interpreter runs for the owner here"),
    _n(".python-version", "file", "pyenv, uv", "which Python runs for the owner here"),
    _n(".venv", "folder", "uv, poetry, editors", "bin/python and bin/activate run as the owner"),
    _n(".vscode", "folder", "VS Code", "tasks.json, settings naming programs, launch configs"),
    _n(".idea", "folder", "JetBrains IDEs", "run configurations and startup tasks"),
    _n(".zed", "folder", "Zed", "tasks and language servers it starts"),
    _n(".helix", "folder", "Helix", "languages.toml: the language servers it starts"),
    _n(".devcontainer", "folder", "Dev Containers", "postCreateCommand and friends run"),
    _n(".devcontainer.json", "file", "Dev Containers", "postCreateCommand and friends run"),
    _n(".claude", "folder", "Claude Code", "settings.json hooks and MCP servers it starts"),
    _n(".mcp.json", "file", "Claude Code and others", "MCP servers started on opening"),
    _n(".cursor", "folder", "Cursor", "mcp.json servers and rules it starts"),
    _n(".codex", "folder", "Codex CLI", "project config.toml: MCP servers and commands"),
    _n(".gemini", "folder", "Gemini CLI", "settings.json: MCP servers and tool commands"),
    _n(".aider.conf.yml", "file", "aider", "lint-cmd and test-cmd it runs"),
    _n(".exrc", "file", "vim, nvim", "sourced on start with 'exrc' set"),
    _n(".nvimrc", "file", "nvim", "sourced on start with 'exrc' set"),
    _n(".nvim.lua", "file", "nvim", "run on start with 'exrc' set"),
    _n(".dir-locals.el", "file", "Emacs", "eval: forms run on visiting a file"),
    _n(".dir-locals-2.el", "file", "Emacs", "eval: forms run on visiting a file"),
    _n(".npmrc", "file", "npm", "script-shell and node-options: what npm runs"),
    _n(".yarnrc", "file", "yarn 1", "yarn-path: the program run as yarn"),
    _n(".yarnrc.yml", "file", "yarn", "yarnPath and plugins: the code run as yarn"),
    _n(".pnpmfile.cjs", "file", "pnpm", "hooks run on every install"),
    _n(".pnpmfile.mjs", "file", "pnpm", "hooks run on every install"),
    _n("bunfig.toml", "file", "bun", "preload scripts run before every bun command"),
    _n(".bunfig.toml", "file", "bun", "preload scripts run before every bun command"),
    _n(".cargo", "folder", "cargo", "config.toml: rustc-wrapper, runners, aliases"),
    _n("rust-toolchain", "file", "rustup", "which toolchain (or path) runs as cargo and rustc"),
    _n("rust-toolchain.toml", "file", "rustup", "which toolchain (or path) runs as cargo"),
    _n(".mvn", "folder", "Maven", "extensions.xml and jvm.config loaded by every mvn"),
)


def protected_paths() -> tuple[str, ...]:
    """Every protected path, relative to the top of a write folder, in table order."""
    return tuple(name.path for name in PROTECTED_NAMES)
