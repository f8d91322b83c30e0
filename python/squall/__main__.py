"""`squall <command>` / `python -m squall <command>`: advise, run."""

import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: squall advise [...] | squall run [...] -- command\n"
              "  advise: measure the link and codecs, predict each codec's step "
              "times\n  run:    squallrun, the zero-code launcher")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "advise":
        from . import advise

        return advise.main(rest)
    if command == "run":
        from . import run

        return run.main(rest)
    print(f"squall: unknown command {command!r}; use advise or run", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
