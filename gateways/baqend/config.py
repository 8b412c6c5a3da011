"""Configuration of the Baqend real-time query dialect: the ``[baqend]`` section."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator

from router.config import KIB, MIB, JwtConfig, OwnPort, Section


class BaqendConfig(Section):
    """Baqend real-time queries (``baqend-realtime-queries.md``) and the REST API they watch."""

    enabled: bool = True
    path: str = "/v1/events"
    port: OwnPort = None
    # REST base: GET <rest_path>/connect, <rest_path>/db/<Bucket>[/<key>].
    rest_path: str = "/v1"
    # What GET /v1/connect answers as "schema" (the SDK's metamodel: [{"class": "/db/Todo", "fields": {...}}]).
    schema_: list[dict[str, Any]] = Field(default_factory=list, alias="schema")
    max_subscriptions: int = Field(default=20, ge=1)  # active per connection (429 beyond)
    max_message_bytes: int = Field(default=64 * KIB, ge=256)
    max_frame_bytes: int = Field(default=1 * MIB, ge=256)
    # The Node SDK drops frames above 1 MiB: a larger initial result is refused with an error message.
    max_result_bytes: int = Field(default=1_000_000, ge=1024)
    max_document_bytes: int = Field(default=256 * KIB, ge=256)
    max_key_length: int = Field(default=256, ge=1, le=4096)
    # Token validator: JWT (claims `sub` = user id, `roles` = role names) for the documents' acl.
    auth: JwtConfig = Field(default_factory=JwtConfig)
    request_timeout_s: float = Field(default=10, gt=0)
    max_outbound_bytes: int = Field(default=8 * MIB, ge=64 * KIB)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("path", "rest_path")
    @classmethod
    def _path_is_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value.rstrip("/") or "/"
