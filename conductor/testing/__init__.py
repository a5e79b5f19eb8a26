"""Test doubles shipped with the library for tests, benches and dry runs; runtime code never imports this package.

``emulator``: the OpenAI, Anthropic and Gemini APIs on 127.0.0.1, driven by the real SDK clients (needs the
``dev`` extra: aiohttp).
"""
