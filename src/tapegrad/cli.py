"""``python -m tapegrad demo|bench|...``"""
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    raise SystemExit(f"tapegrad: unknown command {argv!r}")
