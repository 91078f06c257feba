"""Finding the lab's processes by PID, or by their own arguments when state.json is lost."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

from lab import processes


def test_a_process_is_found_by_the_exact_end_of_its_command_line_and_nothing_else(
    tmp_path,
) -> None:
    mine = str(tmp_path / f"topology-{uuid.uuid4().hex}.json")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", mine])
    try:
        deadline = time.monotonic() + 5  # Popen may return before the child's exec
        while not processes.pids_running(["-m", mine]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert processes.pids_running(["-m", mine]) == [proc.pid]
        assert processes.pids_running([mine + "x"]) == []
        assert processes.pids_running(["-m", mine, "more"]) == []
        assert processes.terminate(processes.pids_running([mine])) == [proc.pid]
        assert processes.start_time(proc.pid) is None  # gone (terminate reaps its child)
        assert processes.pids_running([mine]) == []
    finally:
        proc.kill()
        proc.wait()
