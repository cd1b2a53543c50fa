"""gpu_impl's scheduler side of a KV connector's asynchronous loads.

Written as vLLM's scheduler treats a P/D decode instance's remote loads
(``vllm/v1/core/sched/scheduler.py``: ``finish_requests``, ``_free_request``,
``_update_from_kv_xfer_finished``; the NIXL connector's per-request read
handles in ``vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py``):

- a request may be loaded by several transfers (handles) at once, and a
  connector may be saving its computed KV to an external store (a store
  reads the blocks until it has finished sending);
- a request that leaves while a transfer of its blocks is in flight — an
  abort, or the first failed transfer under the "fail" policy — keeps its
  blocks until its last transfer has finished (the scheduler delays the free
  until the connector reports the load received or the store sent:
  ``request_finished`` / ``finished_sending``);
- the request's blocks are freed exactly once, when the last transfer ends.

Faults (``family: async``) live at the lines their upstream bugs did.
"""

from __future__ import annotations

ABORT, FAILED = "abort", "failed"
LOAD, STORE = "load", "store"


class KVTransferTracker:
    """Transfers in flight per request, and the requests whose free waits for them.

    ``begin(handle, req, kind)``; ``finish(req, reason)`` when a request leaves
    (``"abort"``: removed or preempted; ``"failed"``: its first failed load)
    returns whether its blocks are freed now; ``end(handle)`` when a transfer
    completes or fails returns (req, whether the blocks of that request, which
    left, are freed now).  A request id that comes back (a preempted request
    resumed) starts with no transfers: those in flight belong to the blocks it
    gave back."""

    def __init__(self, faults):
        self.faults = faults
        self.req_of: dict[int, int] = {}
        self.kind_of: dict[int, str] = {}
        self.in_flight: dict[int, set[int]] = {}  # live requests' transfers
        self.waiting: dict[int, set[int]] = {}  # left requests' transfers: free after them

    def begin(self, handle: int, req: int, kind: str = LOAD) -> None:
        """A transfer of ``req``'s blocks starts: a ``"load"`` into them or a
        ``"store"`` reading them (a connector saving the request's KV)."""
        self.req_of[handle] = req
        self.kind_of[handle] = kind
        self.in_flight.setdefault(req, set()).add(handle)

    def transferring(self, req: int) -> bool:
        """Is a transfer of the live request ``req``'s blocks in flight?"""
        return bool(self.in_flight.get(req))

    def finish(self, req: int, reason: str) -> bool:
        """``req`` leaves; True: free its blocks now, False: when its last transfer ends."""
        handles = self.in_flight.pop(req, set())
        if reason == ABORT and "abort-frees-blocks-mid-load" in self.faults and any(
                self.kind_of[h] == LOAD for h in handles):
            # The historical bug: an aborted request waiting for remote KV was
            # freed at once, the connector still writing into its blocks.
            return True
        if reason == FAILED and "failed-load-frees-before-siblings" in self.faults:
            # The historical race: the first failed handle reported the request
            # failed (and its blocks freed) while its sibling handles still wrote.
            return True
        if "finished-request-frees-blocks-mid-store" in self.faults and any(
                self.kind_of[h] == STORE for h in handles):
            # The historical bug: the connector said nothing was still being
            # sent, so the scheduler freed the blocks a store was still reading.
            return True
        if handles:
            self.waiting[req] = handles
            return False
        return True

    def end(self, handle: int) -> tuple[int, bool]:
        req = self.req_of.pop(handle)
        self.kind_of.pop(handle)
        left = self.waiting.get(req)
        if left is not None and handle in left:
            left.discard(handle)
            if not left:
                del self.waiting[req]
                return req, True
            return req, False
        self.in_flight.get(req, set()).discard(handle)
        return req, False
