"""The open-files limit a daemon runs with: its soft limit raised to the hard one at start.

A storage node keeps two files open for every segment it holds (records and index) and
a socket for every peer, so a node that keeps a lot of data needs thousands of
descriptors: a TiB in 1 GiB segments is 2,000. Containers often start with a soft limit
of 1,024 under a hard limit that allows far more (containerd 2 does), and past the soft
limit a segment roll fails and its partition stops serving. Raising the soft limit up
to the hard one needs no privilege; Go's runtime does the same at start.
"""

from __future__ import annotations

import resource

# Where the hard limit is unlimited: the kernel's own default ceiling for a process
# (fs.nr_open, 1,048,576), enough for half a million segments.
UNLIMITED_TARGET = 1 << 20


def chosen_soft_limit(soft: int, hard: int) -> int:
    """The soft limit to run with: the hard limit (``UNLIMITED_TARGET`` where that is
    unlimited), never lower than the soft limit already is."""
    infinity = resource.RLIM_INFINITY
    if soft == infinity:
        return soft
    target = UNLIMITED_TARGET if hard == infinity else hard
    return max(soft, target)


def raise_open_files_limit() -> tuple[int, int, str | None]:
    """Raise this process's soft RLIMIT_NOFILE: (the limit before, the limit now, why it
    could not be raised or None)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = chosen_soft_limit(soft, hard)
    if wanted == soft:
        return soft, soft, None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as e:
        return soft, soft, str(e)
    return soft, wanted, None
