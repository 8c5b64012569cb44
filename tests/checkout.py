"""A copy of this checkout as a user's clone has it, for tests that run the project's own commands.

DVC, `prefect deploy` and README's commands act on a project folder; running
them on a copy keeps this checkout clean and lets each test own its data/.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def copy_checkout(destination: Path) -> Path:
    """The files git would see here (tracked, or untracked and not ignored), without any data/."""
    listing = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for name in filter(None, listing.split("\0")):
        source = ROOT / name
        if name.startswith("data/") or not source.is_file():  # listed but deleted in the working tree
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return destination
