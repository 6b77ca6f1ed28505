"""Estimator commands: ``estimate``, ``estimate-table``,
``estimators train|evaluate|build-workload-table|noise-floor|benchmark``.

Heavy imports (torch, xgboost) happen inside the commands so ``hier-sched --help`` stays fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from hier_sched.common.console import console as make_console
from hier_sched.common.console import progress

METHOD_CHOICES = ("auto", "trace", "ml", "gpumemnet", "horus", "faketensor", "accounting")


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


def _shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers like 3,224,224 (got {text!r})") from None
    if not shape:
        raise click.BadParameter("empty input shape")
    return shape


@click.command("estimate")
@click.argument("spec", required=False, type=click.Path(dir_okay=False))
@click.option("--model", "factory", help="model factory 'pkg.module:function' returning an nn.Module")
@click.option("--step", "step", help="your own training step 'pkg.module:function' (builds the model, optimizer and "
              "batch; returns the step to run, or runs one): traced as written")
@click.option("--world-size", type=int, default=None,
              help="with --step: the ranks the step trains on (a spec's gpus); traced as rank 0 of a fake process group")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False, exists=True),
              help="a torchsummary printout instead of a model (feature-based estimate)")
@click.option("--batch-size", type=int)
@click.option("--input-shape", help="input shape without the batch dimension, e.g. 3,224,224")
@click.option("--optimizer", default=None, help="adam (default), adamw, sgd, none")
@click.option("--dtype", default=None, help="float32 (default), bfloat16, float16")
@click.option("--gpu", default="A100-40GB", show_default=True, help="target GPU type")
@click.option("--method", type=click.Choice(METHOD_CHOICES), default=None, help="estimator (default: auto)")
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True, help="trace timeout (s)")
@click.option("--data-parallel", is_flag=True,
              help="trains on several GPUs with DistributedDataParallel (implied by a spec's gpus > 1)")
@click.option("--json", "as_json", is_flag=True, help="print the estimate as JSON")
def estimate(spec: str | None, factory: str | None, step: str | None, world_size: int | None,
             summary_path: str | None, batch_size: int | None, input_shape: str | None, optimizer: str | None,
             dtype: str | None, gpu: str, method: str | None, timeout_s: float, data_parallel: bool,
             as_json: bool) -> None:
    """Estimate a training job's peak GPU memory (MiB) from SPEC.yaml, --model, --step or --summary."""
    from estimators.api import estimate_from_summary, estimate_memory, estimate_step
    from estimators.model_input import resolve_factory
    from estimators.types import EstimatorError, parts_sum

    shape = _shape(input_shape)
    if "" not in sys.path and os.getcwd() not in sys.path:  # your module, named from where you stand (`python -m`'s way)
        sys.path.insert(0, os.getcwd())
    if spec is not None:
        from hier_sched.common.spec_files import load_spec
        from hier_sched.core.spec import SpecError

        try:
            job = load_spec(spec)
        except SpecError as exc:
            raise _fail(exc) from None
        m = job.model
        if job.training is not None and (m is None or m.step is None) and not (factory or step):
            _estimate_training(job.training, gpu, as_json)
            return
        if m is None or (m.factory is None and m.step is None and m.summary is None):
            raise click.ClickException(f"{spec}: the spec has no model.factory, model.step, model.summary or "
                                       "training section to estimate")
        factory = factory or m.factory
        step = step or m.step
        world_size = world_size or job.gpus
        if factory is None and summary_path is None and m.summary is not None:
            summary_path = str(Path(spec).parent / m.summary)
        batch_size = batch_size or m.batch_size or job.batch_size
        shape = shape or m.input_shape
        optimizer = optimizer or m.optimizer
        dtype = dtype or m.dtype
        method = method or (job.estimator if job.estimator in METHOD_CHOICES else None)
        data_parallel = data_parallel or job.data_parallel
    if step is None and ((factory is None and summary_path is None) or batch_size is None):
        raise click.UsageError("give SPEC.yaml, --step pkg.module:function, or --model pkg.module:factory (or "
                               "--summary FILE) and --batch-size")
    try:
        if step is not None:
            from estimators.user_step import UserStep

            if method not in (None, "auto", "trace"):
                raise click.UsageError(f"--method {method}: your own step is estimated by its trace (auto or trace)")
            if world_size is not None and world_size < 1:
                raise click.BadParameter(f"--world-size must be >= 1 (got {world_size})")
            est = estimate_step(UserStep(resolve_factory(step, "training step"), world_size or 1), gpu=gpu,
                                method=method or "auto", timeout_s=timeout_s)
        elif factory is None:
            est = estimate_from_summary(Path(summary_path).read_text(), batch_size=batch_size, method=method or "auto",
                                        optimizer=optimizer or "adam", gpu=gpu, data_parallel=data_parallel)
        else:
            est = estimate_memory(resolve_factory(factory), batch_size=batch_size, input_shape=shape,
                                  optimizer=optimizer or "adam", dtype=dtype or "float32", gpu=gpu,
                                  method=method or "auto", timeout_s=timeout_s, data_parallel=data_parallel)
    except EstimatorError as exc:
        raise _fail(exc) from None
    if as_json:
        click.echo(json.dumps(est.as_dict()))
    else:
        click.echo(f"{est.peak_mib:.0f} MiB  (range {est.low_mib:.0f}-{est.high_mib:.0f}, {est.method}, "
                   f"{est.seconds:.2f} s){'  ' + est.notes if est.notes else ''}")
        if est.parts is not None:
            click.echo(f"  = {parts_sum(est.parts.as_dict())}  (baseline: {est.parts.baseline_source})")


