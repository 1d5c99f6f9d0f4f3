"""Every error retrofit raises on bad input derives from RetrofitError.

The CLI maps each class to an exit code (see ``retrofit.cli``), so scripts can tell
"you asked for something wrong" from "something broke".
"""


class RetrofitError(Exception):
    """Base class: bad input or an unsupported request. Nothing was changed."""

    exit_code = 2


class UnknownNameError(RetrofitError, KeyError):
    """A name (scheme, architecture, recipe key, ...) is not registered."""

    def __str__(self):  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else ""


class UnknownSchemeError(UnknownNameError):
    pass


class UnsupportedArchitectureError(UnknownNameError):
    exit_code = 3


class OptionError(RetrofitError, ValueError):
    """An option that a scheme or command does not take, or of the wrong type."""


class AlreadyConvertedError(RetrofitError):
    pass


class NotConvertedError(RetrofitError):
    pass


class LengthError(RetrofitError, ValueError):
    """A length past what the model's positional mechanism supports, or longer than the data."""


class PatchNotLiveError(RetrofitError, RuntimeError):
    """The conversion did not take effect in every layer. Raised instead of silently doing nothing."""

    exit_code = 4


class DataError(RetrofitError, ValueError):
    """A dataset, file or field that cannot be found or used."""


class RecipeError(RetrofitError, ValueError):
    """A recipe key that is unknown, missing or of the wrong type."""


class OutputError(RetrofitError):
    """An output that cannot be written: a path that is a file or cannot be created, a full disk, no
    permission. Nothing half-written is left behind."""


class ModelLoadError(RetrofitError):
    """A model that cannot be read: no such path, a folder that is not a model, damaged weights."""


class HubError(RetrofitError):
    """Missing token, Hub unreachable, or another Hub precondition."""

    exit_code = 5
