"""Where every rank's ZeRO-3 collectives are, published through the process
group's store, so that a rank whose collective passes fragctl's deadline
names the ranks that did not come (issue 31).

Theory. Every rank of a manager issues the same collectives in the same
order (the block manager's contract), so the n-th collective of every rank
is the same operation on the same block: its sequence number names it
across ranks. Each rank keeps, in memory, the collective it is in (number,
kind, block, bytes, when it entered) and the last one it completed; keeping
them is a few attribute writes per collective, never a store call. A daemon
thread publishes both to the store (key ``fragctl.zero3/<group>/<manager>/
<rank>``) when they changed, at most every ``gap`` seconds, and at least
every ``beat`` seconds even when they did not (a heartbeat: a reader tells a
process that is alive but elsewhere from one that died). The store is the
one ``init_process_group`` met through (TCPStore or FileStore): it does not
go through the communicator that hangs.

Each collective has fragctl's deadline, ``deadline`` seconds after it was
entered: by default 0.8 x the process group's timeout, so it comes before
gloo gives up and before PyTorch's NCCL watchdog. A rank whose collective
passes it publishes its record at once, marked as given up; waits ``gap`` (a
rank that entered in the last moments has published by then); reads every
rank's record, each read bounded in time (the store's host may be the rank
that died); and says which ranks have not entered this collective, where
each last was and how long it has been silent (``report``). Times across
ranks are wall-clock times, so on several hosts they are as good as the
hosts' clock synchronization.
"""
import atexit
import json
import os
import socket
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

#: fragctl's deadline for a collective, as a fraction of the process group's
#: timeout: earlier than gloo's own timeout and PyTorch's NCCL watchdog, so
#: the waiting ranks name the missing ones before anyone is killed.
DEADLINE_FRACTION = 0.8

# Records a reader has not heard from for this many heartbeats are reported
# as possibly dead.
_SILENT_BEATS = 3

# How long reading or writing one record may take in the failure path, and
# reading them all: past that the rest are reported as not read.
_STORE_CALL_S = 1.0
_READ_ALL_S = 3.0

# Ranks in the collective too are listed one per line up to this many, then
# summed up in one line (a report of 1,024 ranks names the few missing).
_LISTED_PRESENT = 8

_managers: Dict[Tuple[int, ...], int] = {}  # group ranks -> managers made for that group in this process
_managers_lock = threading.Lock()
_publishing: "weakref.WeakSet[Progress]" = weakref.WeakSet()  # whose publisher thread runs


@atexit.register
def _stop_publishing() -> None:
    """Stops every publisher thread before the interpreter tears down the
    store it writes to (a daemon thread inside a store call then would touch
    freed memory)."""
    for progress in list(_publishing):
        progress.close()


def group_timeout(dist: Any, group: Any) -> Optional[float]:
    """The process group's collective timeout in seconds
    (``init_process_group(timeout=)`` / ``new_group(timeout=)``), or None
    where this torch does not say."""
    import torch
    getters = [lambda: group.options._timeout]
    for device in ("cpu", "cuda"):
        getters.append(lambda device=device: group._get_backend(torch.device(device)).options._timeout)
    getters.append(lambda: dist.distributed_c10d._get_default_store().timeout)  # the init timeout
    for get in getters:
        try:
            value = get()
            seconds = value.total_seconds() if hasattr(value, "total_seconds") else float(value)
        except Exception:  # noqa: BLE001 (an accessor this torch lacks)
            continue
        if seconds > 0:
            return seconds
    return None


def _group_ranks(dist: Any, group: Any, size: int) -> Tuple[int, ...]:
    """The global ranks of `group`, in group-rank order."""
    if group is None or group is dist.group.WORLD:
        return tuple(range(size))
    try:
        return tuple(dist.get_process_group_ranks(group))
    except Exception:  # noqa: BLE001 (torch 1.13)
        ranks = dist.distributed_c10d._pg_group_ranks[group]  # global rank -> group rank
        return tuple(sorted(ranks, key=ranks.get))


def _run(progress_ref: "weakref.ref[Progress]", stop: threading.Event, gap: float) -> None:
    """The publisher thread: holds its Progress only weakly, so a manager
    dropped without close() is still collected (and its thread ends)."""
    published, last = -1, 0.0
    while not stop.wait(gap):
        progress = progress_ref()
        if progress is None:
            return
        version, now = progress.version, time.monotonic()
        if version != published or now - last >= progress.beat:
            try:
                progress._publish()
                published = version
            except Exception:  # noqa: BLE001 (the store may be gone; try again at the next beat)
                pass
            last = now
        del progress


