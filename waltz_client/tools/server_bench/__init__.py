"""``waltz server bench`` and ``waltz server bench-catch-up``: a server measured at the
protocol level on a throw-away local cluster. They live with the tools, not in the server
package, because they launch the server through the local-cluster harness."""
