"""The errors of lnk box: one small hierarchy, each with a message a person can act on.

    LnkError                      exit 1: anything else
    ├── UsageError                exit 2: the command line is wrong
    │   ├── SessionCommandRefused     an SSH session's command that cannot pass as it is (gate)
    │   └── FrameError                a launch socket frame outside its definition
    ├── SpecError                 exit 2: a spec file or flag cannot be read as a spec
    │   ├── ProgramNotFoundError      the program a run names is not found (run: 127)
    │   └── ProgramCannotRunError     the program a run names cannot be started (run: 126)
    ├── ConfigError               exit 2: a service's config file is invalid
    ├── RefusedError              exit 3: a rule refuses what a spec asks for
    │   ├── SettingsGrantRefused      opens the box's settings or agents' folders
    │   ├── OutsideCodeRefused        a write that lets code run outside the sandbox
    │   ├── SelfWideningRefused       a write that widens the spec's own next run
    │   ├── SocketGrantRefused        another program's sockets
    │   ├── PortRefused               a localhost port no sandbox may have
    │   ├── CommandRefused            a [commands] entry that could run written code
    │   ├── LinkRefused               a link not owned by root on the way to a grant
    │   ├── CloudLanRefused           every private range, on a cloud's machine
    │   ├── SandboxHomeRefused        a grant holding the folder sandboxes' homes are mounted in
    │   ├── ServiceRefused            a service call the box never grants (Telegram's setWebhook)
    │   ├── EnvRefused                a variable that changes what a granted program runs
    │   ├── LaunchRefused             a capability the wall needs is missing
    │   ├── KeyRefused                an SSH key line the gate will not write (gate)
    │   ├── FolderRefused             a session folder the gate will not use (gate)
    │   ├── GatePathRefused           a path the gate's forced command cannot hold (gate)
    │   ├── UnsafeFolderRefused       a folder the gate trusts that others could change (gate)
    │   ├── SessionCheckRefused       a key line whose every session the gate would refuse (gate)
    │   ├── SessionWriteRefused       a write grant an SSH session may not have (gate)
    │   └── KeyAccountRefused         a key let in for another account of this name (gate)
    ├── NotConfirmedError         exit 1: what a spec opens was not accepted (run: 126)
    ├── StateError                exit 1: the box's state (database, run dir) is unusable,
    │   │                                 or a service of it (proxy, store bridge) does not answer
    │   ├── ResolverBusy              a sandbox's lookups in flight are at their cap (proxy)
    │   └── ProbesFailed              `lnk sandbox check`'s probes did not report (cli)
    ├── RemoteError               the controller's refusal of a launch, with its own statuses
    ├── AgentKeyRefused           an agent's public key that must not be enrolled (proofs)
    ├── ProofRefused              a bridge call whose proof fails: one answer outward (proofs)
    ├── BridgeError               a bridge's refusal, said to the agent that called (proof_client)
    ├── CallRefused               a signed call whose content the store bridge refuses (bridge)
    └── StoreRefused              a store call refused for what it asks (bridge)
        ├── Conflict                  an append after another (its expected sequence is old)
        ├── StaleToken                a lease's fencing token that is no longer the holder's
        ├── LimitReached              a store's limit (events, conversations, inbox) reached
        └── NotRunning                an inbox message to an agent that is not running

    (gate: lnk_ssh_gate, proxy: lnk_proxy, bridge: lnk_bridge_store, cli: lnk_cli; the others
    are lnk_shared's. `tests/unit/lnk_shared/test_errors.py` checks this tree against every
    subclass in the source, and that no two errors share a name.)

A command that runs a program (`lnk sandbox run`, `lnk sandbox enter`, `lnk agent start`) exits
with the program's own status, so its own errors use statuses a program is unlikely to use for
its failures, as `env`, `timeout` and `docker run` do (`run_exit_code`): 125 lnk's own error (a
usage, spec or config error, the box's state), 126 refused (a rule, a missing capability, not
approved) or the program cannot be run, 127 the program is not found. Every other command
exits with `exit_code`.

Services and the CLI raise these; third-party exceptions are translated at the adapter that
calls the library, and the CLI catches `LnkError` in exactly one place. A spec error's file and
key and a refusal's entry came from a spec or from disk: each is `lnk_shared.display.shown`
(control, bidi and zero-width characters as visible escapes) before it joins the message, and
the CLI shows the whole message through `shown_lines` again when it prints it.
"""

from __future__ import annotations

from lnk_shared.display import shown

__all__ = [
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_RUN_ERROR",
    "EXIT_RUN_NOT_FOUND",
    "EXIT_RUN_REFUSED",
    "EXIT_USAGE",
    "CloudLanRefused",
    "CommandRefused",
    "ConfigError",
    "EnvRefused",
    "FrameError",
    "LaunchRefused",
    "LinkRefused",
    "LnkError",
    "NotConfirmedError",
    "OutsideCodeRefused",
    "PortRefused",
    "ProgramCannotRunError",
    "ProgramNotFoundError",
    "RefusedError",
    "RemoteError",
    "SandboxHomeRefused",
    "SelfWideningRefused",
    "ServiceRefused",
    "SettingsGrantRefused",
    "SocketGrantRefused",
    "SpecError",
    "StateError",
    "UsageError",
]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
# A run's own statuses (the program's pass through): those of env, timeout and docker run.
EXIT_RUN_ERROR = 125  # lnk's own error: nothing was run
EXIT_RUN_REFUSED = 126  # refused, not approved, or the program cannot be run (the shell's)
EXIT_RUN_NOT_FOUND = 127  # the program is not found (the shell's "command not found")


