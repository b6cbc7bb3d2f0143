"""PID 1 of the unit tier's own PID namespace (packaging/run-tests.sh).

The unit tier runs MiMo's verifier guard in process, and the guard ends every
process of the agent uid with one kill(-1) as that uid. In the host's PID
namespace that sweep would also reach the agents of the tiers running beside
it (sandboxes, containers, the nspawn guests). Inside ``unshare --pid`` it
reaches only this namespace.

PID 1 of a namespace inherits every orphan, and a zombie still has a /proc
entry: tests that wait for a killed process to be gone would wait for ever
under a PID 1 that does not reap (pytest, or a shell waiting on one child).
This one runs the command as its child, reaps every orphan, passes SIGTERM,
SIGINT and SIGHUP on, and exits with the command's status.

    unshare --pid --fork --mount-proc python packaging/reaper.py CMD [ARG...]
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str]) -> int:
    if not argv:
        print("reaper.py: usage: reaper.py CMD [ARG...]", file=sys.stderr)
        return 2
    child = os.fork()
    if child == 0:
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            print(f"reaper.py: cannot run {argv[0]}: {exc}", file=sys.stderr)
            os._exit(127)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1  # the command's own exit was not seen: cannot happen
        except InterruptedError:
            continue
        if pid == child:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) \
                else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
