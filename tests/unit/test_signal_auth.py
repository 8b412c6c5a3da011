"""gateways/signal/auth.py: JWT verification with pinned algorithms."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gateways.signal.auth import AuthError, Identity, TokenVerifier
from router.config import JwtConfig

SECRET = "unit-test-secret-" + "0123456789abcdef" * 4  # long enough for HS512 without warnings
EXP = 4_102_444_800  # 2100-01-01T00:00:00Z


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64json(value: dict) -> str:
    return b64url(json.dumps(value, separators=(",", ":")).encode())


def claims(**extra) -> dict:
    base = {"actorId": "rt/alice", "exp": EXP}
    base.update(extra)
    return {key: value for key, value in base.items() if value is not ...}


def hs_token(payload: dict, key: str = SECRET, algorithm: str = "HS256") -> str:
    return jwt.encode(payload, key, algorithm=algorithm)


def hs_verifier(**config) -> TokenVerifier:
    return TokenVerifier(JwtConfig(enabled=True, secret=SECRET, **config))


def refusal(verifier: TokenVerifier, token: str) -> str:
    with pytest.raises(AuthError) as raised:
        verifier.verify(token)
    return str(raised.value)


def public_pem(private_key) -> str:
    return private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


@pytest.fixture(scope="module")
def rsa_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key():
    return ec.generate_private_key(ec.SECP256R1())


# -- HS256 ----------------------------------------------------------------------------------


def test_hs256_accepted():
    token = hs_token(claims(capabilities=["send", "receive"]))
    assert hs_verifier().verify(token) == Identity("rt/alice", ("send", "receive"), EXP * 1000)


def test_unknown_and_duplicate_capabilities_are_dropped():
    token = hs_token(claims(capabilities=["send", "fly", "send", "publish", "admin", "receive"]))
    assert hs_verifier().verify(token).capabilities == ("send", "publish", "receive")


def test_no_capabilities_claim_means_none():
    assert hs_verifier().verify(hs_token(claims())).capabilities == ()
    assert hs_verifier().verify(hs_token(claims(capabilities=[]))).capabilities == ()


def test_fractional_exp_in_milliseconds():
    identity = hs_verifier().verify(hs_token(claims(exp=EXP + 0.25)))
    assert identity.expires_at_ms == EXP * 1000 + 250
    assert type(identity.expires_at_ms) is int


def test_expired():
    assert refusal(hs_verifier(), hs_token(claims(exp=1_000))) == "JWT expired"


def test_leeway_accepts_a_recently_expired_token():
    token = hs_token(claims(exp=int(time.time()) - 60))
    assert refusal(hs_verifier(), token) == "JWT expired"
    assert hs_verifier(leeway_s=300).verify(token).actor_id == "rt/alice"


def test_wrong_signature():
    token = hs_token(claims(), key="another-secret-" + "f" * 64)
    assert refusal(hs_verifier(), token) == "JWT signature is invalid"


def test_tampered_payload():
    header, _, signature = hs_token(claims()).split(".")
    forged = ".".join((header, b64json(claims(actorId="rt/mallory")), signature))
    assert refusal(hs_verifier(), forged) == "JWT signature is invalid"


def test_alg_none_is_refused():
    token = b64json({"alg": "none", "typ": "JWT"}) + "." + b64json(claims()) + "."
    assert refusal(hs_verifier(), token) == "JWT algorithm not allowed; accepted: HS256"


def test_algorithm_outside_the_pinned_list():
    token = hs_token(claims(), algorithm="HS512")
    assert refusal(hs_verifier(), token) == "JWT algorithm not allowed; accepted: HS256"
    assert refusal(hs_verifier(algorithms=["HS256", "HS384"]), token) == (
        "JWT algorithm not allowed; accepted: HS256, HS384"
    )
    assert hs_verifier(algorithms=["HS512"]).verify(token).actor_id == "rt/alice"


def test_missing_exp():
    assert refusal(hs_verifier(), hs_token(claims(exp=...))) == "JWT lacks the required 'exp' claim"


@pytest.mark.parametrize("actor_id", [..., "", 5, None, ["rt/a"]])
def test_missing_or_bad_actor_id(actor_id):
    assert refusal(hs_verifier(), hs_token(claims(actorId=actor_id))) == "JWT lacks the 'actorId' claim"


@pytest.mark.parametrize("capabilities", ["send", {"send": True}, ["send", 1], [None], 7])
def test_capabilities_must_be_a_list_of_strings(capabilities):
    assert refusal(hs_verifier(), hs_token(claims(capabilities=capabilities))) == (
        "JWT 'capabilities' claim must be a list of strings"
    )


@pytest.mark.parametrize("token", ["garbage", "a.b", "", "a.b.c"])
def test_not_a_jwt(token):
    assert refusal(hs_verifier(), token).startswith("JWT is invalid: ")


# -- audience and issuer --------------------------------------------------------------------


def test_audience_and_issuer_accepted():
    verifier = hs_verifier(audience="signal-hub", issuer="https://issuer.example")
    token = hs_token(claims(aud="signal-hub", iss="https://issuer.example"))
    assert verifier.verify(token).actor_id == "rt/alice"
    token = hs_token(claims(aud=["other", "signal-hub"], iss="https://issuer.example"))
    assert verifier.verify(token).actor_id == "rt/alice"


def test_audience_required_when_configured():
    verifier = hs_verifier(audience="signal-hub")
    assert refusal(verifier, hs_token(claims())) == "JWT lacks the required 'aud' claim"
    assert refusal(verifier, hs_token(claims(aud="other"))).startswith("JWT is invalid: ")


def test_issuer_required_when_configured():
    verifier = hs_verifier(issuer="https://issuer.example")
    assert refusal(verifier, hs_token(claims())) == "JWT lacks the required 'iss' claim"
    assert refusal(verifier, hs_token(claims(iss="https://evil.example"))).startswith("JWT is invalid: ")


def test_token_with_audience_refused_when_none_is_configured():
    assert refusal(hs_verifier(), hs_token(claims(aud="signal-hub"))).startswith("JWT is invalid: ")


# -- public-key algorithms ------------------------------------------------------------------


def test_rs256(rsa_key):
    verifier = TokenVerifier(JwtConfig(enabled=True, algorithms=["RS256"], public_key=public_pem(rsa_key)))
    token = jwt.encode(claims(capabilities=["discover"]), rsa_key, algorithm="RS256")
    assert verifier.verify(token) == Identity("rt/alice", ("discover",), EXP * 1000)


def test_rs256_signed_by_another_key(rsa_key):
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    verifier = TokenVerifier(JwtConfig(enabled=True, algorithms=["RS256"], public_key=public_pem(rsa_key)))
    assert refusal(verifier, jwt.encode(claims(), other, algorithm="RS256")) == "JWT signature is invalid"


def test_rs256_key_confusion_with_hs256_is_refused(rsa_key):
    """An HS256 token 'signed' with the public key as HMAC secret must not pass an RS256 verifier."""
    pem = public_pem(rsa_key)
    verifier = TokenVerifier(JwtConfig(enabled=True, algorithms=["RS256"], public_key=pem))
    signing_input = b64json({"alg": "HS256", "typ": "JWT"}) + "." + b64json(claims())
    mac = hmac.new(pem.encode(), signing_input.encode(), hashlib.sha256).digest()
    assert refusal(verifier, signing_input + "." + b64url(mac)) == "JWT algorithm not allowed; accepted: RS256"


def test_es256_from_a_key_file(ec_key, tmp_path):
    key_file = tmp_path / "es256.pem"
    key_file.write_text(public_pem(ec_key))
    verifier = TokenVerifier(JwtConfig(enabled=True, algorithms=["ES256"], public_key_file=key_file))
    token = jwt.encode(claims(capabilities=["publish", "subscribe"]), ec_key, algorithm="ES256")
    assert verifier.verify(token) == Identity("rt/alice", ("publish", "subscribe"), EXP * 1000)


def test_es256_token_refused_by_an_rs256_verifier(rsa_key, ec_key):
    verifier = TokenVerifier(JwtConfig(enabled=True, algorithms=["RS256"], public_key=public_pem(rsa_key)))
    token = jwt.encode(claims(), ec_key, algorithm="ES256")
    assert refusal(verifier, token) == "JWT algorithm not allowed; accepted: RS256"


def test_es256_expired(ec_key):
    verifier = TokenVerifier(JwtConfig(enabled=True, algorithms=["ES256"], public_key=public_pem(ec_key)))
    assert refusal(verifier, jwt.encode(claims(exp=1_000), ec_key, algorithm="ES256")) == "JWT expired"


def test_leeway_also_extends_the_session_expiry():
    exp = int(time.time()) - 60
    identity = hs_verifier(leeway_s=300).verify(hs_token(claims(exp=exp)))
    assert identity.expires_at_ms == (exp + 300) * 1000
