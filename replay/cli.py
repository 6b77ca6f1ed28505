"""Replay command (placeholder)."""
import click


@click.command("replay")
def replay() -> None:
    """Replay a trace in the discrete-event simulator."""
    raise click.ClickException("not implemented yet")
