#!/usr/bin/env bash
# Busy CPUs beside the test suite, to check that no test needs an idle machine (a timing asserted in seconds, a sleep
# used as a wait): LOAD CPU-bound processes (default 2) that run at the suite's priority until stopped.
#   bash scripts/load.sh start            # start them (their ids go to $PIDS)
#   bash scripts/load.sh stop             # stop the ones start started
#   bash scripts/load.sh run make test    # start, run the command, stop (also on Ctrl-C); exits with the command's status
set -euo pipefail
LOAD=${LOAD:-2}
PIDS=${PIDS:-${TMPDIR:-/tmp}/lightning_rl_load.$(id -u).pids}

burner() {  # a process this script started: its command line is the busy loop
    grep -qa 'while :; do :; done' "/proc/$1/cmdline" 2>/dev/null
}

running() {  # any process of $PIDS still running
    local pid
    while read -r pid; do burner "$pid" && return 0; done < "$PIDS"
    return 1
}

start() {
    if [[ -s $PIDS ]] && ! running; then
        rm -f "$PIDS"  # left by processes that are gone (a reboot, a kill): nothing of ours runs
    fi
    if [[ -s $PIDS ]]; then
        echo "load.sh: already running ($(tr '\n' ' ' < "$PIDS")); stop it first: bash scripts/load.sh stop" >&2
        exit 1
    fi
    for _ in $(seq "$LOAD"); do
        # a shell loop: user-space work only, no memory, no I/O
        nohup sh -c 'while :; do :; done' > /dev/null 2>&1 &
        echo $! >> "$PIDS"
    done
    echo "load.sh: $LOAD CPU-bound processes: $(tr '\n' ' ' < "$PIDS")"
}

stop() {
    [[ -f $PIDS ]] || { echo "load.sh: nothing to stop ($PIDS absent)"; return 0; }
    while read -r pid; do
        if burner "$pid"; then kill "$pid"; fi
    done < "$PIDS"
    rm -f "$PIDS"
    echo "load.sh: stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    run)
        shift
        [[ $# -gt 0 ]] || { echo "usage: $0 run COMMAND..." >&2; exit 2; }
        start
        trap stop EXIT
        "$@"
        ;;
    *)
        echo "usage: $0 start|stop|run COMMAND..." >&2
        exit 2
        ;;
esac
