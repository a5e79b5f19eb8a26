"""`conductor answer`: bulk answering, the main job."""

from __future__ import annotations

from pathlib import Path

import typer

from conductor.cli import app, fail
from conductor.cli.run_options import CONFIG_HELP, build_config, default
from conductor.run.config import AnswerConfig

A = AnswerConfig


@app.command("answer")
def answer_cmd(
    ctx: typer.Context,
    questions: str = typer.Argument(None, show_default=False, help="A JSONL/CSV/Parquet file (local or s3://) with id, question and optional "
                                    "answer; or dataset names with optional limits, e.g. gsm8k_test:10,mmlu_stem:10 "
                                    "(or `questions:` in --config)."),
    out: str = typer.Option(None, "--out", show_default=False, help="Output directory: lake/, answers.jsonl, summary.json, report/ "
                             "(or `out:` in --config)."),
    pool: Path = typer.Option(default(A, "pool"), "--pool", help="Worker pool manifest (default: the embedded local pool)."),
    conductor: str = typer.Option(default(A, "conductor"), "--conductor", help="Conductor policy: auto (the champion if one was promoted, else embedded), embedded, transformers:DIR[#FILE.gguf], "
                                  "llamacpp:FILE.gguf, vllm:MODEL, openai:MODEL@URL, or champion (the registry's); or a baseline strategy "
                                  "(docs/strategies.md): fixed:I, sc:I:K, moa:P1+P2+...:AGG, random[:SEED[:MAX_STEPS]]."),
    samples: int = typer.Option(default(A, "samples"), "--samples", min=1, help="Conductor samples per question."),
    recursion_depth: int = typer.Option(default(A, "recursion_depth"), "--recursion-depth", min=0, help="Extra conductor rounds over its own answer."),
    limit: int = typer.Option(default(A, "limit"), "--limit", min=1, help="Answer only the first N questions."),
    shard_size: int = typer.Option(default(A, "shard_size"), "--shard-size", min=1, help="Questions per shard (the unit of resume)."),
    k: int = typer.Option(default(A, "k"), "--k", min=1, help="Show the conductor a random k-of-n sub-pool per question."),
    seed: int = typer.Option(default(A, "seed"), "--seed"),
    temperature: float = typer.Option(default(A, "temperature"), "--temperature", min=0.0, help="Conductor sampling temperature (default: 0, "
                                      "greedy, for the untrained embedded conductor; 0.7 otherwise)."),
    max_tokens: int = typer.Option(default(A, "max_tokens"), "--max-tokens", min=16, help="Conductor completion limit."),
    run_id: str = typer.Option(default(A, "run_id"), "--run-id", help="Name the run (default: derived from the inputs, so reruns resume)."),
    cache: Path = typer.Option(default(A, "cache"), "--cache", help="Response cache (SQLite); default OUT/cache.sqlite."),
    replay: bool = typer.Option(default(A, "replay"), "--replay", help="Answer only from the cache; never call a provider."),
    fewshot: str = typer.Option(default(A, "fewshot"), "--fewshot", help="Conductor prompt and examples: auto (informed for the untrained "
                                "embedded conductor, else ood), informed (worker notes, examples on this pool's "
                                "roles), ood (the paper's default), in_domain, mixed, none; optionally :k."),
    constrained: bool = typer.Option(default(A, "constrained"), "--constrained/--free", help="Decode the conductor under the workflow "
                                     "grammar (default: on for the embedded conductor, off otherwise)."),
    max_steps: int = typer.Option(default(A, "max_steps"), "--max-steps", min=1, help="Most steps a workflow may have (the paper: 5)."),
    max_cost: float = typer.Option(default(A, "max_cost"), "--max-cost", help="Dollars per question: a step "
                                   "that would start once they are spent is not run, and the answer is the last step that ran."),
    lake: str = typer.Option(default(A, "lake"), "--lake", help="Lake root for the trajectories: a local path or s3://bucket/prefix "
                             "(default OUT/lake; S3 credentials from AWS_* variables)."),
    retry_failed: bool = typer.Option(default(A, "retry_failed"), "--retry-failed/--keep-failed", help="Redo questions an earlier run of "
                                      "this command lost to infrastructure failures (default), or keep them as they are."),
    batch: bool = typer.Option(default(A, "batch"), "--batch", help="Send the OpenAI, Anthropic and Gemini workers' calls through "
                               "their batch APIs: half price, answers within hours (docs/operations.md)."),
    batch_poll: float = typer.Option(default(A, "batch_poll_s"), "--batch-poll", min=0.01, help="Seconds between polls of a batch."),
    limits: str = typer.Option(default(A, "limits"), "--limits", help="Share provider limits with other processes: sqlite:PATH (one "
                               "machine) or prefect (a Prefect server); default: this process alone."),
    compact: bool = typer.Option(default(A, "compact"), "--compact", help="Merge the run's shard files into a few large ones at the "
                                 "end (conductor lake compact)."),
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
    replace: bool = typer.Option(False, "--replace", help="Answer into an --out that holds another question "
                                 "set's answers, replacing its answers.jsonl, summary.json and report/."),
) -> None:
    """Answer a question set with the conductor over a worker pool; resumable; prints a summary.

    Exit codes: 0 every question answered, 2 bad input (nothing started), 3 every question failed on
    infrastructure, 4 some did (a rerun retries exactly those), 1 anything else."""
    from conductor.run.preflight import UsageError, claim_out, prepare_answer

    cfg = build_config(AnswerConfig, ctx, config, {
        "questions": questions, "out": out, "pool": pool, "conductor": conductor, "samples": samples,
        "recursion_depth": recursion_depth, "limit": limit, "shard_size": shard_size, "k": k, "seed": seed,
        "temperature": temperature, "max_tokens": max_tokens, "run_id": run_id, "cache": cache, "replay": replay,
        "fewshot": fewshot, "constrained": constrained, "max_steps": max_steps, "max_cost": max_cost, "lake": lake,
        "retry_failed": retry_failed, "batch": batch, "batch_poll": batch_poll, "limits": limits, "compact": compact},
        fields={"batch_poll": "batch_poll_s"})
    try:  # every check before Prefect starts: bad input is one `error:` line (exit 2), not a traceback
        prepared = prepare_answer(cfg)
    except UsageError as e:
        fail(str(e))
    try:
        from conductor.execution.shared_limits import open_shared

        if (cfg.limits or "").startswith("sqlite:"):   # never a tree of directories made under a mistyped path
            parent = Path(cfg.limits.partition(":")[2]).expanduser().parent
            if not parent.is_dir():
                fail(f"--limits {cfg.limits}: directory {parent} does not exist")
        open_shared(cfg.limits)
    except ValueError as e:
        fail(f"--limits: {e}")
    try:
        lock = claim_out(prepared.out, cfg.questions, replace)  # noqa: F841 - held until the command ends
    except (UsageError, OSError) as e:
        fail(str(e))
    from conductor.cli.boundary import flow_errors
    from conductor.run.summary import format_summary, run_outcome
    from flows.answer import answer_flow

    with flow_errors():
        summary = answer_flow(cfg)
    typer.echo(format_summary(summary))
    typer.echo(f"answers: {summary['answers']}\nreport:  {summary['report']}\nlake:    {summary['lake']}")
    code, why = run_outcome(summary)
    if code:
        fail(why or "the run did not answer every question", code)
