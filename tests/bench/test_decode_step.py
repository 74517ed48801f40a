"""bench/decode_step.py --processes reruns the script in fresh processes:
a child must get every other option and never more than one process of its
own (it would start children too, without end)."""
from bench.decode_step import child_argv, parser


def test_a_child_runs_one_process_however_the_parent_asked():
    for argv in (["--requests", "16", "--processes", "12", "--reps", "5"], ["--processes=3", "--cpu-time"],
                 ["--proc", "4"], ["--requests", "1,16"]):
        args = parser().parse_args(child_argv(argv))
        assert args.processes == 1, argv


def test_a_child_keeps_the_other_options():
    args = parser().parse_args(child_argv(["--requests", "16", "--processes", "12", "--reps", "5", "--cpu-time"]))
    assert (args.requests, args.reps, args.cpu_time) == ("16", 5, True)
