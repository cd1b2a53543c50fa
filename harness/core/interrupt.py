"""Ctrl-C that cannot be swallowed.

Python ignores an exception raised inside a garbage-collector callback
("Exception ignored in: gc_callback"), and Hypothesis registers one: a
KeyboardInterrupt delivered while it runs was lost, and an interrupted fuzz
ran on to a clean exit 0.  :func:`install` puts a SIGINT handler in place that
also *records* the request; :func:`check`, called before every op a session
applies, raises KeyboardInterrupt again while the request stands.  The CLI
installs it for the life of one command.
"""

from __future__ import annotations

import signal
import threading

REQUESTED = threading.Event()


def _on_sigint(signum, frame) -> None:
    REQUESTED.set()
    raise KeyboardInterrupt


def install():
    """Handle SIGINT as above (main thread only); returns the previous handler."""
    REQUESTED.clear()
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, _on_sigint)


def restore(previous) -> None:
    """Put ``previous`` (from :func:`install`) back and forget any request."""
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, previous)
    REQUESTED.clear()


def check() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed (even if it was swallowed)."""
    if REQUESTED.is_set():
        raise KeyboardInterrupt