def _estimate_training(training: Any, gpu: str, as_json: bool) -> None:
    """A spec's ``training`` section, as the scheduler estimates it (``estimators.llm_estimate``)."""
    from estimators.llm_estimate import estimate_llm
    from estimators.types import EstimatorError, parts_sum

    try:
        est = estimate_llm(training, gpu)
    except ImportError as exc:
        raise click.ClickException(f"the training section's architecture is built by transformers: {exc} (install "
                                   "it beside hier_sched, or run `./run.sh cuda-cli estimate SPEC`)") from None
    except EstimatorError as exc:
        raise _fail(exc) from None
    if as_json:
        click.echo(json.dumps({"peak_mib": est.peak_mib, "method": est.method, "seconds": est.seconds,
                               "phase": est.phase, "parts": est.parts}))
        return
    click.echo(f"{est.peak_mib:.0f} MiB  ({est.method}, {est.seconds:.2f} s, peak in {est.phase})")
    click.echo(f"  = {parts_sum(est.parts)}")


@click.command("estimate-table")
@click.option("--kind", type=click.Choice(("mlp", "cnn", "transformer")), required=True)
@click.option("--input", "input_path", type=click.Path(dir_okay=False), required=True)
@click.option("--output", "output_path", type=click.Path(dir_okay=False), required=True)
@click.option("--strict", is_flag=True, help="fail on the first unusable row instead of reporting it")
def estimate_table(kind: str, input_path: str, output_path: str, strict: bool) -> None:
    """Estimate every row of a GPUMemNet-schema CSV -> row, predicted_mib, predicted_smact, low/high, method.

    Rows that cannot be estimated (NaN, empty layer list) get empty predictions and their error in
    the method column, and are listed on stderr."""
    from estimators.table import estimate_csv
    from estimators.types import EstimatorError

    try:
        result = estimate_csv(kind, Path(input_path), Path(output_path), strict=strict)
    except EstimatorError as exc:
        raise _fail(exc) from None
    for message in list(result.errors.values())[:10]:
        click.echo(f"warning: {message}", err=True)
    if len(result.errors) > 10:
        click.echo(f"warning: ... and {len(result.errors) - 10} more rows", err=True)
    click.echo(f"wrote {len(result.predicted_mib)} rows to {output_path} ({len(result.errors)} without an estimate)",
               err=True)


@click.group("estimators")
def estimators_group() -> None:
    """Train, evaluate and benchmark the memory/utilization estimators."""


