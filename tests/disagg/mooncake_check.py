"""Whether Mooncake can run here: shared by the tests that use it."""

import importlib.util
import subprocess
import sys


def mooncake_unavailable() -> str | None:
    """Why mooncake-transfer-engine-non-cuda cannot run here, or None."""
    if importlib.util.find_spec("mooncake") is None:
        return "mooncake-transfer-engine-non-cuda is not installed (pip install -e '.[mooncake]')"
    probe = subprocess.run([sys.executable, "-c", "import mooncake.engine"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"mooncake.engine does not load (apt-get install -y libibverbs1?): {probe.stderr.strip()[-300:]}"
    return None
