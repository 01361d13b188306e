"""More job targets, run inside a real job worker like those of jobtargets.py: one slow to stop, one whose
result is larger than a tool result may be."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any


def stop_slowly(args: dict[str, Any], progress: Any) -> dict[str, Any]:
    """Sleep until SIGTERM, then linger `linger` seconds before exiting, as a worker cleaning up would."""

    def linger(signum: int, frame: Any) -> None:
        time.sleep(float(args.get("linger", 2)))
        os._exit(0)

    signal.signal(signal.SIGTERM, linger)
    progress.report(1, None, "lingering")
    Path(args["pidfile"]).write_text(json.dumps({"worker": os.getpid()}))
    time.sleep(600)
    return {"steps": 1, "message": "woke up"}


def big_result(args: dict[str, Any], progress: Any) -> dict[str, Any]:
    """A result of `rows` rows of `width` characters each (more than one result's budget)."""
    rows = [f"{i:06d}" + "x" * int(args.get("width", 100)) for i in range(int(args.get("rows", 400)))]
    return {"steps": len(rows), "message": "big", "rows": rows}
