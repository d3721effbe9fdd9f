"""The sample program: reads its project, writes a result, and tries what a sandbox forbids."""

import os
from pathlib import Path

project = Path(__file__).resolve().parent
print("read   :", (project / "README").read_text().strip())
(project / "out" / "result.txt").write_text("written from inside the sandbox\n")
print("write  : out/result.txt written")
for what, attempt in [
    ("read /root", lambda: os.listdir("/root")),
    ("read /etc/shadow", lambda: Path("/etc/shadow").read_text()),
    ("write the project", lambda: (project / "evil.txt").write_text("x")),
    ("run /usr/bin/id", lambda: os.execv("/usr/bin/id", ["id"])),
]:
    try:
        attempt()
        print(f"LEAKED : {what}")
    except OSError as exc:
        print(f"refused: {what} ({exc.strerror})")
