"""JWT verification for ``hub:connect`` (spec section 1.3): pinned algorithms, ``exp`` required."""

from __future__ import annotations

from dataclasses import dataclass

import jwt

from gateways.signal.config import ALL_SIGNAL_CAPABILITIES
from router.config import JwtConfig


class AuthError(Exception):
    """The token is refused; the message says why (sent to the client as ``unauthorized``)."""


@dataclass(frozen=True, slots=True)
class Identity:
    actor_id: str
    capabilities: tuple[str, ...]
    expires_at_ms: int | None  # None when auth is disabled


class TokenVerifier:
    def __init__(self, config: JwtConfig) -> None:
        self._key = config.verification_key()
        self._algorithms = list(config.algorithms)
        self._issuer = config.issuer
        self._audience = config.audience
        self._leeway = config.leeway_s

    def verify(self, token: str) -> Identity:
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=self._algorithms,
                options={"require": ["exp"]},
                issuer=self._issuer,
                audience=self._audience,
                leeway=self._leeway,
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("JWT expired") from None
        except jwt.InvalidSignatureError:
            raise AuthError("JWT signature is invalid") from None
        except jwt.InvalidAlgorithmError:
            raise AuthError(f"JWT algorithm not allowed; accepted: {', '.join(self._algorithms)}") from None
        except jwt.MissingRequiredClaimError as error:
            raise AuthError(f"JWT lacks the required '{error.claim}' claim") from None
        except jwt.InvalidTokenError as error:
            raise AuthError(f"JWT is invalid: {error}") from None
        actor_id = claims.get("actorId")
        if not isinstance(actor_id, str) or not actor_id:
            raise AuthError("JWT lacks the 'actorId' claim")
        capabilities = claims.get("capabilities", [])
        if not isinstance(capabilities, list) or not all(isinstance(c, str) for c in capabilities):
            raise AuthError("JWT 'capabilities' claim must be a list of strings")
        known = tuple(c for c in dict.fromkeys(capabilities) if c in ALL_SIGNAL_CAPABILITIES)
        # The leeway that let the token in also applies to its expiry during the session.
        return Identity(actor_id, known, int((claims["exp"] + self._leeway) * 1000))
