"""Imported by the readers' fork server alone, as it starts (`signal_pool`'s preload): a client that leaves
before it has sent its descriptors ends its own request, not the server.

Ctrl-C can land in the owner between its connecting to the server and its sending the descriptors of a new
reader. Python's fork server then reads an end of file, raises `EOFError`, which its loop does not expect, and
dies printing the traceback on the user's terminal. Read as a connection aborted, which the loop does expect, the
request is dropped and the server goes on serving (or ends with its owner).
"""

from __future__ import annotations

import errno
from multiprocessing import reduction

_receive = reduction.recvfds


def _recvfds(sock, size):
    try:
        return _receive(sock, size)
    except EOFError:
        raise ConnectionAbortedError(errno.ECONNABORTED, "the client left before sending its descriptors") from None


reduction.recvfds = _recvfds
