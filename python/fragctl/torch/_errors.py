"""The exceptions of fragctl.torch.zero3 and the one place that turns a
fragctl_zero3_status into one of them."""
from typing import Any

from .. import _capi
from ._interop import (ZERO3_COLLECTIVE, ZERO3_INVALID_ARGUMENT, ZERO3_OUT_OF_MEMORY, ZERO3_TIMEOUT,
                       zero3_status_name)


class Zero3Error(RuntimeError):
    """A block-manager call failed; ``status`` is the fragctl_zero3_status value."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class CollectiveError(Zero3Error):
    """A collective failed or timed out: ``rank``, ``collective`` ("all_gather",
    "reduce_scatter") and ``block`` (the block's name) say which."""

    def __init__(self, message: str, status: int, rank: int, collective: str, block: str) -> None:
        super().__init__(message, status)
        self.rank = rank
        self.collective = collective
        self.block = block


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A collective did not complete within the process group's timeout (a
    rank stopped answering)."""



def raise_for_status(status: int, lib: Any, collectives: Any, rank: int) -> None:
    """Raises what a failed fragctl_zero3 call means: first a
    KeyboardInterrupt (or other BaseException) a collective callback caught,
    then CollectiveTimeoutError / CollectiveError with the rank, collective
    and block of the failed collective, ValueError (invalid argument),
    fragctl.OutOfMemoryError, else Zero3Error."""
    interrupt, collectives.interrupt = collectives.interrupt, None
    if interrupt is not None:
        raise interrupt
    message = lib.fragctl_zero3_last_error().decode(errors="replace")
    if status in (ZERO3_COLLECTIVE, ZERO3_TIMEOUT):
        collective, block, detail = collectives.failure or ("", "", "")
        if detail:
            message = "%s (%s)" % (message, detail)
        cls = CollectiveTimeoutError if status == ZERO3_TIMEOUT else CollectiveError
        raise cls(message, status, rank, collective, block)
    if status == ZERO3_INVALID_ARGUMENT:
        raise ValueError("fragctl.torch.zero3: " + message)
    if status == ZERO3_OUT_OF_MEMORY:
        raise _capi.OutOfMemoryError("fragctl.torch.zero3: " + message, "FRAGCTL_ERROR_OUT_OF_MEMORY")
    raise Zero3Error("fragctl.torch.zero3: %s: %s" % (zero3_status_name(status), message), status)
