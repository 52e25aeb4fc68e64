"""Settings of a process that uses a published model: where the repository is, which model."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from services.common.settings import ServerSettings
from services.models.repository import DEFAULT_MODEL_NAME


class ModelServerSettings(ServerSettings):
    """A server that loads a model version (the gateway for its metadata, the scorer to run it)."""

    model_root: Path | None = Field(
        None, description="Folder of published models; default <var_dir>/models."
    )
    model_name: str = Field(DEFAULT_MODEL_NAME, description="Name of the model to use.")
    model_version: str | None = Field(
        None,
        description="Pin this version for every call; unset follows the model lifecycle "
        "(routing.json: the live version, and any canary and shadow).",
    )

    @property
    def models_path(self) -> Path:
        """The folder models are published to."""
        return self.model_root or self.var_dir / "models"
