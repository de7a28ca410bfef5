"""The base class of the errors a user fixes from the message alone; the CLI prints those and exits with status 2.

A leaf module (it imports nothing from patchgym), so every stage can derive its own errors from it.
"""


class UserError(Exception):
    """A mistake in what the user gave (a config, a file, an argument), with a message meant for them as is.

    Any other exception is a bug or an infrastructure failure, and keeps its traceback.
    """
