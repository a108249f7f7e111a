"""The waltz Kubernetes operator: WaltzCluster resources reconciled into running clusters.

Lives in ``operator/waltz_operator`` (``operator`` itself must never be a package: it
would shadow the standard library's ``operator``). Pure decisions (``spec``,
``desired``) are kept apart from the kopf handlers that apply them.
"""
