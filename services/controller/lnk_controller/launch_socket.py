"""The launch socket: a client passes its stdin, stdout and stderr (and the folders it may reach)
with SCM_RIGHTS, the controller runs the sandbox on them and sends back the exit status.

The dialogue, one JSON frame at a time, is `lnk_shared.launch_protocol`'s (each frame, its
fields, limits and order; this module builds and judges frames with it): the launch request
with its descriptors, the approval question for a new or changed spec, the folders and programs
to open as the owner, then "approved" (a dry request: nothing runs) or "started", the client's
forwarded signals, and the exit or an error.
A "check" request (`lnk sandbox check`) skips the question and remembers nothing: its argv is
only the arguments of the box's own probe program, which the controller puts in front.
An error carries the status of a command that runs nothing (1, 2 or 3) and that of a run (125,
126 or 127: lnk_shared.errors); an exit's message names a limit the sandbox met, which the
client says before it exits with the program's status.
Every "approve?" line and "error" message passes through `lnk_shared.display.shown_lines` on
its way out: whichever client prints it (the C one prints them as they come), no control, bidi or
zero-width character from a spec or a path reaches the terminal.
Before anything else, a caller's uid is checked to be the account its records belong to
(`lnk_controller.accounts`: a recycled uid starts empty). A client that goes away stops its
sandbox. Callers are known by SO_PEERCRED and SO_PEERGROUPS only, and everything is looked up
with those credentials (as_caller); sandbox uids are refused (a sandbox never sees this socket,
this is a second lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from typing import Any

from lnk_controller.accounts import Accounts
from lnk_controller.as_caller import CallerCredentials, peer_credentials
from lnk_controller.host_users import kill_uid_processes
from lnk_controller.launch import Launcher, Running
from lnk_controller.launch_request import LaunchRequest, parse_launch_request
from lnk_controller.spawn import program_pids
from lnk_shared import launch_protocol as protocol
from lnk_shared.display import shown_lines
from lnk_shared.errors import LnkError, NotConfirmedError, StateError, UsageError
from lnk_shared.unix import peer_cred, recv_frame, send_frame

__all__ = ["LaunchServer"]

log = logging.getLogger(__name__)

SIGNAL_NUMBERS = {name: int(getattr(signal, name)) for name in protocol.FORWARDED_SIGNALS}
SIGNAL_WAIT_S = 5.0  # a signal sent as the sandbox starts waits this long for its program
SIGNAL_POLL_S = 0.005


class LaunchServer:
    def __init__(
        self, sock: socket.socket, launcher: Launcher, accounts: Accounts | None = None
    ) -> None:
        self._sock = sock
        self._launcher = launcher
        self._accounts = accounts  # each caller's records are made its own before it is served
        self._stopping = threading.Event()
        self._handlers: set[threading.Thread] = set()

    def serve_forever(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                raise
            handler = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            self._handlers = {t for t in self._handlers if t.is_alive()} | {handler}
            handler.start()

    def shutdown(self) -> None:
        """Take no new launch; those running go on until their sandbox ends."""
        self._stopping.set()
        self._sock.close()

    def drain(self, timeout: float) -> None:
        """Wait (up to `timeout`) for running launches to answer their clients: after the
        controller has cleaned their sandboxes away, each still owes its client an exit."""
        deadline = time.monotonic() + timeout
        for handler in list(self._handlers):
            handler.join(max(0.0, deadline - time.monotonic()))

    def _handle(self, conn: socket.socket) -> None:
        fds: list[int] = []
        with conn:
            try:
                caller = peer_cred(conn)
                cfg = self._launcher.cfg
                if cfg.uid_first <= caller.uid <= cfg.uid_last:
                    raise StateError("a sandbox may not launch sandboxes")
                if self._accounts is not None:
                    self._accounts.check(caller.uid)
                untrusted, fds = recv_frame(conn, want_fds=True)
                protocol.expect(untrusted, protocol.LAUNCH)
                request = parse_launch_request(
                    untrusted, len(fds), unsafe_env_unfiltered=cfg.unsafe_caller_env_unfiltered
                )
                creds = peer_credentials(conn, caller.uid, caller.gid)
                self._run(conn, creds, request, fds)
            except LnkError as exc:
                self._reply_error(conn, exc, str(exc))
            except (ValueError, EOFError, OSError) as exc:
                log.info("launch request refused: %s", exc)
                self._reply_error(conn, UsageError(""), f"bad launch request: {exc}")
            except Exception:
                log.exception("launch failed")
                self._reply_error(conn, LnkError(""), "the controller failed; see its log")
            finally:
                for fd in fds:
                    os.close(fd)

    @staticmethod
    def _reply_error(conn: socket.socket, error: LnkError, message: str) -> None:
        """The error frame: its status for a command that runs nothing and for a run."""
        frame = protocol.error_frame(error.exit_code, error.run_exit_code, shown_lines(message))
        with contextlib.suppress(OSError):
            send_frame(conn, frame)

    def _run(
        self, conn: socket.socket, caller: CallerCredentials, request: Any, fds: list[int]
    ) -> None:
        launcher = self._launcher
        owner_uid = caller.uid
        t0 = time.perf_counter()
        if request.check:
            request = launcher.probe_request(request)
        judged = launcher.judge(request, owner_uid, fds, caller)
        t1 = time.perf_counter()
        # A check runs only the box's probes: it neither asks nor remembers the spec, so
        # checking a spec never approves it for a run.
        if judged.approval_lines is not None and not request.check:
            if not request.yes:
                lines = [shown_lines(line) for line in judged.approval_lines]
                send_frame(conn, protocol.approve_question_frame(lines, judged.digest))
                answer, extra = recv_frame(conn)
                for fd in extra:
                    os.close(fd)
                if not protocol.approval(answer, judged.digest):
                    raise NotConfirmedError("not approved: nothing was run")
            launcher.approve(owner_uid, judged)
        if request.dry:
            self._approved(conn, judged)
            return
        request = self._collect_grant_fds(conn, request, fds, launcher.paths_to_open(judged))
        t2 = time.perf_counter()
        running = launcher.start(request, owner_uid, fds, judged)
        t3 = time.perf_counter()
        for fd in fds:
            os.close(fd)
        fds.clear()
        try:
            master = running.terminal_master
            send_frame(
                conn,
                protocol.started_frame(
                    running.row.id, launcher.limits_said(running), note=running.note
                ),
                [master] if master is not None else None,
            )
            if master is not None:
                os.close(master)
                running.terminal_master = None
            watcher = threading.Thread(target=self._watch_client, args=(conn, running), daemon=True)
            watcher.start()
            status = launcher.waited(running)
            t4 = time.perf_counter()
            met = launcher.limits_outcome(running)
            denied = launcher.denials_outcome(running, status)
            launcher.clean(running, status)
            t5 = time.perf_counter()
        except BaseException:
            self._stop(running)
            raise
        log.info(
            "sandbox %s: judged %.1f ms, started %.1f ms, ran %.1f ms, cleaned %.1f ms",
            running.row.id,
            (t1 - t0) * 1e3,
            (t3 - t2) * 1e3,
            (t4 - t3) * 1e3,
            (t5 - t4) * 1e3,
        )
        # `message`: the limit the sandbox met, which the client says before it exits with the
        # sandbox's own status.
        said = "; ".join(m for m in (met, denied) if m)
        send_frame(conn, protocol.exit_frame(status, said))

    @staticmethod
    def _approved(conn: socket.socket, judged: Any) -> None:
        already = judged.approval_lines is None
        send_frame(conn, protocol.approved_frame(judged.digest, already))

    @staticmethod
    def _collect_grant_fds(
        conn: socket.socket, request: LaunchRequest, fds: list[int], paths: list[str]
    ) -> LaunchRequest:
        """Ask the client to open, as the owner, each folder and program to bind; the
        descriptors it passes back are what gets bound (after a same-file check)."""
        if not paths:
            return request
        send_frame(conn, protocol.open_frame(paths))
        answer, got = recv_frame(conn, want_fds=True)
        base = len(fds)
        fds.extend(got)
        grants = protocol.opened_grants(answer, paths, len(got))
        grant_fds = {path: base + index for path, index in grants.items()}
        return dataclasses.replace(request, grant_fds=grant_fds)

    def _watch_client(self, conn: socket.socket, running: Running) -> None:
        """Forward the client's signals; a client that goes away stops its sandbox."""
        while running.process.poll() is None:
            try:
                message, extra = recv_frame(conn)
            except (EOFError, OSError, ValueError):
                if running.process.poll() is None:
                    log.info("client of %s went away: stopping it", running.row.id)
                    self._stop(running)
                return
            for fd in extra:
                os.close(fd)
            number = protocol.forwarded_signal(message, SIGNAL_NUMBERS)
            if number is not None:
                self._signal(running, number)

    @staticmethod
    def _signal(running: Running, number: int) -> None:
        """Send `number` to the program. A signal forwarded right at the start (the client's
        Ctrl-C as the program starts) waits for bwrap to name the program and for its init to
        have started it, instead of being lost."""
        running.pid_known.wait(SIGNAL_WAIT_S)
        if running.target_pid is None:
            return
        deadline = time.monotonic() + SIGNAL_WAIT_S
        while not (pids := program_pids(running.row.host_uid, running.target_pid)):
            if running.process.poll() is not None or time.monotonic() > deadline:
                return
            time.sleep(SIGNAL_POLL_S)
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                signal.pidfd_send_signal(fd, number)
            except OSError:
                pass
            finally:
                os.close(fd)

    def _stop(self, running: Running) -> None:
        try:
            kill_uid_processes(running.row.host_uid)
        except StateError as exc:
            log.error("%s", exc)
        try:
            running.process.wait(timeout=5)
        except Exception:
            log.error("sandbox %s did not end after kill", running.row.id)
        self._launcher.clean_or_leave(running.row.id, None)
