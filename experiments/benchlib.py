"""What every benchmark script shares: peak memory and writing its result page."""

import os
import resource
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (Linux reports KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def publish(name: str, body: str) -> None:
    """Print the result and write it to experiments/results/<name>.md under a header with the core count."""
    text = f"# {name} ({os.cpu_count()} cores)\n\n{body.rstrip()}\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text(text)
