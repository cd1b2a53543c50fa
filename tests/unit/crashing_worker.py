"""A nightly worker that aborts on one seed: the crash a test injects.

Usage (as Campaign.worker_command, the parent appends the spec)::

    python tests/unit/crashing_worker.py SEED CALL_JSON SPEC

On SEED it writes the fuzz call it was about to make to CALL_JSON and aborts
(SIGABRT, like a CUDA error); every other seed runs the real worker.
"""

import inspect
import json
import os
import sys


def main() -> int:
    crash_seed, call_path, spec = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    from harness.search import fuzz as search
    from harness.search import nightly

    real = search.fuzz

    def fuzz(*args, **kw):
        call = crash_call(*args, **kw)
        if call["seed"] == crash_seed:
            with open(call_path, "w", encoding="utf-8") as f:
                json.dump(call, f, sort_keys=True)
            print("RuntimeError: CUDA error: an illegal memory access was encountered",
                  file=sys.stderr, flush=True)  # what a crashed CUDA worker prints last
            os.abort()
        return real(*args, **kw)

    fuzz.__wrapped__ = real  # inspect.signature() reads the real one
    search.fuzz = fuzz
    return nightly.worker_main([spec])


def crash_call(*args, **kw) -> dict:
    """The arguments of a ``harness.search.fuzz.fuzz`` call, by name, without
    ``found_by`` (it only labels the trace) and ``stats`` (where a progress
    display reads the counts): what decides the run's outcome."""
    from harness.search.fuzz import fuzz

    bound = inspect.signature(fuzz).bind(*args, **kw)
    bound.apply_defaults()
    call = dict(bound.arguments)
    call.pop("found_by")
    call.pop("stats", None)
    call["faults"] = sorted(call["faults"])
    return call


if __name__ == "__main__":
    sys.exit(main())
