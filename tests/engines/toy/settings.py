"""The toy's config section (toy:)."""
from typing import Literal

from pydantic import BaseModel, ConfigDict

ENGINE, DOC, EXAMPLE = "toy", "The toy_* methods.", "{pairing: batch}"


class ToyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pairing: Literal["auto", "batch", "engine"] = "batch"
    start_timeout_s: float = 30.0


SECTION, CHECK = ToyConfig, lambda config: None
