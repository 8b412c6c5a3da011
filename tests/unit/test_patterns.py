"""router/patterns.py: client patterns compiled with RE2 (linear time, bounded size)."""

from __future__ import annotations

import pytest

from router.patterns import PatternError, compile_pattern


@pytest.mark.parametrize(
    ("pattern", "text", "found"),
    [
        ("chat", "rt/chat-1", True),  # search: anywhere, like RegExp.test
        ("chat", "rt/bot", False),
        ("^rt/", "rt/chat-1", True),
        ("^chat", "rt/chat-1", False),
        ("-1$", "rt/chat-1", True),
        ("-1$", "rt/chat-10", False),
        ("^rt/chat-[0-9]+$", "rt/chat-42", True),
        ("", "anything", True),
        ("a|b", "xxbxx", True),
    ],
)
def test_search_semantics(pattern, text, found):
    assert (compile_pattern(pattern, 256).search(text) is not None) is found


def test_match_span_is_reported():
    match = compile_pattern("c[a-z]+", 256).search("rt/chat-1")
    assert match.group(0) == "chat"
    assert match.start() == 3


def test_length_limit():
    assert compile_pattern("a" * 256, 256).search("a" * 256) is not None
    with pytest.raises(PatternError) as raised:
        compile_pattern("a" * 257, 256)
    assert str(raised.value) == "pattern is 257 characters; the limit is 256"


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("(a)\\1", "invalid pattern: invalid escape sequence: \\1"),  # backreference: not RE2
        ("(", "invalid pattern: missing ): ("),
        ("(?<=a)b", "invalid pattern: invalid perl operator: (?<="),  # lookbehind
        ("[z-a]", "invalid pattern: invalid character class range: z-a"),
    ],
)
def test_invalid_pattern(pattern, message):
    with pytest.raises(PatternError) as raised:
        compile_pattern(pattern, 256)
    assert str(raised.value) == message
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__ is True


def test_pattern_error_is_a_value_error():
    assert issubclass(PatternError, ValueError)


def test_memory_budget_refuses_huge_programs():
    # RE2's default budget (8 MiB) compiles this; the router's 1 MiB budget does not.
    with pytest.raises(PatternError) as raised:
        compile_pattern(r"\pL{100}", 256)
    assert str(raised.value) == "invalid pattern: pattern too large - compile failed"


def test_pathological_pattern_completes():
    # Catastrophic for a backtracking engine; linear for RE2.
    assert compile_pattern("(a+)+$", 256).search("a" * 100_000 + "b") is None
    assert compile_pattern("(a+)+$", 256).search("b" + "a" * 100_000) is not None