class LnkError(Exception):
    """Base of every error lnk box raises on purpose."""

    exit_code = EXIT_ERROR
    run_exit_code = EXIT_RUN_ERROR  # the status when a command that runs a program fails

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    @classmethod
    def said(cls, message: str) -> LnkError:
        """This error as another process of the box said it (a service's API answer): its
        class and so its exit statuses, with the words as they came; the fields a subclass
        builds its message from are not sent, so they hold the whole message."""
        error = cls.__new__(cls)
        LnkError.__init__(error, message)
        error._heard(message)
        return error

    def _heard(self, message: str) -> None:
        """Set a subclass's own fields for `said` (none here)."""


class UsageError(LnkError):
    exit_code = EXIT_USAGE


class FrameError(UsageError, ValueError):
    """A frame of the launch socket outside its definition (`lnk_shared.launch_protocol`),
    naming the frame and the field. A ValueError too: what reads a frame refuses a malformed
    one (bad JSON, a wrong field) in the one place."""

    def __init__(self, problem: str, *, frame: str = "", field: str = "") -> None:
        super().__init__(f"bad {frame} frame: {field} {problem}" if frame else problem)
        self.frame = frame
        self.field = field


class ConfigError(LnkError):
    exit_code = EXIT_USAGE


class SpecError(LnkError):
    """A spec that cannot be read: names where (file, line), which key, and what was expected."""

    exit_code = EXIT_USAGE

    def __init__(
        self,
        problem: str,
        *,
        source: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        self.problem = problem
        self.source = source
        self.line = line
        self.key = key
        where = ""
        if source is not None:
            where = shown(source) if line is None else f"{shown(source)}:{line}"
        if key is not None:
            where = f"{where}: {shown(key)}" if where else shown(key)
        super().__init__(f"{where}: {problem}" if where else problem)

    def _heard(self, message: str) -> None:
        self.problem, self.source, self.line, self.key = message, None, None, None


class ProgramNotFoundError(SpecError):
    """The program a run names does not exist, or not where the caller can reach it."""

    run_exit_code = EXIT_RUN_NOT_FOUND


class ProgramCannotRunError(SpecError):
    """The program a run names exists but cannot be started (its interpreter is missing)."""

    run_exit_code = EXIT_RUN_REFUSED


class RefusedError(LnkError):
    """A rule refuses an entry. `rule` is a stable id; the message names the entry and why."""

    exit_code = EXIT_REFUSED
    run_exit_code = EXIT_RUN_REFUSED
    rule = "refused"

    def __init__(self, entry: str, why: str) -> None:
        self.entry = entry
        self.why = why
        super().__init__(f"refused [{self.rule}]: {shown(entry)}: {why}")

    def _heard(self, message: str) -> None:
        self.entry, self.why = "", message


class SettingsGrantRefused(RefusedError):
    rule = "box-settings"


class OutsideCodeRefused(RefusedError):
    rule = "code-runs-outside"


class SelfWideningRefused(RefusedError):
    rule = "widens-own-spec"


class SocketGrantRefused(RefusedError):
    rule = "other-programs-sockets"


class PortRefused(RefusedError):
    rule = "localhost-port"


class CommandRefused(RefusedError):
    rule = "command"


class LinkRefused(RefusedError):
    rule = "link-owner"


class CloudLanRefused(RefusedError):
    rule = "lan-on-cloud"


class SandboxHomeRefused(RefusedError):
    """A grant that holds the folder each sandbox's own home is mounted in (/home, /)."""

    rule = "holds-sandbox-home"


class ServiceRefused(RefusedError):
    """A `[[services]]` entry the box never grants (Telegram's setWebhook, logOut, close)."""

    rule = "service"


class EnvRefused(RefusedError):
    """An `[env]` or `--env` name the box never gives a sandbox (`lnk_shared.env_names`)."""

    rule = "environment"


class LaunchRefused(RefusedError):
    """The wall cannot be built as promised; names the missing capability. Never run unconfined."""

    rule = "launch"


class NotConfirmedError(LnkError):
    run_exit_code = EXIT_RUN_REFUSED


class StateError(LnkError):
    pass


class RemoteError(LnkError):
    """The controller's refusal of a launch (its launch socket's "error" frame), with the exit
    statuses it chose for a run and otherwise, and its words already made safe to show."""

    def __init__(self, message: str, code: int, run_code: int = EXIT_RUN_ERROR) -> None:
        super().__init__(message)
        self.exit_code = code
        self.run_exit_code = run_code
