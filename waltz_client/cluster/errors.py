"""The one error of the cluster layer, which every module of it raises: in a module of
its own, so that no module imports another only for its error (acl and zk did, both
ways)."""


class ClusterError(Exception):
    """A cluster operation could not be done; the message says why and changes nothing."""
