#!/usr/bin/env python3
"""Runs a command as the terminal's foreground job, so a Ctrl-C reaches it alone.

  scripts/foreground.py COMMAND [ARG...]

`make up` runs scripts/local-stack.sh under make, and a Ctrl-C is sent to the terminal's
foreground process group: make and the script together. make then dies of the SIGINT whatever
the script does (it re-raises it: `make: *** [up] Interrupt`, status 130). So the script runs as
a job of its own, as an interactive shell would run it: in a new process group that this
wrapper makes the terminal's foreground group. The Ctrl-C reaches that group alone; the script
stops what it started and exits 0, this wrapper hands the terminal back to the group it took it
from and exits with the command's status, and make sees a recipe that succeeded.

Without a terminal (/dev/tty cannot be opened, or this process is not in its foreground group)
the command is run as it is. Standard library only.
"""
import os
import signal
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: foreground.py COMMAND [ARG...]")
    argv = sys.argv[1:]
    try:
        tty = os.open("/dev/tty", os.O_RDWR)
        before = os.tcgetpgrp(tty)
    except OSError:
        os.execvp(argv[0], argv)
    if before != os.getpgrp():
        os.close(tty)
        os.execvp(argv[0], argv)
    # Neither this process nor make is the foreground from here on: a Ctrl-C is not ours.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        os.tcsetpgrp(tty, os.getpgrp())
        os.close(tty)
        for sig in (signal.SIGINT, signal.SIGTTOU):
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            print(f"foreground.py: {argv[0]}: {e}", file=sys.stderr)
            os._exit(127)
    # The child may not have taken the terminal yet; doing it here too closes the race.
    try:
        os.setpgid(pid, pid)
        os.tcsetpgrp(tty, pid)
    except OSError:
        pass
    _, status = os.waitpid(pid, 0)
    try:
        os.tcsetpgrp(tty, before)
    except OSError:
        pass
    code = os.waitstatus_to_exitcode(status)
    sys.exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main()
