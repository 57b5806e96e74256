"""The ``directload`` command line: info, datasets, benchmarks and training.

:func:`main` parses (:mod:`directload.harness.parser`) and runs the command asked for, one module each in
:mod:`directload.harness.commands`, printing an error as one line.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

from .parser import build_parser

__all__ = ["main"]


def _one_line(exc):
    text = " ".join(str(exc).split())
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        text = f"KeyError: {exc.args[0]}"
    return text or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``directload`` and ``python -m directload``.

    Errors are printed as one line (``directload: error: ...``, exit status
    1; 2 for a ``--memory-limit`` the run cannot hold, a usage error as
    argparse's are); ``--debug`` prints the traceback instead.
    """
    from directload.harness.memcap import MemoryLimitError, enter_capped_child

    enter_capped_child()  # a capped child dies with its guardian
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)  # each command's parser names its run (directload.harness.commands)
    args.rerun = [sys.executable, "-m", "directload", *argv]  # a capped run: this command again, in its cgroup
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe (| head) shows up here, not at exit
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nothing left to flush at exit
        return 141  # 128 + SIGPIPE, what a shell reports for a program cut off by head
    except KeyboardInterrupt:
        print("directload: interrupted", file=sys.stderr)
        return 130
    except MemoryLimitError as exc:  # a limit the run cannot hold: a usage error (status 2), as argparse's are
        if args.debug:
            traceback.print_exc()
        else:
            print(f"directload: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # every library error: one line, or the traceback with --debug
        if args.debug:
            traceback.print_exc()
        else:
            print(f"directload: error: {_one_line(exc)}", file=sys.stderr)
        return 1
