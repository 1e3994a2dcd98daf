"""The Tinker API on your own machines: `lightning-rl serve` trains and samples for clients of the official ``tinker``
SDK, on our components (docs/tinker-api.md).

    from lightning_rl.service import ServeConfig, serve
    server = serve(ServeConfig(base_models=["lightning_rl/assets/tiny-arith"], api_keys=["tml-local"], port=0)).start()
    ...  # TINKER_BASE_URL=server.url TINKER_API_KEY=tml-local python my_tinker_loop.py
    server.stop()
"""

from __future__ import annotations

import os
import secrets

from lightning_rl.service.config import ServeConfig, ServeLimits

KEYS_VARIABLE = "LIGHTNING_RL_SERVE_API_KEYS"


def api_keys(config: ServeConfig) -> list[str]:
    """The keys the service takes: the config's and ``LIGHTNING_RL_SERVE_API_KEYS``'s, or one made now."""
    keys = [*config.api_keys, *(k.strip() for k in os.environ.get(KEYS_VARIABLE, "").split(",") if k.strip())]
    bad = [k for k in keys if not k.startswith("tml-") or len(k) < 8]
    if bad:
        raise ValueError(
            f"serve --api_keys: every key must start with 'tml-' (the SDK refuses others) and be at least 8 characters; "
            f"{len(bad)} is not"
        )
    return keys or [f"tml-{secrets.token_urlsafe(24)}"]


def serve(config: ServeConfig):
    """The service for ``config``, listening (not yet answering: ``.start()`` on a thread, ``.run()`` here)."""
    from lightning_rl.service.app import Server
    from lightning_rl.service.service import Service

    keys = api_keys(config)
    server = Server(Service(config), keys, config.host, config.port)
    server.keys = keys
    return server


__all__ = ["ServeConfig", "ServeLimits", "serve", "api_keys"]
