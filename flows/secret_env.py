"""Provider keys from Prefect Secret blocks, exported into this flow run's environment.

WHY: the library reads keys only from environment variables (the names a pool manifest gives in
``api_key_env``); on a scheduled deployment the operator keeps them in Prefect Secret blocks instead of a
worker's environment, so rotating a key is one ``Secret(value=...).save(name, overwrite=True)`` and the next
run uses it. The values go into ``os.environ`` of the flow-run process only, are registered for redaction
(``conductor.workers.secrets``) and are never logged, returned or stored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import cast


def export_secret_blocks(mapping: Mapping[str, str] | None) -> list[str]:
    """For each ``ENV_VAR: block-name``, set ``ENV_VAR`` from the Secret block; returns the variable names set.

    A missing block is a one-line error naming the block and the variable (never a value).
    """
    if not mapping:
        return []
    from prefect.blocks.system import Secret

    from conductor.workers.secrets import register_key_env

    done = []
    for env_name, block in mapping.items():
        try:
            value = cast(Secret, Secret.load(block)).get()   # synchronous here; typed "or a coroutine"
        except ValueError as e:
            raise ValueError(f"secret block {block!r} for {env_name}: {str(e).splitlines()[0]}") from None
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"secret block {block!r} for {env_name}: empty or not a string")
        register_key_env(env_name)
        os.environ[env_name] = value.strip()
        done.append(env_name)
    return done
