"""Run folders: one run at a time per folder, and a record of what ran.

A run holds ``OUT/run.lock`` for its whole life: a JSON file naming the holder (pid, host, start time,
command line) under an exclusive ``flock``. A second run into the folder refuses at once with an error
naming the folder and the holder, instead of interleaving its metrics and overwriting the checkpoints.
The lock file is deleted when the run ends, normally or by an exception. A lock file left by a killed run
(its pid no longer exists on this host) is stale: the next run takes it over with a warning. A lock from
another host cannot be checked and is never taken over; the error says which file to delete once that
run is known to have ended.

Under torchrun all ranks write into one folder, so the run (rank 0) takes one lock for all of them; if it
is refused, rank 0 fails and torchrun stops the other ranks.

``OUT/run.json`` records each start: the command line, the resolved training and model configuration,
the seed, the data sizes and the versions of nystrom, torch, transformers and Python. It is written by
:mod:`nystrom_lab.training.run_record` (``RECORD_NAME`` and its functions are re-exported here);
:func:`guard_run_folder` writes it under the lock.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import socket
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from nystrom_lab.training.run_record import RECORD_NAME, run_record, utc_now, write_run_record  # noqa: F401

try:  # POSIX; elsewhere the pid check alone guards the folder
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = "run.lock"


class RunFolderInUseError(RuntimeError):
    """Another live run holds the folder (or a lock whose holder cannot be checked)."""

    def __init__(self, folder: Path, holder: dict | None, *, reason: str) -> None:
        self.folder, self.holder = Path(folder), holder
        super().__init__(f"run folder {folder} is in use by {_describe(holder)}; {reason}")


def _describe(holder: dict | None) -> str:
    if not holder:
        return "another process (its lock file is being written)"
    cmd = " ".join(holder.get("command") or [])
    return f"pid {holder.get('pid')} on host {holder.get('host')} (since {holder.get('started')}: {cmd})"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:  # pragma: no cover - e.g. an invalid pid on an odd platform: assume it runs
        return True
    return True


def _flock(fd: int) -> bool:
    """Exclusive non-blocking flock; False if another open file holds it. True where flock is unsupported."""
    if fcntl is None:  # pragma: no cover
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # a file system without locks (ENOLCK, EINVAL): the pid check still applies
        return True
    return True


def _read_holder(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = b""
    while chunk := os.read(fd, 65536):
        raw += chunk
    try:
        holder = json.loads(raw)
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


@dataclasses.dataclass
class _Hold:
    fd: int
    path: Path
    thread: int
    created: bool  # the folder did not exist: removed again on release if the run left nothing in it
    depth: int = 1


_held: dict[str, _Hold] = {}
_held_guard = threading.Lock()


def _acquire(folder: Path) -> _Hold:
    created = not folder.is_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": utc_now(), "command": list(sys.argv)}
    for _ in range(10):  # retried only when a releasing holder unlinks the file between open and flock
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not _flock(fd):
                raise RunFolderInUseError(
                    folder,
                    _read_holder(fd),
                    reason="two runs in one folder would mix their checkpoints and metrics",
                )
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            holder = _read_holder(fd)
            if holder is not None:  # a run that ended without releasing, or one flock cannot see
                _check_stale(folder, path, holder)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(me, indent=2).encode())
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        return _Hold(fd=fd, path=path, thread=threading.get_ident(), created=created)
    raise RunFolderInUseError(folder, None, reason="its lock file keeps being replaced; try again")


def _check_stale(folder: Path, path: Path, holder: dict) -> None:
    """Refuse a lock whose holder may be alive; warn when taking over a dead one."""
    pid, host = holder.get("pid"), holder.get("host")
    if host != socket.gethostname():
        raise RunFolderInUseError(
            folder,
            holder,
            reason=f"a process on another host cannot be checked; if that run has ended, delete {path}",
        )
    if isinstance(pid, int) and pid != os.getpid() and _pid_alive(pid):
        raise RunFolderInUseError(
            folder,
            holder,
            reason=f"that process is alive; if it is not a nystrom run (a reused pid), delete {path}",
        )
    warnings.warn(
        f"{path}: taking over the stale lock of pid {pid} on {host} (the process no longer exists; "
        "a killed run resumes from its last checkpoint)",
        stacklevel=4,
    )


def _release(hold: _Hold) -> None:
    try:
        if os.path.samestat(os.fstat(hold.fd), os.stat(hold.path)):
            os.unlink(hold.path)  # before closing: nobody can lock this file and find it unlinked later
    except FileNotFoundError:
        pass
    finally:
        os.close(hold.fd)  # releases the flock
    if hold.created:
        try:
            hold.path.parent.rmdir()  # a run refused before writing anything leaves no empty folder
        except OSError:
            pass  # not empty: the run's outputs


@contextmanager
def hold_run_folder(folder: Path | str) -> Iterator[Path]:
    """Hold ``folder``'s lock for the ``with`` block (the folder is created if missing).

    Raises :class:`RunFolderInUseError` naming the folder and the holder when another run holds it.
    Re-entrant in one thread: a command takes the lock before loading its data, and the training loop
    takes it again (a no-op). Under torchrun only rank 0 locks; the other ranks hold nothing.
    """
    folder = Path(folder)
    if _rank() != 0:
        yield folder
        return
    key = str(folder.resolve())
    with _held_guard:
        hold = _held.get(key)
        if hold is not None and hold.thread != threading.get_ident():
            raise RunFolderInUseError(
                folder, {"pid": os.getpid(), "host": socket.gethostname(), "command": sys.argv},
                reason="another thread of this process is running in it",
            )  # fmt: skip
        if hold is None:
            hold = _held[key] = _acquire(folder)
        else:
            hold.depth += 1
    try:
        yield folder
    finally:
        with _held_guard:
            hold.depth -= 1
            if hold.depth == 0:
                del _held[key]
                _release(hold)


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


F = TypeVar("F", bound=Callable[..., Any])


def guard_run_folder(train_fn: F) -> F:
    """Decorate the loop's ``train(task, cfg, out_dir, ...)``: before any work, check the data splits
    (:func:`nystrom_lab.training.preflight.check_splits`, every rank), then (rank 0) hold ``out_dir``'s lock
    for the whole call and write its run record."""
    from nystrom_lab.training.preflight import check_splits

    sig = inspect.signature(train_fn)

    @functools.wraps(train_fn)
    def train(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        task, cfg, out_dir = (bound.arguments[k] for k in ("task", "cfg", "out_dir"))
        check_splits(task)
        with hold_run_folder(out_dir):
            if _rank() == 0:
                write_run_record(Path(out_dir), run_record(task, cfg))
            return train_fn(*args, **kwargs)

    return train  # type: ignore[return-value]