def _ranges(ranks: List[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    runs: List[List[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in runs)


def _call(function: Callable[[], Any], seconds: float) -> Tuple[bool, Any]:
    """(True, function()) if it returns within `seconds`, else (False, the
    exception or None). A call past its time is left to finish on a daemon
    thread: a store whose host died may block for the store's timeout."""
    box: List[Any] = []

    def run() -> None:
        try:
            box.append((True, function()))
        except Exception as e:  # noqa: BLE001 (reported to the caller)
            box.append((False, e))
    thread = threading.Thread(target=run, name="fragctl-zero3-store", daemon=True)
    thread.start()
    thread.join(seconds)
    return box[0] if box else (False, None)


class Progress:
    """This rank's collectives, and its view of the others' through the store.

    ``enter`` and ``leave`` are the hot path (no store call); ``report`` is
    the failure path. ``describe(block)`` gives a block's name and module
    names. Thread-safe as far as the publisher needs: the records are
    replaced whole, never mutated."""

    def __init__(self, dist: Any, group: Any, rank: int, size: int, deadline: float,
                 group_timeout_s: Optional[float], explicit: bool) -> None:
        self.rank = rank
        self.size = size
        self.deadline = deadline
        self.group_timeout = group_timeout_s
        self.explicit = explicit  # the deadline is shard()'s timeout=, not derived from the group's
        self.describe: Callable[[Any], Tuple[str, List[str]]] = lambda block: (str(block), [])
        self.start = time.time()
        self.sequence = 0
        self.current: Optional[Tuple[int, str, Any, int, float]] = None  # (seq, kind, block, bytes, wall time)
        self.done: Optional[Tuple[int, str, Any, int, float]] = None
        self.gave_up: Optional[Tuple[int, float]] = None  # (seq, wall time)
        self.version = 0
        self.deadline_at = 0.0  # monotonic, of the current collective
        # Publishing: at most every gap, a heartbeat every beat (both a small
        # part of the deadline, so a record is never much older than that).
        self.gap = min(5.0, max(0.05, deadline / 50))
        self.beat = min(30.0, max(0.25, deadline / 10))
        self.store, self.prefix = None, ""
        try:
            self.store = dist.distributed_c10d._get_default_store()
            ranks = _group_ranks(dist, group, dist.get_world_size())
            with _managers_lock:
                n = _managers[ranks] = _managers.get(ranks, 0) + 1
            self.prefix = "fragctl.zero3/%s/%d/" % ("-".join(map(str, ranks)) if len(ranks) <= 8 else
                                                    "%d:%d" % (len(ranks), hash(ranks) & 0xffffffff), n)
        except Exception:  # noqa: BLE001 (no default store: records stay local)
            self.store = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._host = socket.gethostname()
        if self.store is not None:
            try:
                self._publish()  # the first record, synchronously: every reader finds one
            except Exception:  # noqa: BLE001 (the publisher thread tries again)
                pass
            self._thread = threading.Thread(target=_run, args=(weakref.ref(self), self._stop, self.gap),
                                            name="fragctl-zero3-progress", daemon=True)
            self._thread.start()
            _publishing.add(self)

    # --- the hot path -------------------------------------------------------

    def enter(self, kind: str, block: Any, nbytes: int) -> None:
        """This rank entered collective number sequence+1."""
        self.sequence += 1
        self.current = (self.sequence, kind, block, nbytes, time.time())
        self.deadline_at = time.monotonic() + self.deadline
        self.version += 1

    def leave(self) -> None:
        """The collective entered last completed."""
        self.complete(self.current)

    def complete(self, entry: Tuple[int, str, Any, int, float]) -> None:
        """Collective `entry` (and every earlier one) completed. On GPUs
        several may be queued: ``current`` stays the newest queued until it
        completes itself."""
        seq, kind, block, nbytes, _ = entry
        if self.done is None or seq > self.done[0]:
            self.done = (seq, kind, block, nbytes, time.time())
        if self.current is not None and self.current[0] <= seq:
            self.current = None
        self.version += 1

    # --- publishing ---------------------------------------------------------

    def record(self) -> Dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "host": self._host, "start": self.start,
                "in": self.current, "done": self.done, "gave_up": self.gave_up, "published": time.time()}

    def _publish(self) -> None:
        self.store.set(self.prefix + str(self.rank), json.dumps(self.record()))

    def close(self) -> None:
        """Stops publishing (waits for a store call in progress)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(_STORE_CALL_S)
        _publishing.discard(self)

    # --- the failure path ---------------------------------------------------

    def give_up(self, entry: Optional[Tuple[int, str, Any, int, float]] = None) -> None:
        """Marks collective `entry` (default: the current one) abandoned and
        publishes at once."""
        entry = entry or self.current
        if entry is not None:
            self.gave_up = (entry[0], time.time())
            self.version += 1
        if self.store is not None:
            _call(self._publish, _STORE_CALL_S)

    def _read(self, rank: int) -> Tuple[Optional[Dict[str, Any]], str]:
        """(rank's record or None, why none)."""
        key = self.prefix + str(rank)
        ok, _ = _call(lambda: self.store.wait([key], timedelta(seconds=_STORE_CALL_S / 2)), _STORE_CALL_S)
        if not ok:
            return None, "no record in the store (it has not built this manager, or the store is unreachable)"
        ok, value = _call(lambda: self.store.get(key), _STORE_CALL_S)
        if not ok:
            return None, "its record could not be read from the store"
        try:
            return json.loads(bytes(value).decode()), ""
        except ValueError:
            return None, "its record in the store is not readable"

    def where(self, entry: Any) -> str:
        """'all_gather #41 of block 3 'model.layers.2''."""
        seq, kind, block = entry[0], entry[1], entry[2]
        return "%s #%d of %s" % (kind, seq, self.describe(block)[0])

    def report(self, stuck: Optional[Tuple[int, str, Any, int, float]] = None) -> Dict[str, Any]:
        """This rank's view of every rank at a failure of its current
        collective: {"lines": [...], "missing": [ranks that have not entered
        it], "diverged": [ranks in another collective under its number, or
        past it], "records": {rank: record}}. Waits `gap` first, so a rank
        that entered just now has published; reads the store within about
        _READ_ALL_S seconds in all."""
        entry = stuck or self.current or (self.done if self.done else (0, "collective", None, 0, self.start))
        seq = entry[0]
        lines, present, missing, diverged, records = [], [], [], [], {}
        if self.store is None:
            return {"lines": ["the ranks' records could not be read: torch.distributed has no default store"],
                    "missing": [], "diverged": [], "records": {}}
        time.sleep(self.gap)
        budget = time.monotonic() + _READ_ALL_S
        unread = []
        for rank in range(self.size):
            if rank == self.rank:
                continue
            if time.monotonic() > budget:
                unread.append(rank)
                continue
            record, why = self._read(rank)
            now = time.time()
            if record is None:
                lines.append("rank %d: %s" % (rank, why))
                missing.append(rank)
                continue
            records[rank] = record
            line = self._describe_peer(rank, record, entry, now)
            current, done, gave_up = record.get("in"), record.get("done"), record.get("gave_up")
            if (gave_up and gave_up[0] == seq) or (current and current[0] == seq and
                                                   (current[1], current[2]) == (entry[1], entry[2])) or (
                    current and current[0] > seq and not (done and done[0] >= seq)):  # queued past it (GPUs)
                present.append((rank, line))
                continue
            lines.append(line)
            if (current and current[0] >= seq) or (done and done[0] >= seq):
                diverged.append(rank)
            else:
                missing.append(rank)
        if len(present) <= _LISTED_PRESENT:
            lines += [line for _, line in present]
        else:
            lines.append("ranks %s are in it too, or gave up at their deadline"
                         % _ranges([rank for rank, _ in present]))
        if unread:
            lines.append("ranks %s: not read, the store took too long" % _ranges(unread))
        return {"lines": lines, "missing": missing, "diverged": diverged, "records": records}

    def _describe_peer(self, rank: int, record: Dict[str, Any], entry: Any, now: float) -> str:
        seq = entry[0]
        current, done, gave_up = record.get("in"), record.get("done"), record.get("gave_up")
        start = record.get("start", now)
        heard = now - record.get("published", now)
        alive = ("its process last published %.1f s ago" % heard if heard <= _SILENT_BEATS * self.beat else
                 "nothing published for %.1f s: its process may have died or be frozen" % heard)
        if gave_up and gave_up[0] == seq:
            return ("rank %d gave up on %s %.1f s ago: its deadline passed (%s)"
                    % (rank, self.where(entry), now - gave_up[1], alive))
        if current and current[0] == seq:
            if (current[1], current[2]) != (entry[1], entry[2]):
                return ("rank %d is in %s while this rank is in %s: the ranks' collectives diverged (%s)"
                        % (rank, self.where(current), self.where(entry), alive))
            return "rank %d is in %s too, since %.1f s (%s)" % (rank, self.where(current), current[4] - start, alive)
        if current and current[0] > seq and not (done and done[0] >= seq):
            return ("rank %d has queued %s and later collectives, up to #%d; none has completed (%s)"
                    % (rank, self.where(entry), current[0], alive))
        if (current and current[0] > seq) or (done and done[0] >= seq):
            last = current or done
            return ("rank %d is past it, at %s: the ranks' collectives diverged (%s)"
                    % (rank, self.where(last), alive))
        last_activity = max([start] + [e[4] for e in (current, done) if e])
        text = "rank %d has not entered %s" % (rank, self.where(entry))
        if current:
            text += "; it is in %s since %.1f s" % (self.where(current), current[4] - start)
        elif done:
            text += "; it completed #%d (%s of %s) at %.1f s" % (done[0], done[1], self.describe(done[2])[0],
                                                                 done[4] - start)
        else:
            text += "; it has completed no collective of this manager"
        return "%s and has been silent %.1f s (%s)" % (text, now - last_activity, alive)
