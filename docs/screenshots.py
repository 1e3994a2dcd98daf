"""Regenerate the screenshots of docs/getting-started.md from a real run of the default job (what `make run` runs):

    docs/console.svg       the terminal when the job ends (the job run in a pseudo-terminal, its bytes replayed
                           through a terminal emulator, the final screen saved by rich with its colours)
    docs/tensorboard.png   TensorBoard's Custom Scalars tab for that run's fit, photographed by headless Chromium

    pip install pyte                      # the terminal emulator; a dev-only tool, not a dependency of lightning_rl
    apt-get install chromium              # for the TensorBoard picture (`chromium` on PATH)
    python docs/screenshots.py            # from the repository root, with lightning-rl and tensorboard installed

The job writes into ``runs/grpo`` as `make run` does (a new ``version_N``; ``runs/grpo/latest/checkpoints`` links to its checkpoints).
"""

from __future__ import annotations

import argparse
import fcntl
import http.server
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from components.rollout.sglang.server import free_port

ROOT = Path(__file__).resolve().parents[1]
# pyte's colour names -> rich's (pyte says brown for ANSI yellow)
_NAMED = {name: name for name in ("black", "red", "green", "blue", "magenta", "cyan", "white")} | {"brown": "yellow"}
_NAMED |= {f"bright{pyte}": f"bright_{rich}" for pyte, rich in _NAMED.items()}


def run_in_terminal(command: list[str], columns: int, lines: int):
    """Run ``command`` in a pseudo-terminal of ``columns`` x ``lines`` and return the emulated screen when it exits."""
    import pyte

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": str(lines)}
    process = subprocess.Popen(command, cwd=ROOT, stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    screen = pyte.Screen(columns, lines)
    stream = pyte.ByteStream(screen)
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        stream.feed(chunk)
    os.close(leader)
    if process.wait() != 0:
        raise SystemExit(f"{' '.join(command)} exited with {process.returncode}")
    return screen


def console_svg(out: Path, columns: int = 120, lines: int = 50) -> None:
    """The default job in a terminal; its final screen, colours included, as SVG."""
    from rich.console import Console
    from rich.text import Text

    start = time.monotonic()
    screen = run_in_terminal(["bash", "scripts/default_job.sh"], columns, lines)
    print(f"the default job ran in {time.monotonic() - start:.0f} s")
    rows = [screen.buffer[y] for y in range(lines)]
    while rows and not "".join(rows[-1][x].data for x in range(columns)).strip():
        rows.pop()  # no blank lines below the last output
    text = Text()
    for row in rows:
        for x in range(columns):
            char = row[x]
            color = None if char.fg == "default" else _NAMED.get(char.fg, f"#{char.fg}")
            style = " ".join(s for s in (color, "bold" if char.bold else None, "italic" if char.italics else None) if s)
            text.append(char.data, style=style or None)
        text.append("\n")
    console = Console(
        record=True, width=columns, force_terminal=True, color_system="truecolor", file=open(os.devnull, "w")
    )
    console.print(text, end="")
    console.save_svg(str(out), title="make run")


def tensorboard_png(logdir: Path, out: Path, size: str = "1700,1000") -> None:
    """Serve ``logdir`` with TensorBoard and photograph its Custom Scalars tab with headless Chromium. The page is served
    through `_proxy`, which turns TensorBoard's "Ignore outliers in chart scaling" off (a browser setting, kept in
    localStorage): with it on, the validation before training falls outside the chart."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        raise SystemExit("no chromium on PATH (apt-get install chromium)")
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(logdir.relative_to(ROOT)),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proxy = _proxy(f"http://127.0.0.1:{port}", b"<script>localStorage.setItem('_ignoreYOutliers', 'false')</script>")
    try:
        time.sleep(10)  # TensorBoard reads the events before it serves them
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--screenshot={out}",
                f"--window-size={size}",
                "--virtual-time-budget=30000",
                f"http://127.0.0.1:{proxy.server_port}/#custom_scalars",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=300,
        )
    finally:
        proxy.shutdown()
        server.terminate()
        server.wait()


def _proxy(upstream: str, head_script: bytes) -> http.server.ThreadingHTTPServer:
    """A local HTTP proxy to ``upstream`` that adds ``head_script`` at the top of every HTML page's <head>."""

    class Forward(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._forward(None)

        def do_POST(self) -> None:
            self._forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        def _forward(self, body: bytes | None) -> None:
            headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "x-xsrf-protected")}
            request = urllib.request.Request(upstream + self.path, data=body, method=self.command, headers=headers)
            try:
                with urllib.request.urlopen(request) as response:
                    status, content_type, data = (
                        response.status,
                        response.headers.get("Content-Type", ""),
                        response.read(),
                    )
            except urllib.error.HTTPError as error:
                status, content_type, data = error.code, error.headers.get("Content-Type", ""), error.read()
            if content_type.startswith("text/html"):
                data = re.sub(rb"<head[^>]*>", lambda m: m.group(0) + head_script, data, count=1)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument(
        "--skip-run", action="store_true", help="photograph the newest run of runs/grpo without running the job again"
    )
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    if not options.skip_run:
        console_svg(options.out / "console.svg")
    newest = (
        (ROOT / "runs" / "grpo" / "latest" / "checkpoints").resolve().parent
    )  # latest/ links to the run's checkpoints, not its events
    tensorboard_png(newest, options.out / "tensorboard.png")
