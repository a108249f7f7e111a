"""``waltz fuzz``: structure-aware fuzzing of the daemons' binary protocols.

The core is pure and seeded: a seed gives connection plans, and for each connection the
bytes a peer sends (a valid handshake, and on storage a valid Open, or a broken or
missing one), then frames of every request type built with the project's own encoders,
some left valid and some mutated. The same seed always gives the same bytes; each
connection has its own seed, so one connection can be replayed. A thin asyncio shell
sends the plans to a daemon over many concurrent connections, probes that it still
answers, and records frames/s, refused and reset connections, whether the process is
alive and its RSS. ``waltz fuzz`` runs it against a throw-away local cluster (a storage
node and the server), then checks that a normal client still appends and reads back.

Where each part lives:

- ``frames``: what the fuzzer knows of its target (``FuzzTarget``), and valid frames of
  every request type with a map of their fields (``base_frame``, ``open_request``);
- ``mutations``: what a mutation does to a frame (``MUTATIONS``, ``mutate``);
- ``tls``: the same for the ClientHello a stranger sends to a TLS port;
- ``plans``: a seed made into connection plans (``plan_connection``,
  ``plan_connections``, ``hello_for``);
- ``process``: whether the daemon is alive, and its RSS, from ``/proc``;
- ``connections``: the asyncio shell against one daemon (``fuzz_target``,
  ``run_connection``, ``probe``, ``FuzzStats``, ``Endpoint``, ``TlsDial``);
- ``client_check``: a well-behaved client afterwards (``check_client``);
- ``cluster``: a whole local cluster, storage then server then the client
  (``fuzz_cluster``);
- ``report``: the lines printed of a run (``describe_stats``);
- ``cli``: the ``waltz fuzz`` command (``register``).
"""
