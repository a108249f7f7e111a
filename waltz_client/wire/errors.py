"""Protocol errors. Each names exactly what was wrong with the bytes received."""


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid frame or message.

    The connection that carried them is closed; the process carries on.
    """


class FrameTooLarge(ProtocolError):
    """A frame's length prefix exceeds the configured maximum."""


class MalformedFrame(ProtocolError):
    """A frame is structurally invalid (zero length, truncated body, trailing bytes)."""


class UnknownMessageType(ProtocolError):
    """A frame carries a message type this endpoint does not accept."""


class MalformedMessage(ProtocolError):
    """A message body does not decode: a field is short, negative or over its bound."""


class ChecksumMismatch(MalformedMessage):
    """Transaction data does not match the CRC-32 sent with it."""


class HandshakeError(ProtocolError):
    """The connection preamble is wrong (magic, service or protocol version)."""


def describe(error: BaseException) -> str:
    """An error as a log message can show it: some (a timeout, a bare ConnectionError)
    have no text of their own, and an empty reason after a colon helps nobody."""
    text = str(error)
    if text:
        return text
    if isinstance(error, TimeoutError):
        return "timed out"
    return type(error).__name__
