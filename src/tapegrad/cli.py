"""``python -m tapegrad demo|bench|memory|coverage|profile ...`` (also the ``tapegrad``
console script).

    tapegrad demo [--quick] [--no-torch]     the guided report (README's ``make demo``)
    tapegrad bench [NAME] [OPTIONS]          the benchmark suite (``make bench``): NAME is
                                             one of ``tapegrad bench --list``, default all
    tapegrad memory [--depth N] [--checkpoint [SEGMENTS]]
                                             measured memory of one deep-MLP training step
    tapegrad coverage [--write | --check | -o PATH]
                                             names present/missing against PyTorch's API
                                             (markdown; --write regenerates docs/coverage.md)
    tapegrad profile [--calibrate] [script.py ARGS | --example spiral|char_gpt]
                                             op times and the roofline table (E3) of a
                                             script or a built-in training step
"""
import argparse
import sys

USAGE = __doc__.split("\n\n", 1)[1]


def _demo(argv):
    from tapegrad import demo

    return demo.main(argv)


def _bench(argv):
    from tapegrad import bench

    p = argparse.ArgumentParser(
        prog="tapegrad bench",
        description="tapegrad eager vs PyTorch eager vs raw numpy, in one process. Options "
                    "after NAME go to that benchmark (tapegrad bench NAME --help); with "
                    "'all', --threads, --rounds, --quick and --no-torch go to the built-in ones.")
    p.add_argument("name", nargs="?", default="all",
                   help=f"one of: all, {', '.join(bench.BENCHMARKS)} (default: all)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    if argv and not argv[0].startswith("-"):  # NAME first: everything after it is its own
        args, rest = p.parse_args(argv[:1]), argv[1:]
    else:  # all: only --list and --help are ours, the rest goes to every benchmark
        ours = [a for a in argv if a in ("--list", "-h", "--help")]
        args, rest = p.parse_args(ours), [a for a in argv if a not in ours]
    if args.list:
        for name, (_, description) in bench.BENCHMARKS.items():
            print(f"{name:12s} {description}")
        return 0
    if args.name == "all":
        for name in bench.BENCHMARKS:
            print()
            own = rest if name != "checkpoint" else [a for a in rest if a == "--quick"]
            bench.load(name).main(own)
        return 0
    if args.name not in bench.BENCHMARKS:
        p.error(f"unknown benchmark {args.name!r}; choose from all, {', '.join(bench.BENCHMARKS)}")
    bench.load(args.name).main(rest)
    return 0


def _memory(argv):
    from tapegrad.profiler import workload

    return workload.main(argv)


def _coverage(argv):
    from tapegrad import coverage

    return coverage.main(argv)


def _profile(argv):
    from tapegrad.profiler import roofline

    return roofline.main(argv)


COMMANDS = {"demo": _demo, "bench": _bench, "memory": _memory, "coverage": _coverage,
            "profile": _profile}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m tapegrad COMMAND ...\n\n" + USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"tapegrad: unknown command {command!r}; choose from {', '.join(COMMANDS)}\n\n"
              + USAGE, file=sys.stderr)
        return 2
    rc = COMMANDS[command](rest)
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
