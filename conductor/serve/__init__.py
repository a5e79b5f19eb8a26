"""`conductor serve`: the conductor as one model behind an OpenAI-compatible HTTP API.

An entry point beside the CLI: every request runs the same plan -> generate -> execute code as a bulk run
(``conductor.run.pipeline``, ``conductor.execution.recursion``) over one shared ``Executor``; nothing here is a
second pipeline. Only ``conductor.serve.app`` imports the web framework (Starlette on uvicorn), so the rest of
the library stays importable without it. See docs/serving.md.
"""
