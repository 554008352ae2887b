"""Loading things (config, models, data, files). Nothing here decodes: of decode/, utils/ imports only the method
registry (decode/methods: names, axes, what each method takes) and the tree labels (decode/tree_layout.py), which the config
schema validates against (tests/test_structure.py holds that, and that no module of the repository is in an import
cycle)."""


class UserError(Exception):
    """Bad input: printed as one line, exit code 2."""


class ConfigError(UserError):
    """Bad input in the config, naming the key."""
