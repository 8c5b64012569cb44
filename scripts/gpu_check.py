"""The GPU check (issue 30): every CUDA path of the product, proved on one GPU in one prepared call.

Parts, each run in a process of its own (a CUDA error or a hang in one cannot take the others down), in this
order, each within its own cap and the whole run within a deadline (`--deadline`): a part that fails is
recorded with its traceback and the next one runs; parts the deadline leaves no time for are "skipped: out of
time". Every part writes its JSON as it goes, so a part stopped at its cap keeps what it had measured. The
table comes last; the results go under --out, else $OUT, else gpu-check/: gpu_check.json, table.txt and
details.tgz (parts/<part>.json and logs/<part>.log).

    device           the card, torch, CUDA and the carried packages
    equality         fused encoder = spec encoder on the device (pi-nt, pi, spinn gold+greedy, rl with fixed
                     uniforms): logits, transition logits, every gradient; float64 1e-10, float32 1e-5 relative
    graphs_train     20 training steps replayed from CUDA graphs = 20 eager steps (1e-5 relative after one,
                     1e-3 after twenty; exactly, under torch.use_deterministic_algorithms)
    graphs_predict   predict with inference graphs = eager predict: labels, trees, probabilities (1e-6)
    checkpoint       a spinn model trained briefly without MLflow (the library's loop, no tracking)
    cuda_cpu_labels  that checkpoint's labels of 1,000 SNLI test pairs on CUDA against the CPU
    resume           60 steps straight against 30 + resume to 60 (bit-identical when deterministic, else no
                     further apart than two straight runs)
    speed            PI 300D on SNLI dev trees resampled to 550,152 pairs: bench train 256 / 1024, infer 1024
                     fp32 / bf16, the real loop at 256, kernels per step and the GPU's busy share
    label            `spinn label --parser model` of 100,000 raw pairs: pairs/s end to end, peak GPU memory
    nccl             torchrun --nproc-per-node 1, 20 steps in DistributedDataParallel over nccl = one process
    capture          CUDA graphs at batch 256: shapes captured, refused (and why), capture time
    encoders         the fused against the spec encoder on one batch of 256: eager, graphs, torch.compile
    reference        the seed article's per-example step at batch 256 (how far the fast step is ahead)

`--dry-run` runs every part at the smallest size on the CPU (graphs are not captured there and say so; nccl
becomes gloo; torch.compile is skipped: it takes minutes on two cores), with an import blocker in every
process that makes MLflow, Prefect, Stanza, DVC, Dask and every package the GPU image lacks fail to import,
as they would there. The GPU image has Python 3.12, torch with CUDA, numpy, pyarrow and pytest; the rest
comes from wheels in .whl/ (scripts/gpu_check.sh installs them) and the SNLI files from .gpu-data/, both made
once by `scripts/gpu_check.sh --prepare` on a machine with pip's registry and both git-excluded.

    scripts/gpu_check.sh --prepare                 # once, here: wheels into .whl/, SNLI dev + test into .gpu-data/
    scripts/gpu_check.sh --dry-run                 # rehearse every part on the CPU (under 2 minutes on 2 cores)
    run(command="scripts/gpu_check.sh", carry=[".whl", ".gpu-data"], timeout_s=480)   # the device call
    scripts/gpu_check.sh --only checkpoint,label   # a second, shorter call: some parts (label needs a checkpoint)
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import re
import select
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED_SNLI = ROOT.parent / "shared" / "data" / "snli"
GPU_DATA = ROOT / ".gpu-data"
WHEELS_DIR = ROOT / ".whl"
DEFAULT_OUT = ROOT / "gpu-check"
DEV_FILE, TEST_FILE = "snli_1.0_dev.jsonl.gz", "snli_1.0_test.jsonl.gz"
FULL_DEADLINE_S = 390
"""The whole GPU run, wheels installed before it: within 7 minutes, so a second shorter call still fits."""
DRY_DEADLINE_S = 300
"""The dry run takes about half a minute of CPU (its parts forked from one interpreter); this much leaves room
for busy cores before parts are skipped."""
MIN_PART_S = 15
"""A part is not started with less time than this left."""
TABLE_RESERVE_S = 5
"""Kept back from the last part so the table is always printed."""
STOP_GRACE_S = 10
"""A part stopped at its limit gets this long after SIGTERM before SIGKILL."""
FORK_REPLY_S = 60
"""The dry run's part server answers a fork with its pid within this (its first answer waits for its imports)."""
PRELOADED = ("torch", "spinn.bench", "spinn.model.spinn", "spinn.training.loop", "spinn.inference.predict")
"""What the dry run's part server imports once, before it forks the parts: torch and the spinn modules they use."""
SEED = 1234
REASON_CHARS = 200
"""A failed part's error, as the table shows it."""
REFUSAL_LINE = "CUDA graph capture failed"
"""How spinn.inference.graphs starts the warning it logs for each shape whose capture failed."""
RESUME_LOG_EVERY = 1
LARGE_LABEL_BATCH = 1_024
MODEL_STAGE = re.compile(r"model ([\d,]+ pairs/s)")
"""The model stage's rate in `spinn label`'s report."""
"""The label part's second run, in pairs per model batch (the default is 256): the batch the speed part's
inference runs at, where a GPU step costs little more than at 256."""
"""The resume part logs every step's loss: the first step a resumed run differs at says where to look."""
DETAILS = "details"
"""The packed folder of each part's JSON and log: a device machine sends back only a few files."""
TORCHRUN_ERROR_LINES = 80
"""The end of torchrun's stderr kept in the nccl part's result: the rank's traceback comes before torchrun's own."""

GPU_IMAGE = ("torch", "numpy", "pyarrow", "pytest")
"""What the GPU image has besides the standard library (and these packages' own requirements)."""
KERNEL_COMPILER = "triton"
"""The cells' kernel's compiler (spinn/model/cell_kernel.py): torch's CUDA wheels require it; without it the
cells run as torch ops."""
WHEELS = (
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    "click",
    "regex",
    "tqdm",
    "pyyaml",
    "requests",
    "urllib3",
    "idna",
    "certifi",
    "charset-normalizer",
)
"""Carried as Python 3.12 wheels in .whl/, at the project venv's versions: what the check's imports need beyond
the GPU image (requests: spinn.data.glove reads vector files through spinn.data.fetch)."""
NEVER_IMPORTED = ("mlflow", "prefect", "stanza", "dvc", "dask", "distributed")
"""Heavy doors the check must never open: none is on the GPU image, and none is needed to train or label."""
PROJECT = "spinn"
WHEEL_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
GPU_PYTHON = "3.12"
EXCLUDED = ("/.whl/", "/.gpu-data/")
"""Git-excluded (the common git dir's info/exclude): carried to the GPU machine by name, never committed."""
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
"""cuBLAS is deterministic only with a fixed workspace, set before its first GEMM (torch's reproducibility notes)."""


@dataclass(frozen=True)
class PartSpec:
    name: str
    cap_s: int
    """The most this part may take on the GPU before it is stopped (its measurements so far are kept)."""
    deterministic: bool = False
    """It compares runs under torch.use_deterministic_algorithms (its process gets DETERMINISTIC_ENV)."""


PARTS = (
    PartSpec("device", 60),
    PartSpec("equality", 90),
    PartSpec("graphs_train", 90, deterministic=True),
    PartSpec("graphs_predict", 60),
    PartSpec("checkpoint", 90),
    PartSpec("cuda_cpu_labels", 60),
    PartSpec("resume", 120, deterministic=True),
    PartSpec("speed", 180),
    PartSpec("label", 120),
    PartSpec("nccl", 90),
    PartSpec("capture", 90),
    PartSpec("encoders", 180),
    PartSpec("reference", 60),
)
PART_NAMES = tuple(part.name for part in PARTS)


# ============================================================================= the command line


class _OneLineParser(argparse.ArgumentParser):
    """A bad command line is one `error: ...` line on stderr and exit status 2."""

    def error(self, message: str):  # noqa: D401 (argparse's name)
        print(f"error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = _OneLineParser(
        prog="scripts/gpu_check.sh",
        description="The GPU check: equality, capture, resume, speed, labelling and nccl on one GPU; a table last.",
    )
    parser.add_argument("--dry-run", action="store_true", help="every part at the smallest size, on the CPU")
    parser.add_argument("--out", type=Path, help="where the JSON results go (default: $OUT, else gpu-check/)")
    parser.add_argument("--only", type=_part_list, help=f"comma-separated parts, of: {', '.join(PART_NAMES)}")
    deadlines = f"default: {FULL_DEADLINE_S}; dry run {DRY_DEADLINE_S}"
    parser.add_argument("--deadline", type=_seconds, help=f"seconds for the whole run ({deadlines})")
    parser.add_argument("--data", type=Path, help="folder with the SNLI dev and test .jsonl.gz (default: .gpu-data)")
    parser.add_argument("--prepare", action="store_true", help="download the wheels and copy the SNLI files, once")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (checkpoints, prepared data)")
    parser.add_argument("--part", choices=PART_NAMES, help=argparse.SUPPRESS)
    parser.add_argument("--rank-of", choices=("nccl",), help=argparse.SUPPRESS)
    parser.add_argument("--fork-parts", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.prepare and (arguments.dry_run or arguments.only):
        parser.error("--prepare only downloads and copies; run the check after it")
    return arguments


def _part_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in PART_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown part {', '.join(unknown) or '(none given)'}")
    return names


def _seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def main(argv: list[str]) -> int:
    arguments = parse_arguments(argv)
    if arguments.part:
        return run_part(arguments)
    if arguments.rank_of:
        return run_rank(arguments)
    if arguments.fork_parts:
        return serve_parts(arguments)
    if arguments.prepare:
        return prepare_gpu_files(arguments.data)
    return run_check(arguments)


# ============================================================================= the parent: parts, deadline, table


def run_check(arguments: argparse.Namespace) -> int:
    """Every chosen part in its own process, in order, within the deadline; the table last."""
    started = time.monotonic()
    dry = arguments.dry_run
    data = find_data(arguments.data)
    out = results_folder(arguments.out, os.environ)
    out.mkdir(parents=True, exist_ok=True)
    deadline = started + (arguments.deadline or (DRY_DEADLINE_S if dry else FULL_DEADLINE_S))
    work = Path(tempfile.mkdtemp(prefix="spinn-gpu-check-"))
    details = work / DETAILS
    for folder in (details / "parts", details / "logs"):
        folder.mkdir(parents=True)
    environment = part_environment(work, dry)
    chosen = [part for part in PARTS if arguments.only is None or part.name in arguments.only]
    say(started, f"GPU check{' (dry run on the CPU)' if dry else ''}: {len(chosen)} parts, results in {out}")
    results: dict[str, dict[str, Any]] = {}
    forks = PartForks(work, data, environment) if dry else None
    try:
        for part in chosen:
            results[part.name] = run_one(part, started, deadline, work, details, data, forks, environment, results)
    finally:
        if forks is not None:
            forks.close()
        with tarfile.open(out / f"{DETAILS}.tgz", "w:gz") as packed:
            packed.add(details, arcname=DETAILS)
        if arguments.keep:
            say(started, f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    summary = {
        "command": " ".join(["scripts/gpu_check.sh", *sys.argv[1:]]),
        "dry_run": dry,
        "seconds": time.monotonic() - started,
        "data": str(data),
        "parts": results,
    }
    table = render_table(summary)
    write_json(out / "gpu_check.json", summary)
    (out / "table.txt").write_text(table + "\n")
    print(table, flush=True)
    return 0 if all(result["verdict"] == "ok" for result in results.values()) else 1


def results_folder(given: Path | None, environment: dict[str, str]) -> Path:
    """--out, else $OUT (the device tool's folder that comes back), else gpu-check/ in the checkout. It gets three
    files: gpu_check.json (every part's result), table.txt and details.tgz (each part's JSON and log)."""
    return Path(given or environment.get("OUT") or DEFAULT_OUT).resolve()


def say(started: float, line: str) -> None:
    print(f"[{time.monotonic() - started:6.1f}s] {line}", flush=True)


def find_data(given: Path | None) -> Path:
    """The folder holding the SNLI dev and test files: --data, else .gpu-data/, else ../shared/data/snli."""
    for folder in (given,) if given is not None else (GPU_DATA, SHARED_SNLI):
        if (Path(folder) / DEV_FILE).exists() and (Path(folder) / TEST_FILE).exists():
            return Path(folder).resolve()
    if given is not None:
        fail(f"{given}: holds no {DEV_FILE} and {TEST_FILE}")
    fail(f"no SNLI files: run `scripts/gpu_check.sh --prepare` (copies them into {GPU_DATA}) or give --data")


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def part_environment(work: Path, dry: bool) -> dict[str, str]:
    """What every part process gets: the checkout first on PYTHONPATH (it is not installed on the GPU image),
    and in the dry run the import blocker (a sitecustomize) before it."""
    paths = [str(ROOT)]
    if dry:
        blocker = work / "blocker"
        blocker.mkdir()
        (blocker / "sitecustomize.py").write_text(blocker_source(blocked_modules()))
        paths.insert(0, str(blocker))
    existing = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *([existing] if existing else [])])}


