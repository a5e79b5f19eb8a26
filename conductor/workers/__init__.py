"""The worker pool: manifests and sub-pool sampling, API keys, prices, the providers that call
each worker (one ``@register_provider`` each), and the loopback emulator of the providers' APIs.
"""
