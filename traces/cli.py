"""Trace commands: ``traces describe`` and ``traces queues`` (the queue file of a tenant trace)."""

from __future__ import annotations

import click
import yaml


@click.group("traces")
def traces_group() -> None:
    """Look at a trace before replaying it."""


@click.command("describe")
@click.argument("trace")
@click.option("--seed", type=int, default=0, show_default=True)
def describe_command(trace: str, seed: int) -> None:
    """Jobs, GPU-hours, sizes, durations and memory of TRACE (a name or a file)."""
    from traces import TraceError, describe, load_trace

    try:
        click.echo(describe(load_trace(trace, seed=seed)))
    except (TraceError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


@click.command("queues")
@click.argument("trace")
@click.option("--strict", is_flag=True, help="no borrowing: each queue's borrowing limit is 0")
@click.option("--seed", type=int, default=0, show_default=True)
def queues_command(trace: str, strict: bool, seed: int) -> None:
    """The queue file of a tenant trace (philly-vc:..., helios-vc:...): a queue per tenant with its
    scaled quota, for `hier-sched replay --queues` or `hier-sched queues apply`.

    \b
      hier-sched traces queues 'philly-vc:all?scale=0.0625' > queues.yaml
    """
    from traces import TraceError, load_trace
    from traces.tenants import queues_document, tenant_queues

    try:
        loaded = load_trace(trace, seed=seed)
    except (TraceError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if not loaded.tenant_gpus:
        raise click.ClickException(f"{loaded.name} has no tenants with quotas (try philly-vc: or helios-vc:)")
    queues = tenant_queues(loaded.tenant_gpus, borrowing=not strict)
    click.echo(f"# {loaded.name}: {sum(loaded.tenant_gpus.values())} GPUs")
    click.echo(yaml.safe_dump(queues_document(queues), sort_keys=False, default_flow_style=None), nl=False)


traces_group.add_command(describe_command)
traces_group.add_command(queues_command)
