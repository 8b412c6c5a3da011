"""Configuration of the Cashu NUT-17 dialect: the ``[cashu]`` section."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from router.config import KIB, MIB, OwnPort, Section, UrlPath


CASHU_KINDS = ("bolt11_mint_quote", "bolt11_melt_quote", "bolt12_mint_quote", "bolt12_melt_quote", "proof_state")


class CashuSupported(Section):
    """One entry of NUT-06 ``nuts.17.supported``: a method-unit pair and the kinds it serves."""

    method: str = Field(min_length=1)
    unit: str = Field(min_length=1)
    commands: list[str] = Field(min_length=1)

    @field_validator("commands")
    @classmethod
    def _known_kinds(cls, value: list[str]) -> list[str]:
        unknown = set(value) - set(CASHU_KINDS)
        if unknown:
            raise ValueError(f"unknown subscription kinds {sorted(unknown)}; known: {list(CASHU_KINDS)}")
        return value


def _default_cashu_supported() -> list[CashuSupported]:
    return [
        CashuSupported(method="bolt11", unit="sat",
                       commands=["bolt11_mint_quote", "bolt11_melt_quote", "proof_state"]),
        CashuSupported(method="bolt12", unit="sat",
                       commands=["bolt12_mint_quote", "bolt12_melt_quote", "proof_state"]),
    ]


class CashuConfig(Section):
    """Cashu NUT-17 subscriptions (``cashu-nut17-websockets.md``) and the mint's state feed."""

    enabled: bool = True
    path: UrlPath = "/v1/ws"
    port: OwnPort = None
    info_path: UrlPath = "/v1/info"
    # The mint pushes object states here (POST, API key). No key configured: the feed is off (403).
    state_path: UrlPath = "/v1/ws/state"
    state_api_key: SecretStr | None = None
    max_states_per_push: int = Field(default=1000, ge=1)
    # NUT-06 `nuts.17.supported`; the kinds listed here are the ones a wallet may subscribe to.
    supported: list[CashuSupported] = Field(default_factory=_default_cashu_supported, min_length=1)
    # Other fields of `GET /v1/info` (name, pubkey, version, …) when no mint URL is configured.
    info: dict[str, Any] = Field(default_factory=lambda: {"name": "ray-ws-router", "version": "ray-ws-router/0.1.0"})
    max_subscriptions: int = Field(default=100, ge=1)  # per connection
    max_filters: int = Field(default=1000, ge=1)  # per subscription
    max_filters_per_connection: int = Field(default=10_000, ge=1)
    max_filter_length: int = Field(default=256, ge=1, le=4096)
    max_sub_id_length: int = Field(default=256, ge=1, le=4096)
    max_message_bytes: int = Field(default=256 * KIB, ge=256)
    max_frame_bytes: int = Field(default=1 * MIB, ge=256)
    # NUT-17: wallets send something at least every 30 s; silence for this long means a stale connection.
    idle_timeout_s: float = Field(default=45, gt=0)
    rate_limit_per_second: float = Field(default=50, gt=0)
    rate_limit_burst: int = Field(default=100, ge=1)
    # A Y the router has never seen: "unspent" answers UNSPENT (as Nutshell), "none" sends nothing (as CDK).
    unknown_proof_state: Literal["unspent", "none"] = "unspent"
    # The mint's base URL: unknown objects are fetched from its REST API, `/v1/info` merges its info.
    mint_url: str | None = None
    mint_timeout_s: float = Field(default=5, gt=0)
    mint_info_ttl_s: float = Field(default=60, ge=0)
    # Requests to the mint per gateway: at most mint_max_requests in flight and mint_max_pending waiting
    # or in flight; a lookup over that is not made (the object is unknown, as when the mint times out).
    mint_max_requests: int = Field(default=16, ge=1)
    mint_max_pending: int = Field(default=256, ge=1)
    # A quote id the mint said it does not know is not asked again for this long (0: always asked);
    # at most mint_unknown_cache_size ids are remembered per gateway, the oldest forgotten first.
    mint_unknown_ttl_s: float = Field(default=30, ge=0)
    mint_unknown_cache_size: int = Field(default=10_000, ge=1)
    request_timeout_s: float = Field(default=10, gt=0)
    max_outbound_bytes: int = Field(default=8 * MIB, ge=64 * KIB)

    @field_validator("mint_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            if not value.startswith(("http://", "https://")):
                raise ValueError("must be an http:// or https:// URL")
            value = value.rstrip("/")
        return value

    @model_validator(mode="after")
    def _limits_consistent(self) -> "CashuConfig":
        if self.max_message_bytes > self.max_frame_bytes:
            raise ValueError("max_message_bytes must not exceed max_frame_bytes")
        return self

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(kind for entry in self.supported for kind in entry.commands)