@estimators_group.command("train")
@click.option("--data", "data_dir", type=click.Path(file_okay=False), default=None,
              help="GPUMemNet CSV directory (default: ../shared/data/gpumemnet)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="where to write the model files (default: the package's estimators/models)")
def train(data_dir: str | None, out_dir: str | None) -> None:
    """Rebuild the shipped ML model files deterministically (fixed split, seeds, one thread)."""
    from estimators.ml import MODELS_DIR, train_all
    from estimators.types import EstimatorError

    try:
        with progress("training the memory, bucket and SMACT models (mlp, cnn)"):
            report = train_all(Path(data_dir) if data_dir else None, Path(out_dir) if out_dir else MODELS_DIR)
    except EstimatorError as exc:
        raise _fail(exc) from None
    for kind, meta in report["kinds"].items():
        click.echo(f"{kind}: {meta['rows']} rows ({meta['skipped_rows']} skipped), high factor {meta['high_factor']}, "
                   f"files {', '.join(f'{k}={v}' for k, v in meta['files'].items())}")


@estimators_group.command("evaluate")
@click.option("--json", "as_json", is_flag=True)
@click.option("--details", is_flag=True, help="also list ours vs. truth per real workload")
@click.option("--plots", "plots_dir", type=click.Path(file_okay=False), default=None,
              help="write predicted-vs-measured PNGs per family here")
@click.option("--llm", is_flag=True, help="the LLM estimator against measured runs (--data FILE.csv)")
@click.option("--data", "data_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="with --llm: a CSV of the schema of data/llm/litgpt_runs.csv")
def evaluate(as_json: bool, details: bool, plots_dir: str | None, llm: bool, data_path: str | None) -> None:
    """Side by side on held-out GPUMemNet rows, on architecture families the ML path never saw (its
    error as the trace's fallback), and on the real thesis workloads. With --llm: the LLM estimator
    on measured fine-tuning runs."""
    from rich.table import Table

    if llm or data_path:
        if not (llm and data_path):
            raise click.UsageError("--llm and --data FILE.csv go together")
        _evaluate_llm(Path(data_path), as_json)
        return

    from estimators.evaluate import (
        evaluate_family_holdout,
        evaluate_gpumemnet,
        evaluate_utilization,
        evaluate_workloads,
        per_workload,
    )

    with progress("evaluating", 5 if plots_dir else 4, unit="parts") as update:
        scores = evaluate_gpumemnet()
        update(1)
        scores += evaluate_family_holdout()
        update(2)
        scores += evaluate_workloads()
        update(3)
        util = evaluate_utilization()
        update(4)
        plots = []
        if plots_dir:
            from estimators.plots import write_evaluation_plots

            plots = write_evaluation_plots(plots_dir)
    for path in plots:
        click.echo(f"wrote {path}", err=True)
    if as_json:
        from dataclasses import asdict

        click.echo(json.dumps({"memory": [asdict(s) for s in scores], "utilization": [asdict(u) for u in util]}))
        return
    table = Table(title="memory estimators (bucket acc, median |err| on rows that fit, under = pred < 0.95 x true,"
                        " far under = pred < 0.9 x true)")
    for col in ("data", "estimator", "rows", "bucket acc", "median |err|", "under", "far under", "ms/job", "failed"):
        table.add_column(col, justify="left" if col in ("data", "estimator") else "right")
    for s in scores:
        table.add_row(s.data, s.estimator, str(s.rows), f"{s.bucket_acc:.1%}", f"{s.median_abs_err:.1%}",
                      f"{s.under_rate:.1%}", f"{s.far_under_rate:.1%}", "-" if s.ms_per_job != s.ms_per_job else f"{s.ms_per_job:.3f}",
                      str(s.failed))
    console = make_console()
    console.print(table)
    util_table = Table(title="solo SMACT (mean) estimator, held-out rows")
    for col in ("data", "rows", "MAE", "MAE of predicting the mean", "truth inside stated band"):
        util_table.add_column(col)
    for u in util:
        util_table.add_row(u.data, str(u.rows), f"{u.mae:.3f}", f"{u.mae_predict_mean:.3f}", f"{u.within_band:.1%}")
    console.print(util_table)
    if details:
        detail = Table(title="ours per real workload")
        for col in ("workload", "true MiB", "ours best", "ours auto", "auto / true", "method"):
            detail.add_column(col)
        for name, true, best, auto, method in per_workload():
            detail.add_row(name, f"{true:.0f}", f"{best:.0f}", f"{auto:.0f}", f"{auto / true:.2f}", method)
        console.print(detail)


def _evaluate_llm(path: Path, as_json: bool) -> None:
    from rich.table import Table

    from estimators.llm_eval import evaluate_rows, summary
    from estimators.types import EstimatorError

    try:
        with progress("estimating runs", sum(1 for _ in path.open()) - 1, unit="runs") as update:
            done = [0]

            def step(_result: object) -> None:
                done[0] += 1
                update(done[0])

            results = evaluate_rows(path, step)
    except EstimatorError as exc:
        raise _fail(exc) from None
    report = summary(results)
    if as_json:
        click.echo(json.dumps(report))
        return
    table = Table(title=f"LLM runs of {path.name}: estimate of each row's metric against the measured peak (GiB)")
    for col in ("run", "model", "method", "metric", "GPU", "measured", "estimated", "err %", "process", "fits?",
                "estimator", "parts (MiB)"):
        table.add_column(col, justify="right" if col in ("measured", "estimated", "err %", "process") else "left")
    for r in report["row_results"]:
        measured = "OOM" if r["oom"] else f"{r['measured_gib']:.2f}"
        parts = ", ".join(f"{k} {v:.0f}" for k, v in (r["parts_mib"] or {}).items() if v) or r["error"]
        fits = "-" if r["predicted_oom"] is None else ("no" if r["predicted_oom"] else "yes")
        table.add_row(r["run_id"] + (" (doubtful)" if r["doubtful"] else ""), r["model"], r["method"], r["metric"],
                      r["gpu"], measured, "-" if r["estimated_gib"] is None else f"{r['estimated_gib']:.2f}",
                      "-" if r["error_pct"] is None else f"{r['error_pct']:+.1f}",
                      "-" if r["process_gib"] is None else f"{r['process_gib']:.2f}", fits, r["estimator"] or "failed",
                      parts)
    console = make_console()
    console.print(table)
    console.print(f"{report['estimated']}/{report['rows']} rows estimated ({report['doubtful_rows']} doubtful rows "
                  f"shown, not counted); median |error| {report['median_abs_err_pct']:.1f} %; under by > 10 %: "
                  f"{report['under10_pct']:.1f} %; OOM runs predicted not to fit: {report['oom_predicted_pct']:.0f} % "
                  f"of {report['oom_rows']}; median trace {report['median_trace_s']:.1f} s")


@estimators_group.command("measure")
@click.option("--jobs", "names", default=None, help="comma-separated job names (default: all; see --list)")
@click.option("--list", "list_jobs", is_flag=True, help="list the jobs and exit")
@click.option("--gpu", default="H100-80GB", show_default=True, help="the GPU type whose baseline the estimates add")
@click.option("--device", type=click.Choice(("cuda", "cpu")), default="cuda", show_default=True,
              help="cpu: the same path with shrunk jobs and no memory figures (a smoke test)")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None, help="also write the results as JSON")
def measure_cmd(names: str | None, list_jobs: bool, gpu: str, device: str, out_path: str | None) -> None:
    """Real training steps on this machine's GPU against their estimates: each job estimated first, then
    run in a fresh process of its own (max allocated, max reserved, NVML's view of the process; MiB)."""
    from estimators.measure import JOBS, measure

    if list_jobs:
        for job in JOBS:
            click.echo(f"{job.name}  ({job.kind}: {json.dumps(job.params)[:120]})")
        return
    by_name = {j.name: j for j in JOBS}
    wanted = [n.strip() for n in names.split(",")] if names else list(by_name)
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise click.BadParameter(f"unknown job(s) {', '.join(unknown)}; --list shows them", param_hint="--jobs")
    results = measure([by_name[n] for n in wanted], gpu=gpu, device=device)
    if out_path:
        Path(out_path).write_text(json.dumps(results, indent=1))
    click.echo(f"{'job':30} {'what':10} {'measured':>9} {'estimated':>9} {'err %':>7}")
    for r in results:
        est, got = r["estimate"], r["measured"]
        for what in ("allocated", "reserved", "process"):
            m, e = got.get(what), est.get(what)
            err = f"{100 * (e - m) / m:+.1f}" if isinstance(m, (int, float)) and isinstance(e, (int, float)) else "-"
            shown = ["-" if v is None else str(round(v)) for v in (m, e)]
            click.echo(f"{r['job']:30} {what:10} {shown[0]:>9} {shown[1]:>9} {err:>7}")
        for side, value in (("estimate", est), ("measured", got)):
            if "error" in value:
                click.echo(f"{r['job']:30} {side} failed: {value['error']}")


@estimators_group.command("build-workload-table")
@click.option("--gpu", default="A100-40GB", show_default=True)
def build_workload_table_cmd(gpu: str) -> None:
    """Trace the zoo models and rebuild models/workload_table.json (a few minutes)."""
    from estimators.workloads import WORKLOAD_TABLE, build_workload_table

    table = build_workload_table(gpu=gpu)
    click.echo(f"wrote {WORKLOAD_TABLE}: {len(table['traced_mib']['peak'])} models, transfer {table['ft_transfer']}")


@estimators_group.command("noise-floor")
@click.option("--trace-rows", default=0, show_default=True,
              help="also trace this many CNN rows rebuilt as modules (~2 s each)")
@click.option("--seed", default=0, show_default=True, help="which rows --trace-rows picks")
def noise_floor(trace_rows: int, seed: int) -> None:
    """What the GPUMemNet labels allow: out-of-fold spread, the price of a safety factor, a trace check."""
    from estimators.noise_floor import report

    report(trace_rows, seed)


@estimators_group.command("shortfall-data")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True,
              help="JSON-lines rows, appended per CNN row; run again to resume")
@click.option("--seed", default=0, show_default=True, help="the random order rows are traced in")
@click.option("--time-budget", "time_budget_s", type=float, default=None,
              help="stop starting new rows after this many seconds")
def shortfall_data(out_path: str, seed: int, time_budget_s: float | None) -> None:
    """Trace GPUMemNet CNN rows rebuilt as modules: the data `shortfall-fit` fits on (~2-5 s a row)."""
    from estimators.shortfall_data import build_rows

    def progress(row: dict) -> None:
        click.echo(f"{row['outcome']:16} {row['family']:10} {row['filename'][:90]}", err=True)

    rows = build_rows(Path(out_path), seed=seed, time_budget_s=time_budget_s, progress=progress)
    click.echo(f"{out_path}: {sum(r['outcome'] == 'traced' for r in rows)} traced rows of {len(rows)}")


@estimators_group.command("shortfall-fit")
@click.option("--data", "data_path", type=click.Path(exists=True, dir_okay=False), required=True,
              help="rows written by `estimators shortfall-data`")
@click.option("--save/--no-save", default=True, show_default=True, help="write estimators/models/shortfall.json")
def shortfall_fit(data_path: str, save: bool) -> None:
    """Fit what the trace misses on training rows, choose by family hold-out, report on unseen rows."""
    from estimators import shortfall
    from estimators.shortfall_data import load_rows

    records = load_rows(Path(data_path))
    model, table = shortfall.fit_and_choose(records, shortfall.data_hash(Path(data_path)))
    click.echo("candidates, leave-one-family-out on training rows (best estimate):")
    for kind, tau, held in table:
        click.echo(f"  {kind:8} tau {tau:.1f}  {held.line()}")
    click.echo(f"chosen: {model.describe()}, fitted on {model.fitted_rows} training rows")
    click.echo("tracing the thesis workloads (a few minutes)...", err=True)
    workloads = shortfall.workload_rows()
    for margin, what in ((0.0, "best estimate"), (shortfall.AUTO_MARGIN, "auto's reserve (best x 1.05)")):
        click.echo(f"{what}:")
        for name, result in shortfall.evaluate(model, records, margin).items():
            click.echo(f"  {name:52} {result.line()}")
        without, with_model = shortfall.evaluate_workloads(model, workloads, margin)
        click.echo(f"  {'thesis workloads (buildable), no shortfall':52} {without.line()}")
        click.echo(f"  {'thesis workloads (buildable), chosen model':52} {with_model.line()}")
    if save:
        shortfall.save(model)
        click.echo(f"wrote {shortfall.MODEL_FILE}")


@estimators_group.command("benchmark")
@click.option("--model", "zoo_model", default="resnet50", show_default=True, help="zoo model to trace")
@click.option("--batch-size", default=128, show_default=True)
@click.option("--repeats", default=5, show_default=True)
@click.option("--skip-trace", is_flag=True, help="only the ML path (the trace takes seconds per run)")
def benchmark(zoo_model: str, batch_size: int, repeats: int, skip_trace: bool) -> None:
    """Latency: trace path on a zoo model, ML path per job and in batch (rows/s)."""
    import statistics
    import tempfile
    import time

    from estimators.data import gpumemnet_dir, load_kind
    from estimators.ml import ml_memory
    from estimators.table import estimate_csv

    if not skip_trace:
        from estimators.trace_estimator import trace_memory
        from estimators.zoo import build

        z = build(zoo_model)
        times = []
        for _ in range(repeats):
            est = trace_memory(z.factory, batch_size=batch_size, input_shape=z.input_shape)
            times.append(est.seconds)
        click.echo(f"trace {zoo_model} batch {batch_size}: {est.peak_mib:.0f} MiB, median "
                   f"{statistics.median(times):.2f} s (runs {', '.join(f'{t:.2f}' for t in times)})")
    rows, _ = load_kind("cnn")
    desc = rows[0].description
    ml_memory(desc, "cnn")
    start = time.perf_counter()
    for _ in range(200):
        ml_memory(desc, "cnn")
    click.echo(f"ml per job (features + predict, one {len(desc.layers)}-layer cnn): "
               f"{(time.perf_counter() - start) / 200 * 1000:.3f} ms")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.csv"
        for kind, name in (("mlp", "mlp_step2.csv"), ("cnn", "cnn_partial.csv")):
            source = gpumemnet_dir() / name
            result = estimate_csv(kind, source, out)  # warm: boosters loaded, name cache filled
            elapsed = []
            for _ in range(repeats):
                start = time.perf_counter()
                estimate_csv(kind, source, out)
                elapsed.append(time.perf_counter() - start)
            n = len(result.predicted_mib)
            click.echo(f"ml batch {kind} (read CSV + parse + features + predict + write CSV, {name}, {n} rows): "
                       f"median {n / statistics.median(elapsed):,.0f} rows/s, best {n / min(elapsed):,.0f} rows/s")


@estimators_group.command("coverage")
@click.option("--source", type=click.Choice(("timm", "hf")), required=True,
              help="timm: its whole model registry; hf: Hugging Face classification architectures from configs")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True,
              help="JSON-lines results, appended per model; run again to resume")
