"""Batch mode: worker calls answered through the providers' batch APIs at half price.

A workflow is a dependency graph, so the ready steps of every question in a run form a *wave*; each wave
is submitted as one batch per provider endpoint (OpenAI batches from a JSONL file, Anthropic message
batches, Gemini batch jobs), polled, and its results fed back so the next steps become ready. Records,
cache entries and cost come out exactly as in a synchronous run (the same ``Executor.call`` fills them);
only the price tier differs.

| module | does |
|---|---|
| ``settings`` | ``BatchSettings``: which workers batch, poll interval, retries, the synchronous straggler lane |
| ``store`` | ``BatchStore``: batch handles and collected results in SQLite, so a killed run resumes polling |
| ``adapters`` | one adapter per provider API (``register_batch_adapter``): submit, poll, cancel |
| ``waves`` | ``WaveScheduler``: parks ready calls, detects the wave, submits, polls, reconciles by custom id |
| ``executor`` | ``BatchExecutor``: an ``Executor`` whose batchable calls go through the wave scheduler |
| ``run`` | ``execute_waves``: the pipeline's execute stage with every trajectory counted into the waves |
"""
