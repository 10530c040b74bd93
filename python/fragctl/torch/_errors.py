"""The exceptions of fragctl.torch.zero3 and the one place that turns the
fragctl_status of a failed block-manager call into one of them; a failed
collective is also recorded in the process's fragctl reports (the JSON
report's "hangs", docs/reports.md "Hangs")."""
import json
import time
from typing import Any, Dict, List, Optional, Sequence

from .. import _capi
from ._progress import DEADLINE_FRACTION


class Zero3Error(RuntimeError):
    """A block-manager call failed; ``status`` is the fragctl_status value."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class CollectiveError(Zero3Error):
    """A collective failed or timed out: ``rank`` (this rank), ``collective``
    ("all_gather", "reduce_scatter") and ``block`` (the manager's tag,
    "block 3 'layers.2'") say which; ``sequence`` is its number (the same
    collective has the same number on every rank), ``missing`` the ranks
    that had not entered it, ``peers`` every other rank's published record
    ({rank: record}, docs/torch-services.md "Timeouts")."""

    def __init__(self, message: str, status: int, rank: int, collective: str, block: str, sequence: int = 0,
                 missing: Sequence[int] = (), peers: Optional[Dict[int, Any]] = None) -> None:
        super().__init__(message, status)
        self.rank = rank
        self.collective = collective
        self.block = block
        self.sequence = sequence
        self.missing = list(missing)
        self.peers = dict(peers or {})


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A collective passed fragctl's deadline (or the group's timeout): a rank
    stopped answering. The message names the ranks that had not entered it
    and where each last was; ``deadline`` is fragctl's deadline and
    ``group_timeout`` the process group's timeout, in seconds."""

    def __init__(self, *args: Any, deadline: float = 0.0, group_timeout: Optional[float] = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline
        self.group_timeout = group_timeout


def _seconds(value: float) -> str:
    return "%g s" % round(value, 3)


def _deadline_text(progress: Any) -> str:
    """What fragctl's deadline is and where it comes from, in the numbers in force."""
    group = ("the process group's timeout of %s" % _seconds(progress.group_timeout)
             if progress.group_timeout else "the process group's timeout, which this torch does not tell")
    if progress.explicit:
        return "fragctl's deadline of %s (shard()'s timeout=; %s)" % (_seconds(progress.deadline), group)
    return "fragctl's deadline of %s (%g x %s)" % (_seconds(progress.deadline), DEADLINE_FRACTION, group)


def collective_message(status: int, collectives: Any, rank: int, c_message: str) -> str:
    """The message of a failed collective: what it was, whom it waited for
    and where they were (Progress.report), the deadline in force, then the
    torch.distributed error."""
    progress = collectives.progress
    collective, tag, detail = collectives.failure or ("", "", "")
    report = collectives.report or {"lines": [], "missing": [], "diverged": []}
    entry = collectives.failed
    what = progress.where(entry) if entry else "%s of %s" % (collective, tag)
    if status == _capi.TIMEOUT and collectives.deadline_passed:
        head = "zero3 rank %d: %s did not complete within %s" % (rank, what, _deadline_text(progress))
    elif status == _capi.TIMEOUT:
        head = "zero3 rank %d: %s timed out in torch.distributed (%s)" % (rank, what, _deadline_text(progress))
    else:
        head = "zero3 rank %d: %s failed" % (rank, what)
    missing, diverged = report["missing"], report["diverged"]
    if missing:
        head += "; %s not entered it" % (("rank %d has" % missing[0]) if len(missing) == 1 else
                                         "ranks %s have" % ", ".join(map(str, missing)))
    if diverged:
        head += "; rank%s %s diverged" % ("s" if len(diverged) > 1 else "", ", ".join(map(str, diverged)))
    lines = [head + "; communicator aborted"] + ["  " + line for line in report["lines"]]
    if entry is not None:
        name, modules = progress.describe(entry[2])
        shown = ", ".join(modules[:6]) + (", +%d more" % (len(modules) - 6) if len(modules) > 6 else "")
        lines.append("  %s: module%s %s; %d bytes %s" % (name, "s" if len(modules) != 1 else "", shown or "-", entry[3],
                                                        "gathered" if entry[1] == "all_gather" else "reduced"))
    if detail or c_message:
        lines.append("  (%s)" % (detail or c_message))
    return "\n".join(lines)



def hang_record(status: int, collectives: Any, rank: int, text: str) -> Dict[str, Any]:
    """The failed collective as the reports carry it (docs/reports.md,
    "Hangs"; the keys fragctl_zero3_record_hang documents)."""
    progress = collectives.progress
    collective, tag, _ = collectives.failure or ("", "", "")
    report = collectives.report or {}
    entry = collectives.failed
    block, modules = progress.describe(entry[2]) if entry else (tag, [])
    try:
        backend = "torch.distributed " + str(collectives.dist.get_backend(collectives.group))
    except Exception:  # noqa: BLE001 (the group may be gone)
        backend = "torch.distributed"
    missing: List[int] = list(report.get("missing", ()))
    return {"rank": rank, "world_size": progress.size, "communicator": backend,
            "collective": entry[1] if entry else collective, "sequence": entry[0] if entry else 0,
            "block": block, "modules": list(modules), "bytes": entry[3] if entry else 0,
            "deadline_s": progress.deadline, "group_timeout_s": progress.group_timeout,
            "elapsed_s": round(time.time() - entry[4], 3) if entry else 0.0,
            "timed_out": status == _capi.TIMEOUT, "time_unix_s": round(time.time(), 3),
            "missing": missing, "diverged": list(report.get("diverged", ())),
            "peers": list(report.get("lines", ())), "message": text}


def record(lib: Any, handle: Any, record: Dict[str, Any]) -> None:
    """Hands `record` to the manager's reports (fragctl_zero3_record_hang,
    which rewrites them at once). A report that cannot be written must not
    hide the collective's error: its failure is left to the log."""
    if handle is None or not handle:
        return
    try:
        lib.fragctl_zero3_record_hang(handle, json.dumps(record).encode())
    except Exception:  # noqa: BLE001 (see above)
        pass


def raise_for_status(status: int, lib: Any, collectives: Any, rank: int, handle: Any = None) -> None:
    """Raises what a failed fragctl_zero3_* call's status means: first a
    KeyboardInterrupt (or other BaseException) a collective callback caught,
    then CollectiveTimeoutError / CollectiveError with the rank, collective
    and block of the failed collective (recorded first in the reports of
    the manager `handle`, fragctl_zero3_record_hang), ValueError (invalid
    argument), fragctl.OutOfMemoryError, else Zero3Error."""
    interrupt, collectives.interrupt = collectives.interrupt, None
    if interrupt is not None:
        raise interrupt
    message = lib.fragctl_last_error().decode(errors="replace")
    if status in (_capi.COLLECTIVE, _capi.TIMEOUT):
        collective, block, _ = collectives.failure or ("", "", "")
        text = collective_message(status, collectives, rank, message)
        if collectives.failure is not None and not collectives.recorded:
            collectives.recorded = True  # the manager stays failed: later calls raise the same, recorded once
            record(lib, handle, hang_record(status, collectives, rank, text))
        collectives.raised = True
        report = collectives.report or {}
        entry = collectives.failed
        details = dict(sequence=entry[0] if entry else 0, missing=report.get("missing", ()),
                       peers=report.get("records"))
        if status == _capi.TIMEOUT:
            raise CollectiveTimeoutError(text, status, rank, collective, block, deadline=collectives.progress.deadline,
                                         group_timeout=collectives.progress.group_timeout, **details)
        raise CollectiveError(text, status, rank, collective, block, **details)
    if status == _capi.INVALID_ARGUMENT:
        raise ValueError("fragctl.torch.zero3: " + message)
    if status == _capi.OUT_OF_MEMORY:
        raise _capi.OutOfMemoryError("fragctl.torch.zero3: " + message, "FRAGCTL_ERROR_OUT_OF_MEMORY")
    raise Zero3Error("fragctl.torch.zero3: %s: %s" % (_capi.status_name(status), message), status)
