"""Just enough of the Prometheus text exposition format to read info metrics.

vLLM publishes its cache configuration as the labels of an info-style gauge
(`vllm:cache_config_info{block_size="16",num_gpu_blocks="2000",...} 1.0`);
only samples and their labels are needed, not types or values.
"""

from __future__ import annotations

import re

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+\S+")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def label_sets(text: str, metric: str) -> list[dict[str, str]]:
    """Label dicts of every sample of `metric` in `text`, in order."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None or match.group("name") != metric:
            continue
        found.append(_parse_labels(match.group("labels") or ""))
    return found


def _parse_labels(text: str) -> dict[str, str]:
    return {name: re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], raw) for name, raw in _LABEL.findall(text)}