@click.option("--sample", type=int, default=None, help="a seeded random sample of this many models (default: all)")
@click.option("--seed", default=0, show_default=True, help="which sample, and each model's batch size (8-128)")
@click.option("--time-budget", "time_budget_s", type=float, default=None,
              help="stop starting new models after this many seconds")
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True, help="trace timeout per model (s)")
@click.option("--report", "report_only", is_flag=True, help="only summarise what --out holds")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def coverage(source: str, out_path: str, sample: int | None, seed: int, time_budget_s: float | None, timeout_s: float,
             report_only: bool, as_json: bool) -> None:
    """Which public architectures the trace path estimates without falling back, and how fast.

    Needs `timm` (--source timm) or `transformers` (--source hf) installed beside the project (the
    CUDA-build test venv of `./run.sh test-cuda` has both). Models are built from configs only,
    never with downloaded weights."""
    from estimators.coverage import load_rows, run_coverage, summarise
    from estimators.types import EstimatorError

    out = Path(out_path)
    try:
        if report_only:
            rows = load_rows(out)
        else:
            def progress(row) -> None:
                click.echo(f"{row.outcome:9} {row.seconds:6.1f} s  b={row.batch_size:<3} {row.model}"
                           f"{'  ' + row.reason[:100] if row.reason else ''}", err=True)

            rows = run_coverage(source, out, sample=sample, seed=seed, time_budget_s=time_budget_s,
                                timeout_s=timeout_s, progress=progress)
    except (EstimatorError, ImportError) as exc:
        raise _fail(exc) from None
    summary = summarise([r for r in rows if r.source == source])
    if as_json:
        click.echo(json.dumps(summary))
        return
    click.echo(f"{source}: {summary['models']} models; traced {summary['traced']} ({summary['traced share']:.1%}, "
               f"{summary['cpu-run']} of them run for real on the CPU), fell back {summary['fell back']}, "
               f"failed {summary['failed']}; seconds per estimate median {summary['median s']:.2f}, "
               f"p90 {summary['p90 s']:.2f}")
    for reason, count in summary["reasons"]:
        click.echo(f"  {count:4}  {reason}")
