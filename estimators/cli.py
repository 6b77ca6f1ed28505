"""Estimator commands (placeholder until the estimators issue fills them in)."""
import click


@click.command("estimate")
def estimate() -> None:
    """Estimate a training job's peak GPU memory."""
    raise click.ClickException("not implemented yet")


@click.command("estimate-table")
def estimate_table() -> None:
    """Estimate every row of a GPUMemNet-schema CSV."""
    raise click.ClickException("not implemented yet")


@click.group("estimators")
def estimators_group() -> None:
    """Train and evaluate the memory/utilization estimators."""
