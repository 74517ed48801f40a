"""bench/decode_step.py --processes reruns the script in fresh processes:
each child must get every other option and never --processes itself (it
would start its own children)."""
from bench.decode_step import without_processes


def test_the_children_get_every_option_but_processes():
    assert without_processes(["--requests", "16", "--processes", "12", "--reps", "5"]) == \
        ["--requests", "16", "--reps", "5"]
    assert without_processes(["--processes=3", "--cpu-time"]) == ["--cpu-time"]
    assert without_processes(["--requests", "1,16"]) == ["--requests", "1,16"]
