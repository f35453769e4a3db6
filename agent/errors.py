"""Errors that carry a message meant for the user (printed without a traceback)."""


class UserError(Exception):
    """Bad input from the user: the message says what is wrong and how to fix it, on one line
    and with no control character (it may quote a run directory someone else made)."""

    def __init__(self, message: object = "") -> None:
        super().__init__(printable(message, 4000))


class ConfigError(UserError, ValueError):
    """A config field or live knob outside its valid range; `field` names it (None when the
    error is about no one field: a file that does not read, unknown names)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class WeightsError(UserError):
    """A weights or checkpoint file that is missing, corrupt or does not match the model."""


def printable(text: object, limit: int = 500) -> str:
    """`text` with every control character (a terminal's escape sequences among them) written
    as an escape, cut at `limit` characters: what someone else sent, safe to print."""
    text = str(text)
    shown = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text[:limit])
    return shown + ("..." if len(text) > limit else "")
