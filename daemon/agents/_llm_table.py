"""A built-in agent's ``[llm]`` table: which wire format its loop speaks and to which endpoint.

The endpoint and key fields are only checked for shape here; over HTTP the operator's
declarations decide whether the agent may name them (``Credentials.check_reach``).
"""

from __future__ import annotations

from typing import Any

from ._agent_definition import LlmSettings
from ._definition_error import suggest
from ._definition_rules import MAX_LLM_TIMEOUT, check_keys, duration, expect, whole

PROVIDERS = ("anthropic", "openai", "demo")
DEFAULT_PROVIDER = "anthropic"  # an [llm] table without `provider`
LLM_FIELDS = {
    "provider",
    "base_url",
    "base_url_env",
    "api_key_env",
    "max_retries",
    "timeout_seconds",
    "stream",
}


def llm_settings(llm_raw: Any) -> LlmSettings:
    """The ``[llm]`` table: which wire format, which endpoint (over HTTP a declared one:
    ``check_reach``)."""
    check_keys("[llm]", llm_raw, LLM_FIELDS, ("llm",))
    provider = llm_raw.get("provider", DEFAULT_PROVIDER)
    expect(
        provider in PROVIDERS,
        f"[llm] provider must be one of {', '.join(PROVIDERS)}",
        ("llm", "provider"),
        suggest(provider, PROVIDERS) if isinstance(provider, str) else None,
    )
    for key in ("base_url", "base_url_env", "api_key_env"):
        expect(
            key not in llm_raw or isinstance(llm_raw[key], str),
            f"[llm] {key} must be a string",
            ("llm", key),
        )
    retries = llm_raw.get("max_retries", 4)
    expect(
        whole(retries) and 0 <= retries <= 20,
        "[llm] max_retries must be an integer from 0 to 20",
        ("llm", "max_retries"),
    )
    timeout = llm_raw.get("timeout_seconds", 120)
    duration("[llm] timeout_seconds", timeout, ("llm", "timeout_seconds"), MAX_LLM_TIMEOUT)
    stream = llm_raw.get("stream", False)
    expect(isinstance(stream, bool), "[llm] stream must be true or false", ("llm", "stream"))
    return LlmSettings(
        provider=provider,
        base_url=llm_raw.get("base_url"),
        base_url_env=llm_raw.get("base_url_env"),
        api_key_env=llm_raw.get("api_key_env"),
        max_retries=int(retries),
        timeout_seconds=float(timeout),
        stream=stream,
    )
