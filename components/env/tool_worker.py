"""The process a `FunctionTool` runs its function in: ``python tool_worker.py CALLS_FD ANSWERS_FD``.

Standard library only, so a worker starts without importing the trainer's stack (only the function's own
module). It receives the trainer's ``sys.path`` and the function (pickled by reference: its module is imported
here), answers ``("ready", None)``, then one ``("ok", text)`` or ``("error", "Type: message")`` per call. The
trainer kills it at a call's timeout (a worker per tool, started again at the next call): a function stuck
anywhere, in C code or on any thread of the trainer, cannot hold the trainer. Its standard output and error
are /dev/null (set by the trainer), so a tool that prints cannot flood the trainer's log.
"""

import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection


def exit_when_orphaned(parent: int) -> None:
    """A trainer killed with -9 cannot kill its worker: the worker ends itself."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def main() -> None:
    calls, answers = Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer decides when its worker ends
    threading.Thread(target=exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    try:
        sys.path[:] = calls.recv()
        fn = calls.recv()
    except EOFError:
        return
    except BaseException as err:  # the function's module failed to import
        answers.send(("error", f"{type(err).__name__}: {err}"))
        return
    answers.send(("ready", None))
    while True:
        try:
            kind, argument = calls.recv()
        except EOFError:  # the trainer closed the tool
            return
        try:
            answers.send(("ok", str(fn(**argument) if kind == "kwargs" else fn(argument))))
        except BaseException as err:  # the call failed, not the worker: the model reads why
            answers.send(("error", f"{type(err).__name__}: {err}"))


if __name__ == "__main__":
    main()
