"""`spinn bench`: time training or inference steps; `spinn bench-label`: time the label stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from spinn.bench import BenchSettings
from spinn.cli.common import PATH, input_file
from spinn.labeling.label_settings import LabelSettings
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
            f"{result['ops_per_transition_step']:.1f} aten ops per transition step as a GPU runs the step "
            f"({result['ops_per_step']:.0f} per step of {result['mean_transition_steps']:.1f} transition steps), "
            f"{result['syncs_per_step']:.0f} host syncs per step"
        )
    if "kernels_per_step" in result:
        click.echo(
            f"{result['kernels_per_step']:.0f} kernels per step, GPU busy {result['gpu_busy_share']:.1%} of the time"
        )


@click.command("bench-label")
@click.argument("input_path", metavar="INPUT", type=PATH, callback=input_file)
@click.option("--model", "model_reference", required=True, help="Checkpoint path or MLflow model URI.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line instead of a summary.")
@field_options(LabelSettings)
def bench_label(input_path: Path, model_reference: str, as_json: bool, **options: Any) -> None:
    """Time `spinn label` on INPUT: parse, model and end-to-end pairs/s (no parse cache unless --parse-cache)."""
    import json

    from spinn.bench import run_label_bench

    values = given(LabelSettings, options)
    values.setdefault("parsing", {}).setdefault("cache_path", None)
    result = run_label_bench(input_path, model_reference, resolve(LabelSettings, None, values))
    if as_json:
        click.echo(json.dumps(result))
        return
    rates = {
        name: "-" if result[key] is None else f"{result[key]:.0f} pairs/s"
        for name, key in (
            ("parse", "parse_pairs_per_second"),
            ("model", "model_pairs_per_second"),
            ("end to end", "pairs_per_second"),
        )
    }
    parsing = result["parsing"]
    click.echo(
        f"{result['rows']} pairs ({result['labelled']} labelled) in {result['seconds']:.1f} s on "
        f"{result['device_name']} ({result['cpus']} cpus), parser {result['parser']} "
        f"({parsing['workers']} workers x {parsing['threads']} threads, batch {parsing['batch_size']}), "
        f"model threads {result['threads']}{', int8' if result['int8'] else ''}: "
        + ", ".join(f"{name} {rate}" for name, rate in rates.items())
        + f"; cpu {result['cpu_seconds']:.1f} s, peak RSS {result['peak_rss_bytes'] / 2**20:.0f} MiB"
    )
