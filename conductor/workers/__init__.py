"""The worker pool: manifests and sub-pool sampling, API keys, prices, the providers that call
each worker (one ``@register_provider`` each). The loopback emulator of the providers' APIs, a test double,
lives in ``conductor.testing.emulator``.
"""
