"""Local models the project serves itself: the embedded GGUF models, the OpenAI-compatible server
processes (llama.cpp, transformers) that serve them, and the watchdog that stops them.
"""
