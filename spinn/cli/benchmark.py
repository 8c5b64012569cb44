"""`spinn bench`: time training or inference steps."""

from __future__ import annotations

from typing import Any

import click

from spinn.bench import BenchSettings
from spinn.options import field_options, given, resolve


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line instead of a summary.")
@field_options(BenchSettings)
def bench(as_json: bool, **options: Any) -> None:
    """Time SPINN training or inference steps on real trees and print pairs/s and peak memory."""
    import json

    from spinn.bench import run_bench

    result = run_bench(resolve(BenchSettings, None, given(BenchSettings, options)))
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(
        f"{result['variant']} {result['mode']} impl={result['impl']} "
        f"D={result['d_hidden']} batch={result['batch_size']} on {result['device_name']} "
        f"({result['threads']} threads): {result['pairs_per_second']:.0f} pairs/s, "
        f"{result['seconds_per_step'] * 1000:.1f} ms/step, peak memory {result['peak_memory_bytes'] / 2**20:.0f} MiB"
    )
    if "ops_per_step" in result:
        click.echo(
            f"{result['ops_per_transition_step']:.1f} aten ops per transition step "
            f"({result['ops_per_step']:.0f} per step of {result['mean_transition_steps']:.1f} transition steps), "
            f"{result['syncs_per_step']:.0f} host syncs per step"
        )
    if "kernels_per_step" in result:
        click.echo(
            f"{result['kernels_per_step']:.0f} kernels per step, GPU busy {result['gpu_busy_share']:.1%} of the time"
        )
