"""Loading things (config, models, data, files); nothing here knows about decoding."""


class UserError(Exception):
    """Bad input: printed as one line, exit code 2."""
