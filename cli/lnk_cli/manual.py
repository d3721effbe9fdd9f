"""`python -m lnk_cli.manual FOLDER`: the man page and shell completions, made from the parser.

Both are generated from `lnk_cli.app.build_parser()`, so a command or option added to the parser
is in them at the next install, with the same help text `--help` shows. The generators are
argparse-manpage (the man page, `lnk.1`) and shtab (bash and zsh completion); they are build
tools only: `scripts/install` and the Ansible role run this with them on a temporary path and
put the files beside the prefix, never the tools in it. Writes FOLDER/man/man1/lnk.1,
FOLDER/bash-completion/completions/lnk and FOLDER/zsh/site-functions/_lnk.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lnk_cli.app import VERSION, build_parser

__all__ = ["OUTPUTS", "completion", "main", "manual_page", "write_all"]

# Each file, under the share folder it is written to, where man and the shells look for it.
OUTPUTS = {
    "man": Path("man/man1/lnk.1"),
    "bash": Path("bash-completion/completions/lnk"),
    "zsh": Path("zsh/site-functions/_lnk"),
}


def manual_page() -> str:
    """`man lnk`: every command's usage, options and help, and the exit statuses."""
    from argparse_manpage.manpage import Manpage

    page = Manpage(build_parser())
    page.source = f"lnk box {VERSION}"
    page.manual = "lnk box manual"
    return str(page)


def completion(shell: str) -> str:
    """The completion script for `shell` ("bash" or "zsh"): commands, subcommands, options."""
    import shtab

    return str(shtab.complete(build_parser(), shell=shell))


def write_all(share: Path) -> list[Path]:
    """Write every output under `share` (its folders made 0755, files 0644); the paths."""
    texts = {"man": manual_page(), "bash": completion("bash"), "zsh": completion("zsh")}
    written = []
    for kind, relative in OUTPUTS.items():
        path = share / relative
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.write_text(texts[kind], encoding="utf-8")
        path.chmod(0o644)
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m lnk_cli.manual SHARE_FOLDER", file=sys.stderr)
        return 2
    for path in write_all(Path(argv[0])):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
