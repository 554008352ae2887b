"""Installed versions, read without importing the packages (a GPU check must not import what it does not need)."""
import importlib.metadata

import torch


def installed_versions(names) -> dict:
    """Each distribution's installed version ("absent" where it is not installed) and the CUDA torch was built for."""
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    found["CUDA"] = torch.version.cuda or "absent"
    return found
