"""The error every reader of Kubernetes objects raises: :class:`ObjectError`, whose message
names the object and the field. Its own module so that the readers (``objects``,
``constraints``, ``quotas``, ...) can use one another without an import circle."""


class ObjectError(ValueError):
    """A Kubernetes object that cannot be understood; the message names object and field."""
