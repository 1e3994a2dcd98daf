"""`SandboxFusionTool`: run the model's code on a SandboxFusion server (its HTTP API, ``POST /run_code``)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
import warnings

from .tools import Tool, ToolError

REQUEST_SLACK_S = 30.0
"""Seconds a request may take past the program's own limits (the server's queue and start-up)."""


class SandboxFusionTool(Tool):
    """Runs the call's text as a program on a SandboxFusion server and answers its standard output.

    SandboxFusion (https://github.com/bytedance/SandboxFusion) is the code sandbox verl users deploy
    (``docker run -p 8080:8080 ...``).

    Each call is one ``POST {url}/run_code`` with ``{"code", "language", "run_timeout", "compile_timeout",
    "memory_limit_MB"}``; the answer's ``status`` (``Success``, ``Failed``, ``SandboxError``) and ``run_result``
    (``status`` ``Finished`` or ``TimeLimitExceeded``, ``return_code``, ``stdout``, ``stderr``) become the result or
    an error: a program that fails answers the last line of its standard error, one past ``timeout_s`` answers
    that it timed out. The isolation is the server's (a container on another machine can hold what a namespace
    on the trainer's cannot). A server that cannot be reached or fails answers an error result naming ``url``,
    with a warning: the run goes on, and ``tool/error_frac`` shows it. Requests bypass ``http_proxy`` (the
    server is expected on the cluster's own network).
    """

    def __init__(
        self,
        url: str,
        name: str = "python",
        language: str = "python",
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 2000,
    ):
        """
        Args:
            url: the server, e.g. ``http://sandbox:8080``.
            name: the tool's name in a call.
            language: SandboxFusion's ``language`` (``python``, ``cpp``, ``nodejs``, ``bash``, ...).
            timeout_s: seconds the program may run (``run_timeout``; also ``compile_timeout``).
            memory_mb: the program's memory limit in MiB (``memory_limit_MB``).
            max_output_chars: standard output beyond this is cut.
        """
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"SandboxFusionTool: url must start with http:// or https://, got {url!r}")
        if timeout_s <= 0 or memory_mb < 1:
            raise ValueError(f"SandboxFusionTool: need timeout_s > 0 and memory_mb >= 1, got {timeout_s}, {memory_mb}")
        self.url, self.name, self.language = url.rstrip("/"), name, language
        self.timeout_s, self.memory_mb, self.max_output_chars = timeout_s, memory_mb, max_output_chars
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._warned = False

    def __call__(self, arguments: str) -> str:
        request = {
            "code": arguments,
            "language": self.language,
            "run_timeout": self.timeout_s,
            "compile_timeout": self.timeout_s,
            "memory_limit_MB": self.memory_mb,
        }
        answer = self._post(request)
        run, compiled = answer.get("run_result") or {}, answer.get("compile_result") or {}
        if answer.get("status") == "Success":
            return (run.get("stdout") or "")[: self.max_output_chars].rstrip("\n")
        if answer.get("status") != "Failed":  # SandboxError: the server's fault, not the program's
            raise self._server_error(f"answered {answer.get('status')!r}: {str(answer.get('message'))[:300]}")
        if "TimeLimitExceeded" in (run.get("status"), compiled.get("status")):
            raise ToolError(f"timed out after {self.timeout_s} s")
        failed = compiled if compiled.get("return_code") not in (None, 0) else run
        stderr = (failed.get("stderr") or "").strip().splitlines()
        raise ToolError((stderr or [f"exit status {failed.get('return_code')}"])[-1][: self.max_output_chars])

    def _post(self, payload: dict) -> dict:
        request = urllib.request.Request(
            f"{self.url}/run_code", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with self._opener.open(request, timeout=2 * self.timeout_s + REQUEST_SLACK_S) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as err:
            raise self._server_error(
                f"refused the request with HTTP {err.code}: {err.read().decode(errors='replace')[:300]}"
            ) from None
        except (urllib.error.URLError, OSError, socket.timeout) as err:
            raise self._server_error(f"could not be reached ({getattr(err, 'reason', err)})") from None
        except json.JSONDecodeError:
            raise self._server_error("answered something that is not JSON") from None
        if not isinstance(answer, dict):
            raise self._server_error(f"answered {type(answer).__name__}, not a JSON object")
        return answer

    def _server_error(self, what: str) -> ToolError:
        message = f"the SandboxFusion server at {self.url} {what}"
        if not self._warned:  # once: every call fails alike while the server is down
            warnings.warn(f"{message}; tool calls answer errors to the model until it works (see tool/error_frac)")
            self._warned = True
        return ToolError(message)
