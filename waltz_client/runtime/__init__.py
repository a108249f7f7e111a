"""What every daemon shares: settings and their checks, TLS, the connection listener, peer
limits and the guarded, framed peer connection both daemons subclass, the guarded HTTP
endpoint and its probes, the event loop, tasks, durable file changes, memory trim, the
file limit, process CPU time and the daemon runner.

It sits just above ``wire`` and below ``cluster``: it imports neither the client nor any
daemon, and it loads nothing until a module of it is imported (so the client, which uses
``tls``, ``tasks`` and ``settings``, never loads aiohttp through ``daemon`` or ``http_guard``).
"""
