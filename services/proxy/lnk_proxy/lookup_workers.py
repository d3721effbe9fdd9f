"""One sandbox's lookup threads, kept between lookups, so the event loop never waits for a
thread to start.

`threading.Thread.start()` blocks its caller until the new thread has run far enough to say it
started: the operating system must schedule it and it must take the GIL from every other
thread that wants it. When the resolver started a thread per lookup on the event loop, a
sandbox flooding the proxy with lookups of uncached names kept the loop waiting there: about a
third of the loop thread's time under bench/proxy.py's fairness row (sampled with py-spy), and
every other sandbox's requests waited with it (their p99 went 20x up). `LookupWorkers` keeps up
to `max_workers` threads, each taking jobs from one queue and leaving after `IDLE_S` without
one; `submit` only queues (no wait) and starts a thread only when every kept one is busy, so a
sandbox that keeps looking names up starts its threads once, not once per lookup.

Security limitations: this does NOT
- bound how long a job runs (`getaddrinfo` cannot be interrupted): the resolver's caller bounds
  its wait and counts the job against its sandbox until it returns;
- bound the jobs queued: the resolver submits at most `max_workers` jobs not yet returned, so
  no job ever waits for a thread (that count is its caller's, `SystemResolver.running`);
- share threads between sandboxes: one sandbox's busy threads never serve another's lookups.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["IDLE_S", "LookupWorkers"]

log = logging.getLogger(__name__)

# A thread kept this long with no job leaves: long enough that a sandbox looking names up every
# few seconds keeps its threads (a start costs the loop a wait), short enough that a burst's
# threads (at most the resolver's cap, ~100 KiB of stack committed each) are soon given back.
IDLE_S = 30.0


class LookupWorkers:
    """Up to `max_workers` threads running submitted jobs, one job at a time each."""

    def __init__(self, max_workers: int, idle_s: float = IDLE_S) -> None:
        self.max_workers = max_workers
        self.idle_s = idle_s
        self.alive = 0  # threads started and not yet left; changed under `_lock` only
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def submit(self, job: Callable[[], None], in_flight: int) -> None:
        """Queue `job`; `in_flight` is how many jobs, this one included, have not returned:
        a thread is started only when there are more than threads kept (RuntimeError when
        none can be, and the job is not queued)."""
        with self._lock:
            if in_flight > self.alive and self.alive < self.max_workers:
                thread = threading.Thread(target=self._work, name="lookup", daemon=True)
                thread.start()  # rare: once per thread kept, not once per lookup
                self.alive += 1
            elif self.alive == 0:
                raise RuntimeError("no lookup thread may be started (max_workers is 0)")
            self._jobs.put(job)

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:  # a job queued meanwhile is taken, never left unserved
                    if self._jobs.empty():
                        self.alive -= 1
                        return
                continue
            try:
                job()
            except Exception:  # a job hands its own errors on; this one is a bug, logged
                log.exception("a lookup job failed")