def run_one(
    part: PartSpec,
    started: float,
    deadline: float,
    work: Path,
    details: Path,
    data: Path,
    forks: PartForks | None,
    environment: dict[str, str],
    earlier: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Run one part's process within its cap and what is left of the deadline; its result, with a verdict.
    The GPU run starts a fresh interpreter per part; the dry run forks it from `forks` (same isolation)."""
    blocked = _blocked_by(part, earlier)
    if blocked:
        say(started, f"{part.name}: skipped: {blocked}")
        return {"part": part.name, "verdict": "skipped", "reason": blocked, "seconds": 0.0}
    left = deadline - time.monotonic() - TABLE_RESERVE_S
    if left < MIN_PART_S:
        say(started, f"{part.name}: skipped: out of time")
        return {"part": part.name, "verdict": "skipped", "reason": "out of time", "seconds": 0.0}
    limit = min(part.cap_s, left)
    result_path, log_path = details / "parts" / f"{part.name}.json", details / "logs" / f"{part.name}.log"
    result_path.unlink(missing_ok=True)
    extra = DETERMINISTIC_ENV if part.deterministic else {}
    say(started, f"{part.name}: running (at most {limit:.0f} s)")
    begun = time.monotonic()
    if forks is not None:
        code = forks.run(part.name, result_path, log_path, extra, limit)
    else:
        command = [sys.executable, str(Path(__file__).resolve()), "--part", part.name, "--work", str(work)]
        command += ["--result", str(result_path), "--data", str(data)]
        with open(log_path, "w") as log:
            code = run_with_limit(command, {**environment, **extra}, log, limit)
    result = read_json(result_path) or {"part": part.name}
    result["seconds"] = time.monotonic() - begun
    result["captures_refused"] = refusals(log_path)
    result["verdict"] = verdict(result, code, limit)
    if result["verdict"] not in ("ok", "skipped"):
        result["log_tail"] = tail(log_path)
    write_json(result_path, result)
    say(started, f"{part.name}: {result['verdict']} ({result['seconds']:.1f} s)")
    return result


def _blocked_by(part: PartSpec, earlier: dict[str, dict[str, Any]]) -> str | None:
    """The full check needs CUDA: once the device part found none, nothing else is started."""
    device = earlier.get("device")
    if part.name != "device" and device is not None and device.get("status") == "no_cuda":
        return "no CUDA device (see part device)"
    return None


def run_with_limit(command: list[str], env: dict[str, str], log, limit: float) -> int | None:
    """Run in a session of its own, output to `log`; past `limit` seconds the whole session is stopped
    (torchrun's ranks too). The exit status, or None when it was stopped."""
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return process.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        stop_session(process.pid, lambda seconds: _ended(process, seconds))
        return None


def _ended(process: subprocess.Popen, seconds: float) -> bool:
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def stop_session(pid: int, wait: Callable[[float], bool]) -> None:
    """SIGTERM the session led by `pid`, SIGKILL it when `wait(seconds)` does not see it end."""
    os.killpg(pid, signal.SIGTERM)
    if not wait(STOP_GRACE_S):
        os.killpg(pid, signal.SIGKILL)
        wait(STOP_GRACE_S)


class PartForks:
    """The dry run's part processes, forked from one interpreter (`--fork-parts`) that has imported torch and
    spinn under the import blocker: each part still runs in a process and session of its own, with its own
    log, limit and exit status, without paying torch's import (about 2 CPU-s) thirteen times."""

    def __init__(self, work: Path, data: Path, environment: dict[str, str]):
        command = [sys.executable, str(Path(__file__).resolve()), "--fork-parts", "--dry-run"]
        command += ["--work", str(work), "--data", str(data)]
        self.server = subprocess.Popen(
            command, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def run(self, name: str, result: Path, log: Path, extra: dict[str, str], limit: float) -> int | None:
        """The part's exit status, or None when it was stopped at `limit`."""
        self.server.stdin.write(json.dumps({"part": name, "result": str(result), "log": str(log), "env": extra}))
        self.server.stdin.write("\n")
        self.server.stdin.flush()
        pid = json.loads(self._reply(FORK_REPLY_S))["pid"]
        ended = self._reply(limit)
        if ended is None:
            stop_session(pid, lambda seconds: self._reply(seconds) is not None)
            return None
        return json.loads(ended)["code"]

    def _reply(self, seconds: float) -> str | None:
        ready, _, _ = select.select([self.server.stdout], [], [], seconds)
        line = self.server.stdout.readline() if ready else ""
        if ready and not line:
            raise RuntimeError(f"the part server ended (exit {self.server.wait()})")
        return line or None

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait()


def serve_parts(arguments: argparse.Namespace) -> int:
    """`--fork-parts`: import what the parts import, then per request on stdin fork a part into a session of its
    own, its output to its log; answer its pid, then its exit status."""
    for module in PRELOADED:
        importlib.import_module(module)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1  # a fork that raised must not go back to serving
            try:
                code = _forked_part(arguments, request)
            finally:
                os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)
    return 0


def _forked_part(arguments: argparse.Namespace, request: dict[str, Any]) -> int:
    """A forked part: as `--part NAME` would run it, from its own session, log and environment."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for stream in (1, 2):
        os.dup2(log, stream)
    os.environ.update(request["env"])
    part = argparse.Namespace(**{**vars(arguments), "part": request["part"], "result": Path(request["result"])})
    try:
        return run_part(part)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def verdict(result: dict[str, Any], code: int | None, limit: float) -> str:
    """ok (every check held), FAILED (a check did not), error, timed out, crashed, or skipped (the part said why)."""
    status = result.get("status")
    if code is None:
        return f"timed out after {limit:.0f} s"
    if status == "skipped":
        return "skipped"
    if status in ("error", "no_cuda"):
        return "error"
    if status != "ok" or code != 0:
        return f"crashed (exit {code})"
    return "FAILED" if any(passed is False for passed in result.get("checks", {}).values()) else "ok"


def refusals(path: Path) -> int:
    """Shapes whose capture failed in a part's process, as its log says (graphs_train refuses one on purpose)."""
    try:
        return sum(line.startswith(REFUSAL_LINE) for line in path.read_text(errors="replace").splitlines())
    except OSError:
        return 0


def tail(path: Path, lines: int = 30) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, value: Any) -> None:
    """Whole or not at all: a part stopped while writing leaves the previous version."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(value, indent=2, default=str) + "\n")
    temporary.replace(path)


# ----------------------------------------------------------------------------- the table


def render_table(summary: dict[str, Any]) -> str:
    """One line per part (verdict, seconds, its figures), the speed rows against their goals, what ran it."""
    parts = summary["parts"]
    ran = [result.get("machine") for result in parts.values() if result.get("machine")]
    device = parts.get("device", {}).get("result") or (ran[0] if ran else {})
    title = "GPU check" + (
        " (dry run on the CPU: sizes are the smallest, figures are not speeds)" if summary["dry_run"] else ""
    )
    lines = [title, f"{'part':<16} {'verdict':<22} {'s':>6}  figures"]
    for name, result in parts.items():
        lines.append(f"{name:<16} {result['verdict']:<22} {result['seconds']:>6.1f}  {_figures(result)}")
        for row in result.get("result", {}).get("rows", []):
            lines.append(f"  {row}")
    card = device.get("device_name", "unknown device")
    lines.append(
        f"{card}, torch {device.get('torch', '?')}, CUDA {device.get('cuda')}, Python {device.get('python', '?')}; "
        f"{summary['seconds']:.0f} s in all; command: {summary['command']}"
    )
    return "\n".join(lines)


def _figures(result: dict[str, Any]) -> str:
    """A part's summary; for a part that failed, its error first and what it had measured before."""
    measured = result.get("result", {}).get("summary") or result.get("reason") or ""
    if result.get("captures_refused"):
        measured += f" [captures refused: {result['captures_refused']}, why in the log]"
    if result["verdict"] in ("ok", "FAILED", "skipped"):
        return measured
    error = (result.get("error") or "").strip().splitlines()
    cause = error[0][:REASON_CHARS] if error else result["verdict"]
    return f"{cause}" + (f"; measured before: {measured}" if measured and measured != cause else "")


# ============================================================================= the import blocker (dry run)


def blocked_modules() -> list[str]:
    """Top-level modules that would not import on the GPU image: those of every installed distribution outside
    the image's packages, the carried wheels, the project and all their requirements; and NEVER_IMPORTED."""
    from importlib import metadata

    allowed = requirement_closure([*GPU_IMAGE, *WHEELS, PROJECT])
    owners = metadata.packages_distributions()
    blocked = {
        module
        for module, distributions in owners.items()
        if not any(canonical(distribution) in allowed for distribution in distributions)
    }
    return sorted(blocked | set(NEVER_IMPORTED))


def requirement_closure(names: Iterable[str]) -> set[str]:
    """The distributions named and everything they require (extras left out; other markers counted in)."""
    from importlib import metadata

    seen: set[str] = set()
    todo = [canonical(name) for name in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requirements = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for requirement in requirements:
            if "extra ==" not in requirement.replace('"', "'").replace("extra=", "extra =="):
                todo.append(canonical(re.match(r"[A-Za-z0-9._-]+", requirement).group(0)))
    return seen


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def blocker_source(blocked: list[str]) -> str:
    """A sitecustomize that hides the blocked modules from every process that starts with it: the path finder
    answers as if they were not installed, so `import x` fails and importlib.util.find_spec("x") is None, as
    on the GPU image (torch probes optional modules that way). Each hidden module is named once on stderr."""
    return f'''"""gpu_check --dry-run: what the GPU image lacks is not found here either."""
import sys
from importlib.machinery import PathFinder

BLOCKED = frozenset({blocked!r})
_named = set()


class WithoutTheGpuImagesAbsentees(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in BLOCKED:
            if top not in _named:
                _named.add(top)
                print(f"gpu_check --dry-run: {{top}} is hidden (not on the GPU image)", file=sys.stderr)
            return None
        return PathFinder.find_spec(name, path, target)


sys.meta_path[:] = [WithoutTheGpuImagesAbsentees if finder is PathFinder else finder for finder in sys.meta_path]
'''


# ============================================================================= --prepare (once, with pip's registry)


def prepare_gpu_files(data: Path | None) -> int:
    """Python 3.12 wheels of WHEELS at this venv's versions into .whl/ (replacing what was there), the SNLI dev
    and test files into .gpu-data/, both git-excluded; prints what the device call will carry."""
    from importlib import metadata

    pins = [f"{name}=={metadata.version(name)}" for name in WHEELS]
    with tempfile.TemporaryDirectory(prefix="spinn-wheels-") as folder:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += ["--python-version", GPU_PYTHON, "--implementation", "cp", "-d", folder, "-q"]
        for platform_tag in WHEEL_PLATFORMS:
            command += ["--platform", platform_tag]
        subprocess.run([*command, *pins], check=True)
        shutil.rmtree(WHEELS_DIR, ignore_errors=True)
        shutil.copytree(folder, WHEELS_DIR)
        WHEELS_DIR.chmod(0o755)
    source = Path(data) if data else SHARED_SNLI
    GPU_DATA.mkdir(exist_ok=True)
    for name in (DEV_FILE, TEST_FILE):
        if not (source / name).exists():
            fail(f"{source / name}: not found (give --data FOLDER holding {DEV_FILE} and {TEST_FILE})")
        (GPU_DATA / name).unlink(missing_ok=True)  # the shared copies are read-only: replace, never write into
        shutil.copyfile(source / name, GPU_DATA / name)
    exclude_from_git(ROOT)
    carried = sum(path.stat().st_size for folder in (WHEELS_DIR, GPU_DATA) for path in folder.iterdir())
    for pin in pins:
        print(f"wheel {pin}")
    print(f"carried: .whl ({len(list(WHEELS_DIR.glob('*.whl')))} wheels) and .gpu-data, {carried / 2**20:.1f} MiB")
    return 0


def exclude_from_git(root: Path) -> None:
    """Add EXCLUDED to the info/exclude of the checkout's common git dir (worktrees share it), once."""
    found = subprocess.run(
        ["git", "rev-parse", "--git-common-dir"], cwd=root, capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        return
    exclude = (root / found.stdout.strip()).resolve() / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    present = exclude.read_text().splitlines() if exclude.exists() else []
    missing = [line for line in EXCLUDED if line not in present]
    if missing:
        with open(exclude, "a") as file:
            file.write("".join(f"{line}\n" for line in missing))


# ============================================================================= a part's process


class Skip(Exception):
    """The part cannot run here, for a reason that is not a defect (it says which)."""


class NoCuda(Exception):
    """The full check found no CUDA device: nothing else is started."""


@dataclass(frozen=True)
class Sizes:
    """How big each part runs: FULL on the GPU, DRY (the smallest that still runs every code path) on a CPU."""

    d: int  # hidden, embedding
    d_tracker: int
    mlp_dim: int
    equality_pairs: int
    train_pairs: int | None  # SNLI dev pairs the trained parts learn from (None: all 9,842)
    eval_pairs: int  # SNLI test pairs their dev evaluation reads
    graph_steps: int
    graph_batch: int
    predict_pairs: int
    predict_batch: int
    checkpoint_steps: int
    checkpoint_batch: int
    labels_pairs: int
    resume_steps: int
    resume_batch: int
    epoch_pairs: int
    speed: dict[str, tuple[int, int]]  # bench row -> (warmup, timed steps)
    encoder_steps: tuple[int, int]
    label_pairs: int
    nccl_steps: int
    nccl_batch: int
    capture_batches: int
    capture_predict_pairs: int
    reference_steps: tuple[int, int]
    speed_d: int  # the speed parts' PI model: hidden and embedding
    speed_batch: int  # the small batch of the speed rows (256)
    speed_large_batch: int  # the large one (1024)


FULL = Sizes(
    d=300,
    d_tracker=64,
    mlp_dim=1024,
    equality_pairs=64,
    train_pairs=None,
    eval_pairs=1000,
    graph_steps=20,
    graph_batch=64,
    predict_pairs=1000,
    predict_batch=64,
    checkpoint_steps=300,
    checkpoint_batch=256,
    labels_pairs=1000,
    resume_steps=60,
    resume_batch=256,
    epoch_pairs=550_152,
    speed={"train": (100, 300), "train_large": (60, 150), "infer": (60, 200), "loop": (100, 300), "profile": (60, 20)},
    encoder_steps=(5, 30),
    label_pairs=100_000,
    nccl_steps=20,
    nccl_batch=256,
    capture_batches=120,
    capture_predict_pairs=10_000,
    reference_steps=(2, 15),
    speed_d=300,
    speed_batch=256,
    speed_large_batch=1024,
)
DRY = Sizes(
    d=8,
    d_tracker=4,
    mlp_dim=16,
    equality_pairs=8,
    train_pairs=24,
    eval_pairs=12,
    graph_steps=4,
    graph_batch=8,
    predict_pairs=24,
    predict_batch=4,
    checkpoint_steps=4,
    checkpoint_batch=8,
    labels_pairs=24,
    resume_steps=6,
    resume_batch=8,
    epoch_pairs=64,
    speed={"train": (1, 2), "train_large": (1, 2), "infer": (1, 2), "loop": (1, 2), "profile": (1, 2)},
    encoder_steps=(1, 2),
    label_pairs=120,
    nccl_steps=14,
    nccl_batch=8,
    capture_batches=4,
    capture_predict_pairs=40,
    reference_steps=(1, 1),
    speed_d=8,
    speed_batch=8,
    speed_large_batch=16,
)
TREE_VARIANTS = ("pi-nt", "pi", "spinn", "rl")
DRY_SNLI_LINES = 120
"""The dry run reads this many lines of each SNLI file (dev: 118 labelled pairs)."""


class Part:
    """What a part's process works with, and its result: written to disk at every `record`, so a part stopped
    at its cap keeps what it had."""

    def __init__(self, arguments: argparse.Namespace):
        self.name, self.dry = arguments.part or arguments.rank_of, arguments.dry_run
        self.work, self.data, self.path = arguments.work, arguments.data, arguments.result
        self.sizes = DRY if self.dry else FULL
        self.result: dict[str, Any] = {}
        self.checks: dict[str, bool | None] = {}
        self.status = "running"
        self.error: str | None = None
        self.traceback: str | None = None

    @property
    def device(self):
        import torch

        return torch.device("cpu" if self.dry else "cuda")

    @property
    def dev_file(self) -> Path:
        return self.snli(DEV_FILE)

    @property
    def test_file(self) -> Path:
        return self.snli(TEST_FILE)

    def snli(self, name: str) -> Path:
        """The SNLI file; in the dry run its first DRY_SNLI_LINES lines (a plain .jsonl of the same name, made
        once), so no part spends its seconds reading 10,000 pairs to use a few dozen."""
        if not self.dry:
            return self.data / name
        return first_lines(self.data / name, DRY_SNLI_LINES, self.work / "sources")

    def record(self, **values: Any) -> None:
        self.result.update(values)
        self.save()

    def check(self, name: str, passed: bool | None, **detail: Any) -> bool | None:
        """A named check: True held, False did not, None could not be made here (detail says why)."""
        self.checks[name] = passed
        if detail:
            self.result.setdefault("details", {})[name] = detail
        self.save()
        return passed

    def save(self) -> None:
        if self.path is None:
            return
        value = {"part": self.name, "status": self.status, "checks": self.checks, "result": self.result}
        value["machine"] = machine()  # the table's last line, when the device part did not run
        if self.error:
            value.update(error=self.error, traceback=self.traceback)
        write_json(self.path, value)


def run_part(arguments: argparse.Namespace) -> int:
    """A part's process: run it, and say in its JSON how it ended."""
    part = Part(arguments)
    part.save()
    try:
        _quiet_and_small(part)
        PART_FUNCTIONS[part.name](part)
        part.status = "ok"
    except Skip as reason:
        part.status, part.error = "skipped", str(reason)
        part.result.setdefault("summary", f"skipped: {reason}")
    except NoCuda as reason:
        part.status, part.error = "no_cuda", str(reason)
        part.result["summary"] = str(reason)
    except BaseException as error:  # recorded, with its traceback; the parent goes on with the next part
        part.status, part.error, part.traceback = "error", f"{type(error).__name__}: {error}", traceback.format_exc()
        print(part.traceback, file=sys.stderr)
    part.save()
    return 0 if part.status in ("ok", "skipped") else 1


def _quiet_and_small(part: Part) -> None:
    """One torch thread for the tiny dry-run models on shared cores; no progress bars in the logs."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    if part.dry:
        import torch

        torch.set_num_threads(1)


# ----------------------------------------------------------------------------- shared builders


def model_config(sizes: Sizes, variant: str, **changes: Any) -> dict[str, Any]:
    """A model of the part's size; batch norm and dropout on as the paper's presets have them."""
    config = dict(
        variant=variant,
        d_embed=sizes.d,
        d_hidden=sizes.d,
        d_tracker=sizes.d_tracker,
        mlp_layers=1,
        mlp_dim=sizes.mlp_dim,
        use_batch_norm=True,
        embed_dropout=0.1,
        mlp_dropout=0.1,
    )
    return {**config, **changes}


def new_model(sizes: Sizes, variant: str, vocab_size: int, device, seed: int = SEED, **changes: Any):
    import torch

    from spinn.model.config import SPINNConfig
    from spinn.model.spinn import SPINN, random_vectors

    torch.manual_seed(seed)
    config = SPINNConfig(**model_config(sizes, variant, **changes))
    return SPINN(config, random_vectors(vocab_size, config.d_embed, seed)).to(device)


def new_trainer(model, graphs: bool, network=None, amp: bool = False):
    """spinn train's step (foreach RMSprop, capturable on CUDA, clipping, device metrics) on `model`."""
    from spinn.training.train_step import Schedule, StepOptions, TrainStep, make_optimizer

    schedule = Schedule(base=1e-3, decay=0.75, decay_steps=10)
    optimizer = make_optimizer(model, schedule, 1e-5, next(model.parameters()).device)
    return TrainStep(model, optimizer, schedule, StepOptions(5.0, amp, graphs), network=network)


def snli_examples(path: Path, count: int | None, labelled: bool = True):
    """The first `count` pairs of an SNLI file (labelled ones only, if asked), id-encoded, and the vocabulary size."""
    from spinn.data.pairs import corpus_vocabulary, encode_pairs, read_raw_pairs

    pairs = [pair for pair in read_raw_pairs(path) if pair.label is not None or not labelled][:count]
    vocabulary = corpus_vocabulary(pairs)
    return encode_pairs(pairs, vocabulary), len(vocabulary)


def graph_report(graphs) -> dict[str, Any]:
    """A step's Graphs report, or why there is none (no CUDA: nothing is captured on a CPU)."""
    if graphs is None:
        return {"note": "no CUDA: graphs not captured"}
    return graphs.report()


def state_of(model) -> dict[str, Any]:
    """A copy of every parameter and buffer."""
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def relative_differences(found: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    """How far `found` is from `expected`, tensor by tensor (same names): `worst` is the largest
    |found - expected| / (|expected| + scale) over every entry, scale being the largest |expected| among the
    tensors of its group (_group: all gradients of weights, all biases, all running variances...), so that
    worst <= tol is torch.allclose(rtol=tol, atol=tol * scale): a gradient that is zero in exact arithmetic
    (the projection's bias under batch norm) is judged against the gradients' size, not its own rounding noise.
    Infinities (illegal actions' logits) must sit in the same places; only finite entries are compared."""
    import torch

    pairs, scales = {}, {}
    for name, want in expected.items():
        have = found[name]
        if (want is None) != (have is None):
            return {"worst": float("inf"), "tensor": name, "max_abs": float("inf"), "bit_equal": False}
        if want is None:
            continue
        pairs[name] = (have, want)
        finite = want.detach().double().cpu()
        finite = finite[finite.isfinite()]
        scale = finite.abs().max().item() if finite.numel() else 0.0
        scales[_group(name)] = max(scales.get(_group(name), 0.0), scale)
    worst, worst_name, largest, equal = 0.0, None, 0.0, True
    for name, (have, want) in pairs.items():
        equal = equal and torch.equal(have, want)
        have, want = have.detach().double().cpu(), want.detach().double().cpu()
        if not torch.equal(have.isinf(), want.isinf()):
            return {"worst": float("inf"), "tensor": name, "max_abs": float("inf"), "bit_equal": False}
        finite = want.isfinite()
        gap = (have[finite] - want[finite]).abs()
        if not gap.numel() or not gap.max() > 0:
            continue
        error = (gap / (want[finite].abs() + scales[_group(name)])).max().item()
        largest = max(largest, gap.max().item())
        if error > worst:
            worst, worst_name = error, name
    return {"worst": worst, "tensor": worst_name, "max_abs": largest, "bit_equal": equal}


def loss_differences(found: list[float], expected: list[float]) -> list[float]:
    """|found - expected| / |expected| step by step (0 where equal, infinities included)."""
    return [0.0 if a == b else abs(a - b) / max(abs(b), 1e-30) for a, b in zip(found, expected, strict=True)]


def _group(name: str) -> tuple[str, str]:
    """A tensor's group: what its name says it is ("grad", "optimizer", "model", or nothing) and the kind of
    tensor ("weight", "bias", "running_var", "square_avg", "step", "logits"), so that no tensor is judged
    against another kind's scale (a step count against a square average)."""
    words = name.split(" ")
    return (words[0] if len(words) > 1 else "", words[-1].rsplit(".", 1)[-1])


@contextmanager
def deterministic(on: bool) -> Iterator[None]:
    import torch

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(call: Callable[[], Any], device) -> float:
    synchronize(device)
    start = time.perf_counter()
    call()
    synchronize(device)
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- part: device


@functools.cache
def machine() -> dict[str, Any]:
    """The card (or the CPU), torch, CUDA and Python a part ran with."""
    import torch

    found = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    cuda = torch.cuda.is_available()
    found["device_name"] = torch.cuda.get_device_name(0) if cuda else f"CPU ({_cpu_name()}), no CUDA"
    return found


def part_device(part: Part) -> None:
    import torch

    info: dict[str, Any] = {**machine(), "cpus": os.cpu_count(), "dry_run": part.dry, "packages": _package_versions()}
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info.update(
            capability=f"{properties.major}.{properties.minor}",
            memory_gib=round(properties.total_memory / 2**30, 1),
            devices=torch.cuda.device_count(),
            cudnn=torch.backends.cudnn.version(),
        )
    triton = info["packages"][KERNEL_COMPILER]
    info["summary"] = f"{info['device_name']}, torch {info['torch']}, CUDA {info['cuda']}, " + (
        f"Triton {triton}" if triton else "no Triton (the cells run as torch ops)"
    )
    part.record(**info)
    if part.dry:
        hidden = {name: importlib.util.find_spec(name) is None for name in NEVER_IMPORTED}
        part.check("import blocker active", all(hidden.values()), hidden=hidden)
    if not part.dry and not torch.cuda.is_available():
        raise NoCuda("no CUDA device visible to torch: the check needs a GPU (--dry-run rehearses it on the CPU)")


def _package_versions() -> dict[str, str | None]:
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in (*GPU_IMAGE, KERNEL_COMPILER, *WHEELS):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ----------------------------------------------------------------------------- part: equality

FLOAT64_TOLERANCE = 1e-10
FLOAT32_TOLERANCE = 1e-5


def part_equality(part: Part) -> None:
    """The fused encoder against the spec on the device, for every variant and source, in float64 and float32:
    logits, transition logits, transitions, every gradient and the batch-norm statistics after one step."""
    import torch

    from spinn.model.batch import make_batch
    from spinn.model.config import SPINNConfig

    examples, vocab_size = snli_examples(part.dev_file, part.sizes.equality_pairs)
    batch = make_batch(examples).to(part.device)
    worst = {torch.float64: 0.0, torch.float32: 0.0}
    for variant in TREE_VARIANTS:
        for source in SPINNConfig(**model_config(part.sizes, variant)).sources:
            for dtype, tolerance in ((torch.float64, FLOAT64_TOLERANCE), (torch.float32, FLOAT32_TOLERANCE)):
                found = _fused_against_spec(part, variant, source, dtype, batch, vocab_size)
                worst[dtype] = max(worst[dtype], found["worst"])
                held = found["transitions_equal"] and found["worst"] <= tolerance
                part.check(f"{variant} {source.value} {str(dtype).removeprefix('torch.')}", held, **found)
    cases = len(part.checks)
    held = sum(1 for passed in part.checks.values() if passed)
    kernel = _check_cell_kernel(part)
    part.record(
        worst_float64=worst[torch.float64],
        worst_float32=worst[torch.float32],
        summary=f"fused = spec in {held}/{cases} cases (worst relative: float64 "
        f"{worst[torch.float64]:.1e}, float32 {worst[torch.float32]:.1e}); cell kernel = torch ops: "
        + ("n/a" if kernel is None else "yes" if kernel else "NO"),
    )


CELL_KERNEL_TOLERANCE = {"float64": 1e-12, "float32": 2e-6}
"""The cells' Triton kernel against their torch ops, |kernel - ops| / (1 + |ops|): a few units in the last
place (its tanh is 2 sigmoid(2x) - 1)."""
TAPED = ("sig", "tanh_candidate", "tanh_c")
"""What a cell step records on its tape for the backward, besides its h and c."""


def _check_cell_kernel(part: Part) -> bool | None:
    """On CUDA, where the fused loops use it (so fused = spec above held with it): one step of each cell in
    the kernel against the torch ops, every buffer it writes, and that the kernel ran at all."""
    import torch

    from spinn.model import cells

    if part.device.type != "cuda" and not cells.KERNEL_ON_CPU:
        return part.check(
            "cell kernel = torch ops", None, note="no CUDA here (its tests run it in Triton's interpreter)"
        )
    generator = torch.Generator(device=part.device).manual_seed(SEED)
    d, details, held = part.sizes.speed_d, {}, True
    for cell in (cells.Reduce(d, part.sizes.d_tracker), cells.Tracker(d, part.sizes.d_tracker, predict=True)):
        for dtype in (torch.float64, torch.float32):
            cell = cell.to(part.device, dtype)
            ran, gaps = _cell_step_gaps(cell, generator)
            details[f"{type(cell).__name__} {str(dtype).removeprefix('torch.')}"] = {"kernel ran": ran, **gaps}
            held = held and ran and max(gaps.values()) <= CELL_KERNEL_TOLERANCE[str(dtype).removeprefix("torch.")]
    return part.check("cell kernel = torch ops", held, **details)


def _cell_step_gaps(cell, generator, rows: int = 37) -> tuple[bool, dict[str, float]]:
    """Whether the kernel ran a step of `cell` on random gates and children's c (its device and dtype), and
    how far each buffer it wrote is from the torch ops', |kernel - ops| / (1 + |ops|) at worst."""
    import torch

    from spinn.model import cell_kernel

    weight = cell.linear.weight
    gates = torch.randn(rows, cell.gate_width, device=weight.device, dtype=weight.dtype, generator=generator)
    children = [torch.randn(rows, cell.width, device=weight.device, dtype=weight.dtype, generator=generator)]
    children *= cell.n_children
    tapes, ran = [], False
    for kernel in (True, False):
        like = gates.new_empty(0)
        tape = cell.tape(like, [rows], [gates.new_empty(rows, cell.width)], [gates.new_empty(rows, cell.width)])
        pre = tape.gates[0].copy_(gates)  # as a fused loop's GEMMs write them: the tape's views read there
        if kernel:
            ran = cell_kernel.fused_step(pre, children, tape.out[0], cell.width)
        if not (kernel and ran):  # the torch ops (both tapes get written, whatever the kernel did)
            with cell_kernel.disabled():
                cell.step(pre, children, tape.out[0])
        tapes.append(tape)
    found, expected = tapes
    pairs = {buffer: (getattr(found, buffer), getattr(expected, buffer)) for buffer in TAPED}
    pairs.update(h=(found.out[0].h, expected.out[0].h), c=(found.out[0].c, expected.out[0].c))
    return ran, {
        key: ((mine - theirs).abs() / (1 + theirs.abs())).max().item() for key, (mine, theirs) in pairs.items()
    }


def _fused_against_spec(part: Part, variant: str, source, dtype, batch, vocab_size: int) -> dict[str, Any]:
    """One forward and backward of each encoder from the same weights (no dropout: both draw nothing)."""
    from spinn.model.spinn import spinn_loss

    fused = new_model(part.sizes, variant, vocab_size, part.device, embed_dropout=0.0, mlp_dropout=0.0)
    spec = new_model(part.sizes, variant, vocab_size, part.device, encoder="spec", embed_dropout=0.0, mlp_dropout=0.0)
    fused, spec = fused.to(dtype).train(), spec.to(dtype).train()
    spec.load_state_dict(fused.state_dict())
    outputs = {}
    for name, model in (("fused", fused), ("spec", spec)):
        output = model(batch, source=source, uniforms=_fixed_uniforms(batch, source, part.device))
        spinn_loss(output, batch, model.config).total.backward()
        tensors = {"logits": output.logits, "transition_logits": output.transition_logits}
        tensors.update({f"grad {key}": value.grad for key, value in model.named_parameters()})
        tensors.update({f"buffer {key}": value for key, value in model.named_buffers()})
        outputs[name] = (tensors, output.transitions)
    found = relative_differences(outputs["fused"][0], outputs["spec"][0])
    found["transitions_equal"] = bool((outputs["fused"][1] == outputs["spec"][1]).all())
    return found


def _fixed_uniforms(batch, source, device):
    """rl's sampled trees from fixed draws (a seeded CPU generator), the same for both encoders."""
    import torch

    from spinn.model.config import TransitionSource
    from spinn.model.policy import draw_uniforms

    if source is not TransitionSource.SAMPLED:
        return None
    generator = torch.Generator().manual_seed(SEED)
    cpu = torch.device("cpu")
    return draw_uniforms(batch.tokens.shape[0], batch.transitions.shape[1], cpu, generator).to(device)


# ----------------------------------------------------------------------------- part: graphs_train

ONE_STEP_TOLERANCE = 1e-5
TWENTY_STEPS_TOLERANCE = 1e-3


def part_graphs_train(part: Part) -> None:
    """For each variant: steps replayed from CUDA graphs against the same steps run eagerly, from the same
    weights and random state on the same batches (two shapes, alternating, so each is captured and replayed);
    then again under deterministic algorithms, where they must be bit-equal."""
    from spinn.bench import take_batches

    examples, vocab_size = snli_examples(part.dev_file, part.sizes.train_pairs)
    pair = _two_shapes(take_batches(examples, part.sizes.graph_batch, 20, SEED))
    batches = [pair[index % 2].to(part.device) for index in range(part.sizes.graph_steps)]
    for variant in TREE_VARIANTS:
        for exact in (False, True):
            try:
                with deterministic(exact):
                    graphed, eager = (_train_steps(part, variant, vocab_size, batches, graphs) for graphs in (1, 0))
            except RuntimeError as error:
                if not exact or "deterministic" not in str(error):
                    raise
                part.check(f"{variant} deterministic", None, refused=str(error).splitlines()[0])
                continue
            _check_replay(part, variant, exact, graphed, eager)
    _check_refused_capture(part, batches[0])
    failed = [name for name, passed in part.checks.items() if passed is False]
    part.record(
        summary=f"graphs = eager in {sum(1 for v in part.checks.values() if v)}/{len(part.checks)}"
        + (f"; differ: {', '.join(failed)}" if failed else "")
    )


def _check_refused_capture(part: Part, batch) -> None:
    """A step that cannot be captured (it reads a value to the host) runs eagerly, and its random ops still run
    after the failed capture: the failure must not leave the generators in capture mode."""
    import torch

    from spinn.inference.graphs import Graphs

    if part.device.type != "cuda":
        part.check("a refused capture runs eagerly", None, reason="no CUDA: nothing is captured")
        return

    def step(static) -> float:
        dropped = torch.nn.functional.dropout(static.tokens.float(), 0.5)  # (N, L): draws from the generator
        return dropped.sum().item()

    graphs = Graphs(step, part.device, warmup=0)
    sums = [graphs.run(batch) for _ in range(2)]  # the failed capture's eager run, then the refused shape's
    refused = graphs.report()["refused"]
    draws = sums[0] != sums[1]  # the generator still draws: the two dropout masks differ
    part.check("a refused capture runs eagerly", len(refused) == 1 and draws, refused=refused, sums=sums)


def _two_shapes(batches: list) -> list:
    """Two batches of different shapes (the first two there are), or the first twice when all share one."""
    from spinn.inference.graphs import shape_key

    first = batches[0]
    other = next((batch for batch in batches[1:] if shape_key(batch) != shape_key(first)), first)
    return [first, other]


def _train_steps(part: Part, variant: str, vocab_size: int, batches: list, graphs: bool) -> dict[str, Any]:
    """Losses after every step, the weights after the first and the last, and what the graphs did."""
    import torch

    step = new_trainer(new_model(part.sizes, variant, vocab_size, part.device), bool(graphs))
    torch.manual_seed(SEED)  # dropout, and rl's sampled trees, draw the same numbers in both runs
    losses, first = [], None
    for index, batch in enumerate(batches):
        step(batch, index)
        losses.append(step.metrics.read()["loss"])
        if index == 0:
            first = state_of(step.model)
    return {"losses": losses, "first": first, "last": state_of(step.model), "graphs": graph_report(step.graphs)}


def _check_replay(part: Part, variant: str, exact: bool, graphed: dict, eager: dict) -> None:
    losses = loss_differences(graphed["losses"], eager["losses"])
    first = relative_differences(graphed["first"], eager["first"])
    last = relative_differences(graphed["last"], eager["last"])
    detail = {"loss_relative": losses, "after_one": first, "after_all": last, "graphs": graphed["graphs"]}
    if exact:
        held = last["bit_equal"] and graphed["losses"] == eager["losses"]
        part.check(f"{variant} deterministic", held, **detail)
    else:
        held = max(losses[0], first["worst"]) <= ONE_STEP_TOLERANCE
        held = held and max(losses + [last["worst"]]) <= TWENTY_STEPS_TOLERANCE
        part.check(variant, held, **detail)


# ----------------------------------------------------------------------------- part: graphs_predict

PROBABILITY_TOLERANCE = 1e-6
PREDICT_CALLS = 3
"""predict with one graphed step this many times: warm-up, capture and replay reach every sentence width."""


def part_graphs_predict(part: Part) -> None:
    """predict() with inference graphs against eager predict(), every variant and inference source."""
    from spinn.inference.infer_step import InferStep
    from spinn.inference.predict import predict
    from spinn.model.config import TransitionSource

    examples, vocab_size = snli_examples(part.test_file, part.sizes.predict_pairs, labelled=False)
    size = part.sizes.predict_batch
    for variant in TREE_VARIANTS:
        model = new_model(part.sizes, variant, vocab_size, part.device).eval()
        for source in (s for s in model.config.sources if s is not TransitionSource.SAMPLED):
            eager = predict(model, examples, part.device, size, source, step=InferStep(model, source, graphs=False))
            graphed_step = InferStep(model, source, graphs=True)
            runs = [
                predict(model, examples, part.device, size, source, step=graphed_step) for _ in range(PREDICT_CALLS)
            ]
            found = [_same_predictions(run, eager) for run in runs]
            held = all(
                item["labels"] and item["trees"] and item["probabilities"] <= PROBABILITY_TOLERANCE for item in found
            )
            part.check(f"{variant} {source.value}", held, calls=found, graphs=graph_report(graphed_step.encoder_graphs))
    part.record(
        summary=f"graphs = eager predict in {sum(1 for v in part.checks.values() if v)}/{len(part.checks)} cases"
    )


def _same_predictions(found, expected) -> dict[str, Any]:
    import numpy

    return {
        "labels": bool((found.labels == expected.labels).all()),
        "trees": found.premise_transitions == expected.premise_transitions
        and found.hypothesis_transitions == expected.hypothesis_transitions,
        "probabilities": float(numpy.abs(found.probabilities - expected.probabilities).max()),
    }


# ----------------------------------------------------------------------------- training without MLflow


class MetricsLog:
    """Where the training loop logs when MLflow is not there: the loop takes any object with log_metrics."""

    def __init__(self):
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append((step, dict(metrics)))


@dataclass(frozen=True)
class Prepared:
    train: Path
    dev: Path
    vocab: Path
    vectors: Path
    embeddings: Path  # the aligned vectors' cache


VECTOR_WORDS = 500
"""Words given a vector in the check's GloVe-format file; the rest get seeded random ones (oov: random)."""


def prepared(part: Part) -> Prepared:
    """SNLI dev as the training split and SNLI test as the dev split, prepared as `spinn prepare` does, their
    vocabulary, and a GloVe-format vector file (the GPU image has no packaged GloVe); made once per run."""
    folder = part.work / "prepared"
    found = Prepared(
        folder / "train.parquet",
        folder / "dev.parquet",
        folder / "vocab.json",
        folder / "vectors.txt",
        folder / "cache",
    )
    if found.vectors.exists():
        return found
    from spinn.data.prepare import PrepareSettings, prepare
    from spinn.data.vocab import vocab_stage

    sources = part.work / "sources"
    settings = PrepareSettings(workers=1)
    prepare(first_lines(part.dev_file, part.sizes.train_pairs, sources), folder, settings, split="train")
    prepare(first_lines(part.test_file, part.sizes.eval_pairs, sources), folder, settings, split="dev")
    vocabulary, _ = vocab_stage(found.train)
    _write_vectors(found.vectors, vocabulary.tokens[2 : 2 + VECTOR_WORDS], part.sizes.d)
    return found


def first_lines(path: Path, count: int | None, folder: Path) -> Path:
    """The SNLI file itself, or its first `count` lines as a plain .jsonl of the same name in `folder`."""
    if count is None:
        return path
    target = folder / f"{path.name.removesuffix('.gz').removesuffix('.jsonl')}-{count}.jsonl"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with open_text(path) as source, open(target.with_suffix(".tmp"), "w") as copy:
            for _, line in zip(range(count), source, strict=False):
                copy.write(line)
        target.with_suffix(".tmp").replace(target)
    return target


def open_text(path: Path):
    import gzip

    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def _write_vectors(path: Path, words: Iterable[str], dimension: int) -> None:
    import numpy

    generator = numpy.random.default_rng(SEED)
    with open(path, "w") as file:
        for word in words:
            values = " ".join(f"{value:.5f}" for value in generator.normal(0, dimension**-0.5, dimension))
            file.write(f"{word} {values}\n")


WARMUP_BATCHES = 10


def train_config(part: Part, files: Prepared, variant: str, steps: int, batch: int, every: int, **changes: Any):
    """spinn train's settings for a short run: the variant's paper preset at the part's size."""
    from spinn.training.train_config import TrainConfig

    model = {key: value for key, value in model_config(part.sizes, variant).items() if key != "d_embed"}
    values = dict(
        model=model,
        embeddings={"source": str(files.vectors)},
        batch_size=batch,
        max_steps=steps,
        eval_every=every,
        checkpoint_every=every,
        log_every=min(10, every),
        device=part.device.type,
        seed=SEED,
        warmup_pairs=WARMUP_BATCHES * batch,  # README's large-batch recipe: the paper's rate, scaled up, warmed up
    )
    return TrainConfig.build({**values, **changes})


def train_without_tracking(part: Part, files: Prepared, config, folder: Path, resume: bool = False):
    """What `spinn train` runs, MLflow aside (the GPU image has none): the run built, resumed from last.pt
    when asked, the loop with its checkpoints, dev evaluations and metric reads."""
    from spinn.training.loop import loop
    from spinn.training.resume import resume_run
    from spinn.training.state import TrainState

    run = built_run(files, config, folder)
    state = resume_run(run) if resume else TrainState()
    log = MetricsLog()
    loop(run, state, log, progress=False)
    return run, state, log


def built_run(files: Prepared, config, folder: Path):
    """The training run `spinn train` builds, in `folder`, before any step; what earlier runs of the part left
    (their graphs and buffers refer to each other) is collected first, so they do not share the GPU's memory."""
    import gc

    from spinn.training.build import build_run

    gc.collect()
    folder.mkdir(parents=True, exist_ok=True)
    return build_run(files.train, files.dev, config, folder, files.vocab, files.embeddings, progress=False)


# ----------------------------------------------------------------------------- part: checkpoint


def checkpoint_path(part: Part) -> Path:
    return part.work / "checkpoint" / "last.pt"


def part_checkpoint(part: Part) -> None:
    """A spinn model (it labels without a parser) trained on SNLI dev for the label parts."""
    files = prepared(part)
    sizes = part.sizes
    config = train_config(part, files, "spinn", sizes.checkpoint_steps, sizes.checkpoint_batch, sizes.checkpoint_steps)
    started = time.perf_counter()
    run, state, log = train_without_tracking(part, files, config, checkpoint_path(part).parent)
    seconds = time.perf_counter() - started
    part.check("checkpoint written", checkpoint_path(part).exists())
    part.record(
        steps=state.step,
        dev_accuracy=state.best_dev_accuracy,
        seconds=seconds,
        logged=log.logged[-3:],
        train_graphs=graph_report(run.step.graphs),
        dev_graphs=graph_report(run.dev_infer.encoder_graphs),
        summary=f"spinn {sizes.d}D, {state.step} steps of {config.batch_size}: dev accuracy "
        f"{state.best_dev_accuracy:.3f} in {seconds:.1f} s",
    )


def trained_checkpoint(part: Part) -> Path:
    path = checkpoint_path(part)
    if not path.exists():
        raise Skip("no checkpoint: part checkpoint made none (run it first: --only checkpoint,PART)")
    return path


# ----------------------------------------------------------------------------- part: cuda_cpu_labels


def part_cuda_cpu_labels(part: Part) -> None:
    """The checkpoint's labels, trees and probabilities of the first SNLI test pairs, on the device and on the
    CPU (whose inference runs the CPU loop, spinn/model/thin_stack_infer.py); where they differ, how close the
    CPU's two best classes were."""
    import torch

    from spinn.data.pairs import encode_pairs, read_raw_pairs
    from spinn.inference.predict import predict
    from spinn.model.config import TransitionSource
    from spinn.model.loading import load_model

    path = trained_checkpoint(part)
    cpu, device = load_model(path, torch.device("cpu")), load_model(path, part.device)
    examples = encode_pairs(read_raw_pairs(part.test_file)[: part.sizes.labels_pairs], cpu.vocabulary)
    note = None if part.device.type == "cuda" else "no CUDA: the CPU against itself"
    for source in (TransitionSource.GREEDY, TransitionSource.GOLD):
        on_cpu = predict(cpu.model, examples, torch.device("cpu"), 256, source)
        on_device = predict(device.model, examples, part.device, 256, source)
        found = _agreement(on_cpu, on_device)
        part.check(f"{source.value} labels agree", found["agreement"] == 1.0, note=note, **found)
    shares = ", ".join(f"{name} {part.result['details'][name]['agreement']:.2%}" for name in part.checks)
    part.record(pairs=len(examples), summary=f"{len(examples)} SNLI test pairs, CUDA against CPU: {shares}")


def _agreement(cpu, device) -> dict[str, Any]:
    import numpy

    same = cpu.labels == device.labels
    trees = [
        a == b and c == d
        for a, b, c, d in zip(
            cpu.premise_transitions,
            device.premise_transitions,
            cpu.hypothesis_transitions,
            device.hypothesis_transitions,
            strict=True,
        )
    ]
    ordered = numpy.sort(cpu.probabilities, axis=1)
    differing = [
        {
            "pair": int(index),
            "cpu": cpu.probabilities[index].tolist(),
            "cuda": device.probabilities[index].tolist(),
            "cpu_margin": float(ordered[index, -1] - ordered[index, -2]),
            "same_trees": trees[index],
        }
        for index in numpy.flatnonzero(~same)[:20]
    ]
    return {
        "agreement": float(same.mean()),
        "tree_agreement": sum(trees) / len(trees),
        "max_probability_difference": float(numpy.abs(cpu.probabilities - device.probabilities).max()),
        "differing": differing,
    }


# ----------------------------------------------------------------------------- part: resume


def part_resume(part: Part) -> None:
    """Straight to N steps, and N/2 + resume from last.pt to N, spinn with dropout (the random state must come
    back): bit-identical under deterministic algorithms; otherwise no further apart than two straight runs."""
    files = prepared(part)
    steps, half = part.sizes.resume_steps, part.sizes.resume_steps // 2
    for exact in (False, True):
        label = "deterministic" if exact else "default"
        try:
            with deterministic(exact):
                straight, second, resumed = _resume_pair(part, files, label, steps, half, again=not exact, calm=exact)
        except RuntimeError as error:
            if not exact or "deterministic" not in str(error):
                raise
            part.check("deterministic: bit-identical", None, refused=str(error).splitlines()[0])
            continue
        apart = relative_differences(resumed, straight)
        if exact:
            part.check("deterministic: bit-identical", apart["bit_equal"], resumed_vs_straight=apart)
        else:
            baseline = relative_differences(second, straight)
            held = apart["bit_equal"] or apart["worst"] <= 2 * baseline["worst"]
            part.check(
                "default: within two straight runs", held, resumed_vs_straight=apart, straight_vs_straight=baseline
            )
    if part.device.type == "cuda":  # the same pair without graphs: is a difference the graphs' or the device's?
        with deterministic(True):
            straight, _, resumed = _resume_pair(part, files, "eager", steps, half, graphs=False)
        apart = relative_differences(resumed, straight)
        part.check("deterministic, no graphs: bit-identical", apart["bit_equal"], resumed_vs_straight=apart)
    part.record(
        summary=f"{steps} straight against {half} + resume: "
        + ", ".join(
            f"{name}: {'n/a' if held is None else 'yes' if held else 'NO'}" for name, held in part.checks.items()
        )
    )


def _resume_pair(
    part: Part,
    files: Prepared,
    label: str,
    steps: int,
    half: int,
    graphs: bool = True,
    again: bool = False,
    calm: bool = False,
) -> tuple[dict, dict | None, dict]:
    """Straight to `steps` (a second time when `again`), and `half` + resume to `steps`: the runs' end states.
    Also checks that the resumed run starts from the state the stopped one ended in (weights, optimizer,
    rates, random streams), and records the first step whose loss differs from the straight run's: together
    they tell a state the checkpoint lost from a step that runs differently after a resume. `calm`: also
    straight with the dev evaluation at `half` left out (the resumed run has none there either), which must
    end bit-equal: an evaluation that touched training would show here."""
    straight, straight_losses = _resume_run(part, files, f"{label}-straight", steps, half, graphs=graphs)
    second = _resume_run(part, files, f"{label}-straight-again", steps, half, graphs=graphs)[0] if again else None
    if calm:
        calmer, calm_losses = _resume_run(part, files, f"{label}-calm", steps, half, graphs=graphs, eval_every=steps)
        apart = relative_differences(calmer, straight)
        part.check(f"{label}: evaluation leaves training as it was", apart["bit_equal"], calm_vs_straight=apart)
        part.record(**{f"first step apart {label} calm": first_step_apart(straight_losses, calm_losses)})
    stopped, _ = _resume_run(part, files, f"{label}-resumed", half, half, graphs=graphs)
    start = relative_differences(_resumed_start(part, files, f"{label}-resumed", steps, half, graphs), stopped)
    part.check(f"{label}: resumed from the stopped state", start["bit_equal"], started_vs_stopped=start)
    resumed, resumed_losses = _resume_run(part, files, f"{label}-resumed", steps, half, resume=True, graphs=graphs)
    part.record(**{f"first step apart {label}": first_step_apart(straight_losses, resumed_losses)})
    return straight, second, resumed


def _resume_config(part: Part, files: Prepared, steps: int, every: int, graphs: bool, **changes: Any):
    return train_config(
        part,
        files,
        "spinn",
        steps,
        part.sizes.resume_batch,
        every,
        graphs=graphs,
        log_every=RESUME_LOG_EVERY,
        **changes,
    )


def _resume_run(
    part: Part,
    files: Prepared,
    name: str,
    steps: int,
    every: int,
    resume: bool = False,
    graphs: bool = True,
    **changes: Any,
) -> tuple[dict, dict[int, float]]:
    """One training run's state after it stopped (`training_state`) and its logged loss by step (also in the
    part's result); `changes`: other training settings."""
    config = _resume_config(part, files, steps, every, graphs, **changes)
    run, state, log = train_without_tracking(part, files, config, part.work / "resume" / name, resume=resume)
    losses = {step: metrics["train_loss"] for step, metrics in log.logged if "train_loss" in metrics}
    part.record(**{f"losses {name}{' resumed' if resume else ''}": losses, f"steps {name}": state.step})
    return training_state(run), losses


def _resumed_start(part: Part, files: Prepared, name: str, steps: int, every: int, graphs: bool) -> dict:
    """The state a resumed run starts from: built as `_resume_run` builds it, last.pt loaded, no step taken."""
    from spinn.training.resume import resume_run

    run = built_run(files, _resume_config(part, files, steps, every, graphs), part.work / "resume" / name)
    resume_run(run)
    return training_state(run)


def training_state(run) -> dict:
    """What a resumed run must get back, copied to the CPU: weights and buffers, the optimizer's state and
    learning rates, every random stream."""
    import torch

    from spinn.model.checkpoint import rng_states

    tensors = {f"model {key}": value.detach().cpu().clone() for key, value in run.model.state_dict().items()}
    for index, values in run.optimizer.state_dict()["state"].items():
        state = {f"optimizer {index} {key}": torch.as_tensor(value).cpu().clone() for key, value in values.items()}
        tensors.update(state)
    for index, group in enumerate(run.optimizer.param_groups):
        tensors[f"optimizer {index} lr"] = torch.as_tensor(group["lr"]).detach().cpu().clone()
    streams = rng_states()
    tensors["rng torch"] = streams["torch"].clone()
    tensors["rng python"] = torch.tensor(streams["python"][1], dtype=torch.int64)
    tensors.update({f"rng cuda {device}": state.clone() for device, state in enumerate(streams.get("cuda", []))})
    return tensors


def first_step_apart(straight: dict[int, float], resumed: dict[int, float]) -> int | None:
    """The first step both runs logged whose loss differs (None: none does)."""
    return next((step for step in sorted(set(straight) & set(resumed)) if straight[step] != resumed[step]), None)


# ----------------------------------------------------------------------------- part: speed


@dataclass(frozen=True)
class SpeedRow:
    role: str  # a key of Sizes.speed: its warm-up and timed steps
    mode: str
    large: bool  # the large batch (1024) or the small one (256)
    amp: bool = False
    goal: int | None = None
    """pairs/s the issue asks for on an H100 (PI 300D)."""
    cell_kernel: bool = True
    """False: the cells' torch ops instead of their Triton kernel (spinn/model/cell_kernel.py), side by side."""

    def label(self, sizes: Sizes) -> str:
        batch = sizes.speed_large_batch if self.large else sizes.speed_batch
        label = f"{self.mode} {batch}" + ("" if self.mode != "infer" else " bf16" if self.amp else " fp32")
        return label + ("" if self.cell_kernel else " torch cells")


SPEED_ROWS = (
    SpeedRow("train", "train", large=False, goal=40_000),
    SpeedRow("train", "train", large=False, cell_kernel=False),
    SpeedRow("train_large", "train", large=True, goal=80_000),
    SpeedRow("infer", "infer", large=True, goal=200_000),
    SpeedRow("infer", "infer", large=True, cell_kernel=False),
    SpeedRow("infer", "infer", large=True, amp=True, goal=200_000),
    SpeedRow("loop", "loop", large=False),
)
LOOP_SHARE_GOAL = 0.9
"""The real loop (loader thread, metric reads) against bench train at the same batch."""
BUSY_GOAL = 0.7
"""The share of a training step's wall time some kernel runs."""


def part_speed(part: Part) -> None:
    """spinn bench's train, infer and loop modes on PI 300D, then a profile of the
    training step: kernels per step, the GPU's busy share, aten ops and host syncs."""
    sizes = part.sizes
    found: dict[str, dict[str, Any]] = {}
    from spinn.model import cell_kernel

    for row in SPEED_ROWS:
        batch = sizes.speed_large_batch if row.large else sizes.speed_batch
        with nullcontext() if row.cell_kernel else cell_kernel.disabled():
            found[row.label(sizes)] = _bench(part, row.role, mode=row.mode, batch_size=batch, amp=row.amp)
        part.record(benches=found, rows=_speed_rows(part, found))
    profiled = not part.dry  # the kernel profile needs CUDA; the dry run counts aten ops only
    profile = _bench(part, "profile", mode="train", batch_size=sizes.speed_batch, count_ops=True, profile=profiled)
    found[f"profile {sizes.speed_batch}"] = profile
    _speed_checks(part, found)
    part.record(benches=found, rows=_speed_rows(part, found), summary=_speed_summary(part, found))


def _bench(part: Part, steps: str, **settings: Any) -> dict[str, Any]:
    from spinn.bench import BenchSettings, run_bench

    warmup, timed_steps = part.sizes.speed[steps]
    d = part.sizes.speed_d
    common = dict(corpus=part.dev_file, pairs=part.sizes.epoch_pairs, variant="pi", d_hidden=d, d_embed=d)
    common.update(d_tracker=part.sizes.d_tracker, device=part.device.type, warmup=warmup, steps=timed_steps, seed=SEED)
    return run_bench(BenchSettings(**{**common, **settings}))


def _speed_rows(part: Part, found: dict[str, dict[str, Any]]) -> list[str]:
    """One line per bench: pairs/s, ms per step, the epoch it makes, peak memory, and (GPU) its goal."""
    goals = {row.label(part.sizes): row.goal for row in SPEED_ROWS}
    width = max(map(len, found))
    rows = []
    for label, result in found.items():
        rate, goal = result["pairs_per_second"], goals.get(label)
        met = "" if goal is None or part.dry else f"  goal >= {goal:,}: {'met' if rate >= goal else 'NOT met'}"
        rows.append(
            f"{label:<{width}} {rate:>10,.0f} pairs/s {result['seconds_per_step'] * 1000:>7.1f} ms/step "
            f"epoch {part.sizes.epoch_pairs / rate:>7.1f} s  peak {result['peak_memory_bytes'] / 2**20:>6.0f} MiB{met}"
        )
    return rows


def _speed_checks(part: Part, found: dict[str, dict[str, Any]]) -> None:
    """Goals are checked on the GPU only: a dry run's figures are of a tiny model on a shared CPU."""
    small = part.sizes.speed_batch
    loop_share = found[f"loop {small}"]["pairs_per_second"] / found[f"train {small}"]["pairs_per_second"]
    profile = found[f"profile {small}"]
    part.record(loop_share=loop_share, gpu_busy_share=profile.get("gpu_busy_share"))
    if part.dry:
        part.check("goals", None, note="dry run: no goals on a CPU")
        return
    for row in SPEED_ROWS:
        if row.goal is not None:
            label = row.label(part.sizes)
            part.check(f"{label} >= {row.goal:,} pairs/s", found[label]["pairs_per_second"] >= row.goal)
    part.check(f"loop >= {LOOP_SHARE_GOAL:.0%} of bench", loop_share >= LOOP_SHARE_GOAL)
    part.check(f"GPU busy >= {BUSY_GOAL:.0%}", profile["gpu_busy_share"] >= BUSY_GOAL)


def _speed_summary(part: Part, found: dict[str, dict[str, Any]]) -> str:
    profile = found[f"profile {part.sizes.speed_batch}"]
    busy, kernels = profile.get("gpu_busy_share"), profile.get("kernels_per_step")
    return (
        f"loop/bench {part.result['loop_share']:.0%}, GPU busy {'n/a' if busy is None else f'{busy:.0%}'}, "
        f"kernels/step {'n/a' if kernels is None else f'{kernels:.0f}'}, "
        f"aten ops/transition step {profile['ops_per_transition_step']:.1f}, "
        f"host syncs/step {profile['syncs_per_step']:.0f}"
    )


# ----------------------------------------------------------------------------- part: label


def part_label(part: Part) -> None:
    """`spinn label --parser model` (the command itself, in this process, so the GPU's peak memory can be read)
    over N raw pairs: SNLI test, then repeats with new ids and each sentence's words shuffled, so that the
    model really encodes N pairs' sentences (predict encodes each distinct sentence once). Then again at
    LARGE_LABEL_BATCH pairs per model batch: whether the GPU labels faster with fewer, larger batches."""
    path = trained_checkpoint(part)
    pairs, distinct = _label_input(part, part.work / "label" / "pairs.jsonl")
    default = _label_run(part, pairs, path, "labels")
    large = _label_run(part, pairs, path, f"labels-{LARGE_LABEL_BATCH}", "--batch-size", str(LARGE_LABEL_BATCH))
    if not part.dry:
        part.check("labelling >= 20,000 pairs/s", default["pairs_per_second"] >= 20_000)
    part.record(
        **default,
        pairs=part.sizes.label_pairs,
        distinct_sentences=distinct,
        large_batch=large,
        summary=f"{part.sizes.label_pairs:,} pairs ({distinct:,} distinct sentences), end to end in "
        f"{default['seconds']:.1f} s: {_label_figures(default)}; at --batch-size {LARGE_LABEL_BATCH:,}: "
        f"{_label_figures(large)}",
    )


def _label_run(part: Part, pairs: Path, model: Path, name: str, *options: str) -> dict[str, Any]:
    """One `spinn label` of `pairs` into a new output: its command, seconds, pairs/s, peak GPU memory and report."""
    import io
    from contextlib import redirect_stdout

    import pyarrow.parquet as pq
    import torch

    from spinn.cli import main as spinn
    from spinn.parsing.parser_settings import TOKENIZERS_BESIDE_A_GPU

    output = part.work / "label" / f"{name}.parquet"
    arguments = ["label", str(pairs), "--model", str(model), "--output", str(output), "--parser", "model"]
    arguments += ["--device", part.device.type, "--no-progress", *options]
    if part.device.type == "cpu":  # the dry run rehearses the tokenizer workers that auto starts beside a GPU
        arguments += ["--workers", str(TOKENIZERS_BESIDE_A_GPU)]
    if part.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    printed = io.StringIO()
    started = time.perf_counter()
    with redirect_stdout(printed):
        spinn.main(args=arguments, prog_name="spinn", standalone_mode=False)
    seconds = time.perf_counter() - started
    labelled = pq.read_metadata(output).num_rows
    part.check(f"every pair labelled ({name})", labelled == part.sizes.label_pairs, labelled=labelled)
    return {
        "command": "spinn " + " ".join(arguments),
        "seconds": seconds,
        "pairs_per_second": part.sizes.label_pairs / seconds,
        "peak_gpu_memory_bytes": torch.cuda.max_memory_allocated() if part.device.type == "cuda" else None,
        "report": printed.getvalue().splitlines(),
    }


def _label_figures(run: dict[str, Any]) -> str:
    """End to end and the model stage alone (from the run's report): the second run finds the process warm
    (imports, CUDA, the workers' start), so only the model stages compare fairly (each captures its shapes)."""
    peak = run["peak_gpu_memory_bytes"]
    memory = "" if peak is None else f", peak GPU memory {peak / 2**20:,.0f} MiB"
    model = next((found[1] for line in run["report"] if (found := MODEL_STAGE.search(line))), "n/a")
    return f"{run['pairs_per_second']:,.0f} pairs/s (model stage {model}){memory}"


def _label_input(part: Part, path: Path) -> tuple[Path, int]:
    """A JSON-lines file of label_pairs raw pairs (pair_id, premise, hypothesis) and its distinct sentences."""
    import random

    with open_text(part.test_file) as file:
        originals = [(row["sentence1"], row["sentence2"]) for row in map(json.loads, file)]
    shuffler = random.Random(SEED)
    sentences: set[str] = set()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as file:
        for number in range(part.sizes.label_pairs):
            repeat, (premise, hypothesis) = divmod(number, len(originals))[0], originals[number % len(originals)]
            if repeat:
                premise, hypothesis = (_shuffled(text, shuffler) for text in (premise, hypothesis))
            sentences.update((premise, hypothesis))
            file.write(json.dumps({"pair_id": f"p{number}", "premise": premise, "hypothesis": hypothesis}) + "\n")
    return path, len(sentences)


def _shuffled(text: str, shuffler) -> str:
    words = text.split()
    shuffler.shuffle(words)
    return " ".join(words)


# ----------------------------------------------------------------------------- part: nccl


def part_nccl(part: Part) -> None:
    """20 steps in one process, then the same steps under `torchrun --nproc-per-node 1` in
    DistributedDataParallel over nccl (gloo on a CPU), captured in CUDA graphs after DDP's warm-up: equal."""
    import torch

    single = _distributed_steps(part, distributed=False)
    folder = part.work / "nccl"
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    command += [str(Path(__file__).resolve()), "--rank-of", "nccl", "--work", str(part.work), "--data", str(part.data)]
    command += ["--dry-run"] if part.dry else []
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    part.record(
        torchrun_exit=finished.returncode,
        torchrun_output=finished.stdout.splitlines()[-20:],
        torchrun_errors=finished.stderr.splitlines()[-TORCHRUN_ERROR_LINES:],
    )
    if finished.returncode != 0:
        raise RuntimeError(f"torchrun exited {finished.returncode}: {finished.stderr.strip().splitlines()[-5:]}")
    rank = torch.load(folder / "rank0.pt", weights_only=True)
    facts = json.loads((folder / "rank0.json").read_text())
    apart = relative_differences(rank["state"], single["state"])
    losses = loss_differences(rank["losses"], single["losses"])
    part.record(rank=facts, single_graphs=single["graphs"], loss_relative=losses, apart=apart)
    part.check(
        "distributed = one process",
        apart["bit_equal"] or max(losses + [apart["worst"]]) <= TWENTY_STEPS_TOLERANCE,
        worst=apart["worst"],
        tensor=apart["tensor"],
    )
    if part.device.type == "cuda":  # equal steps prove little if the distributed one ran eagerly
        graphs = facts["graphs"]
        part.check("the distributed step was captured", graphs["captured"] > 0 and not graphs["refused"], **graphs)
    part.record(
        summary=f"{facts['backend']} (torchrun, 1 process; spinn's own setup initialized a group: "
        f"{facts['initialized_by_setup']}) against one process over {len(losses)} steps: worst relative "
        f"{apart['worst']:.1e}, bit-equal {apart['bit_equal']}"
    )


def run_rank(arguments: argparse.Namespace) -> int:
    """torchrun's rank: spinn's own setup first (which starts no process group for a world of one), then a
    group of its own so that nccl, DDP and its all-reduce inside the captured step really run."""
    import torch
    import torch.distributed as dist

    from spinn.training import distributed

    part = Part(arguments)
    _quiet_and_small(part)
    topology = distributed.Topology.from_environment()
    device = distributed.setup(topology, part.device.type)
    initialized_by_setup = dist.is_initialized()
    if not initialized_by_setup:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        found = _distributed_steps(part, distributed=True)
        folder = part.work / "nccl"
        torch.save({"state": found["state"], "losses": found["losses"]}, folder / "rank0.pt")
        facts = {"backend": dist.get_backend(), "world": dist.get_world_size(), "graphs": found["graphs"]}
        write_json(folder / "rank0.json", {**facts, "initialized_by_setup": initialized_by_setup})
    finally:
        distributed.teardown()
    return 0


def _distributed_steps(part: Part, distributed: bool) -> dict[str, Any]:
    """nccl_steps training steps of PI on batches of one shape (so DDP's 11 warm-up steps end in a capture)."""
    import torch

    from spinn.bench import take_batches
    from spinn.inference.graphs import shape_key

    examples, vocab_size = snli_examples(part.dev_file, part.sizes.train_pairs)
    batches = take_batches(examples, part.sizes.nccl_batch, 3 * part.sizes.nccl_steps, SEED)
    key = max({shape_key(batch) for batch in batches}, key=lambda k: sum(shape_key(b) == k for b in batches))
    same = [batch for batch in batches if shape_key(batch) == key]
    model = new_model(part.sizes, "pi", vocab_size, part.device)
    network = None
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [part.device.index or 0] if part.device.type == "cuda" else None
        network = DistributedDataParallel(model, device_ids=device_ids)
    step = new_trainer(model, graphs=True, network=network)
    torch.manual_seed(SEED)
    losses = []
    for index in range(part.sizes.nccl_steps):
        step(same[index % len(same)].to(part.device), index)
        losses.append(step.metrics.read()["loss"])
    return {
        "state": {k: v.cpu() for k, v in state_of(model).items()},
        "losses": losses,
        "graphs": graph_report(step.graphs),
    }


# ----------------------------------------------------------------------------- part: capture


def part_capture(part: Part) -> None:
    """What the CUDA graphs do at batch 256 over real batches: the training step of pi, spinn and rl (rl: its
    trees sampled on the device), the pair inference step of pi (gold) and spinn (greedy, stacks on the device),
    and predict's sentence encoder over SNLI test."""
    from spinn.bench import take_batches
    from spinn.inference.infer_step import InferStep
    from spinn.inference.predict import predict
    from spinn.model.config import TransitionSource

    sizes = part.sizes
    examples, vocab_size = snli_examples(part.dev_file, sizes.train_pairs)
    batches = [
        batch.to(part.device) for batch in take_batches(examples, sizes.speed_batch, sizes.capture_batches, SEED)
    ]
    reports: dict[str, Any] = {}
    for variant in ("pi", "spinn", "rl"):
        step = new_trainer(new_model(sizes, variant, vocab_size, part.device), graphs=True)
        seconds = timed(lambda step=step: [step(batch, index) for index, batch in enumerate(batches)], part.device)
        reports[f"train {variant}"] = {**graph_report(step.graphs), "seconds": seconds}
        part.record(reports=reports)
    for variant, source in (("pi", TransitionSource.GOLD), ("spinn", TransitionSource.GREEDY)):
        infer = InferStep(new_model(sizes, variant, vocab_size, part.device), source, graphs=True)
        seconds = timed(lambda infer=infer: [infer(batch) for batch in batches], part.device)
        reports[f"infer {variant} {source.value}"] = {**graph_report(infer.graphs), "seconds": seconds}
        part.record(reports=reports)
    test, test_vocab = snli_examples(part.test_file, sizes.capture_predict_pairs, labelled=False)
    model = new_model(sizes, "spinn", test_vocab, part.device)
    infer = InferStep(model, TransitionSource.GREEDY, graphs=True)
    seconds = timed(
        lambda: predict(model, test, part.device, sizes.speed_batch, TransitionSource.GREEDY, step=infer), part.device
    )
    reports["predict spinn greedy"] = {**graph_report(infer.encoder_graphs), "seconds": seconds}
    for name, report in reports.items():
        if "note" not in report:
            reasons = [refusal["reason"] for refusal in report["refused"]]
            part.check(f"{name}: no shape refused", not reasons, reasons=reasons)
    part.record(reports=reports, rows=_capture_rows(reports), summary=_capture_summary(reports))


def _capture_rows(reports: dict[str, Any]) -> list[str]:
    return [
        f"{name:<22} {report['captured']:>3}/{report['shapes']:<3} shapes captured, {len(report['refused'])} refused, "
        f"{report['warming_up']} warming up, {report['over_limit']} past the limit; capture "
        f"{report['capture_seconds']:.1f} s of {report['seconds']:.1f} s"
        for name, report in reports.items()
        if "note" not in report
    ]


def _capture_summary(reports: dict[str, Any]) -> str:
    notes = {report["note"] for report in reports.values() if "note" in report}
    if notes:
        return f"{'; '.join(sorted(notes))} ({len(reports)} kinds of step run eagerly)"
    refused = sorted({item["reason"] for report in reports.values() for item in report["refused"]})
    captured = sum(report["captured"] for report in reports.values())
    shapes = sum(report["shapes"] for report in reports.values())
    seconds = sum(report["capture_seconds"] for report in reports.values())
    return f"{captured}/{shapes} shapes captured in {seconds:.1f} s" + (
        f"; refused: {' | '.join(refused)}" if refused else "; none refused"
    )


# ----------------------------------------------------------------------------- part: encoders


def part_encoders(part: Part) -> None:
    """The fused encoder against the spec encoder, training PI on one batch of 256 pairs: with the step's CUDA
    graphs, eagerly, and with torch.compile'd forward passes (compile time apart). The verdict the design asks
    for: is the hand-written backward at least 1.5x faster than the spec at batch 256?"""
    from spinn.bench import take_batches

    sizes = part.sizes
    examples, vocab_size = snli_examples(part.dev_file, sizes.train_pairs)
    batch = take_batches(examples, sizes.speed_batch, 1, SEED)[0].to(part.device)
    timings: dict[str, Any] = {"transition_steps": batch.transitions.shape[1], "pairs": batch.pairs}
    for encoder in ("fused", "spec"):
        for mode in ("graphs", "eager"):
            timings[f"{encoder} {mode}"] = _time_encoder(part, encoder, mode, batch, vocab_size)
            part.record(timings=timings, summary=_encoder_verdict(timings))
    for encoder in ("spec", "fused"):
        if part.dry:
            timings[f"{encoder} compiled"] = {
                "skipped": "torch.compile takes minutes on two CPU cores; the GPU run compiles"
            }
        else:
            timings[f"{encoder} compiled"] = _time_encoder(part, encoder, "compiled", batch, vocab_size)
        part.record(timings=timings, summary=_encoder_verdict(timings))


def _time_encoder(part: Part, encoder: str, mode: str, batch, vocab_size: int) -> dict[str, Any]:
    import torch

    from spinn.inference.graphs import refusal

    sizes = part.sizes
    model = new_model(
        sizes, "pi", vocab_size, part.device, encoder=encoder, d_embed=sizes.speed_d, d_hidden=sizes.speed_d
    )
    network = torch.compile(model) if mode == "compiled" else None
    step = new_trainer(model, graphs=mode == "graphs", network=network)
    warmup, steps = sizes.encoder_steps
    try:
        first = timed(lambda: step(batch, 0), part.device)
        timed(lambda: [step(batch, index) for index in range(1, warmup + 1)], part.device)
        seconds = timed(lambda: [step(batch, index) for index in range(steps)], part.device)
    except Exception as error:  # torch.compile may refuse the fused encoder's custom backward: say so, go on
        return {"failed": refusal(error)}
    found = {
        "pairs_per_second": batch.pairs * steps / seconds,
        "ms_per_step": 1000 * seconds / steps,
        "first_step_s": first,
    }
    if mode == "graphs":
        found["graphs"] = graph_report(step.graphs)
    return found


def _encoder_verdict(timings: dict[str, Any]) -> str:
    def rate(name: str) -> float | None:
        return timings.get(name, {}).get("pairs_per_second")

    def ratio(a: str, b: str) -> str:
        return f"{rate(a) / rate(b):.2f}x" if rate(a) and rate(b) else "n/a"

    return (
        f"fused/spec at batch {timings['pairs']}: graphs {ratio('fused graphs', 'spec graphs')}, eager "
        f"{ratio('fused eager', 'spec eager')}, fused graphs/spec compiled {ratio('fused graphs', 'spec compiled')} "
        f"(goal >= 1.5x)"
    )


# ----------------------------------------------------------------------------- part: reference


def part_reference(part: Part) -> None:
    """The seed article's per-example stacks (spinn bench --impl reference) against the fast step, batch 256."""
    from spinn.bench import BenchSettings, run_bench

    sizes = part.sizes
    warmup, steps = sizes.reference_steps
    common = dict(corpus=part.dev_file, variant="pi", d_hidden=sizes.speed_d, d_embed=sizes.speed_d, seed=SEED)
    common.update(d_tracker=sizes.d_tracker, device=part.device.type, batch_size=sizes.speed_batch, mode="train")
    reference = run_bench(BenchSettings(**common, impl="reference", warmup=warmup, steps=steps))
    part.record(reference=reference)
    fast = run_bench(
        BenchSettings(**common, warmup=max(warmup, sizes.speed["train"][0]), steps=sizes.speed["train"][1])
    )
    ratio = fast["pairs_per_second"] / reference["pairs_per_second"]
    part.record(
        fast=fast,
        ratio=ratio,
        summary=f"reference {reference['pairs_per_second']:,.0f} pairs/s, fast {fast['pairs_per_second']:,.0f}: "
        f"{ratio:.1f}x",
    )


PART_FUNCTIONS: dict[str, Callable[[Part], None]] = {
    "device": part_device,
    "equality": part_equality,
    "graphs_train": part_graphs_train,
    "graphs_predict": part_graphs_predict,
    "checkpoint": part_checkpoint,
    "cuda_cpu_labels": part_cuda_cpu_labels,
    "resume": part_resume,
    "speed": part_speed,
    "label": part_label,
    "nccl": part_nccl,
    "capture": part_capture,
    "encoders": part_encoders,
    "reference": part_reference,
}
assert tuple(PART_FUNCTIONS) == PART_NAMES


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
