"""`CompletionsEngine`: given tokens scored by any OpenAI-compatible ``/v1/completions`` server (the legacy completions
API's scoring request: the tokens as the prompt, ``echo``, ``logprobs``, no new token).

Request: ``{"model": <served model>, "prompt": [token ids], "max_tokens": 0, "echo": true, "logprobs": k,
"return_tokens_as_token_ids": true, "temperature": 0}``. Answer: ``choices[0].logprobs`` with ``token_logprobs``
(entry i: log p(token i | tokens < i); the first is null), ``tokens`` and ``top_logprobs`` (entry i: ``{token: logprob}``
of the k most likely tokens there and the given one). OpenAI's API names tokens by their text; vLLM's
``return_tokens_as_token_ids`` names them ``token_id:<id>``, which the top k needs (two tokens may decode to the same
text), so a server that answers with text serves the sampled-token log-probs only. vLLM 0.32 answers this request
(``entrypoints/openai/completion/serving.py``: ``echo`` with ``max_tokens: 0`` returns the prompt's log-probs, which
are raw, untempered); OpenAI's own API no longer does.
"""

from __future__ import annotations

from ..server.engine import ScoringEngine
from ..server.http import HTTPClient, ServerError
from ..server.launch import Command
from ..server.samples import Scored

TOKEN_ID = "token_id:"  # vLLM's name for a token in log-probs with return_tokens_as_token_ids
NON_FINITE = -9999.0  # vLLM's stand-in for a -inf log-prob (OpenAI's API does the same)


class CompletionsError(ServerError):
    """An OpenAI-compatible server failed, could not be reached, or answered something we cannot use."""

    engine = "OpenAI-compatible"


class CompletionsClient(HTTPClient):
    error = CompletionsError


class CompletionsEngine(ScoringEngine):
    client_type = CompletionsClient
    model_key = "model"
    served_model: str | None = None
    """The ``model`` each request names (None: the first model the server lists)."""

    _listed: dict | None = None  # the served model's entry in /v1/models, read at the first health check

    @classmethod
    def command(cls, launch: dict, python: str | None) -> Command:
        raise ValueError(
            "an OpenAI-compatible server is started with its own command: set servers.urls "
            "(components.teacher.VLLMTeacher and SGLangTeacher can launch their engine's server)"
        )

    def health(self, url: str) -> None:
        """``GET /v1/models``; the model requests name is checked there (or, when none is set, its first)."""
        answer = self.client.request(url, "/v1/models", method="GET")
        models = {m.get("id"): m for m in (answer.get("data") or [])} if isinstance(answer, dict) else {}
        if not models:
            raise self.client.fail(url, f": GET /v1/models lists no model: {str(answer)[:300]}")
        if self.served_model is None:
            self.served_model = next(iter(models))
        elif self.served_model not in models:
            raise self.client.fail(url, f" serves {sorted(models)}, not model {self.served_model!r}")
        self._listed = models[self.served_model]

    def model_path(self, url: str) -> str | None:
        """The checkpoint the served model was loaded from (vLLM's ``root``), else its name."""
        if self._listed is None:
            self.health(url)
        return self._listed.get("root") or self._listed.get("id")

    def score(self, url, prompt, continuation, images, adapter, top_k=0) -> Scored:
        if images:
            raise self.client.fail(url, ": /v1/completions takes no images; score vision-language prompts on SGLang")
        tokens = prompt + continuation
        body = {"prompt": tokens, "max_tokens": 0, "echo": True, "logprobs": top_k, "temperature": 0.0,
                "return_tokens_as_token_ids": True}  # fmt: skip
        body["model"] = adapter or self.served_model
        answer = self.client.request(url, "/v1/completions", body)
        choices = answer.get("choices") if isinstance(answer, dict) else None
        logprobs = (choices[0].get("logprobs") if choices else None) or {}
        values, named = logprobs.get("token_logprobs") or [], logprobs.get("tokens") or []
        if len(values) < len(tokens) or any(values[i] is None for i in range(len(prompt), len(tokens))):
            raise self.client.fail(
                url, f": /v1/completions echoed {len(values)} log-probs for {len(tokens)} tokens: {str(answer)[:300]}"
            )
        by_id = len(named) >= len(tokens) and all(str(n).startswith(TOKEN_ID) for n in named[: len(tokens)])
        if by_id and [int(n[len(TOKEN_ID) :]) for n in named[: len(tokens)]] != tokens:
            raise self.client.fail(url, ": /v1/completions echoed other token ids than it was sent")
        scored = [float(v) for v in values[len(prompt) : len(tokens)]]
        if any(v <= NON_FINITE for v in scored):
            raise self.client.fail(url, " returned a non-finite log-prob for a given token")
        if not top_k:
            return Scored(scored, None)
        if not by_id:
            raise self.client.fail(
                url, ": /v1/completions names its top tokens by text, not id (no return_tokens_as_token_ids), and "
                "several tokens can read as one text: set top_k 0 (the sampled-token log-probs) or use VLLMTeacher / "
                "SGLangTeacher",
            )  # fmt: skip
        tops = (logprobs.get("top_logprobs") or [])[len(prompt) : len(tokens)]
        if len(tops) != len(continuation) or any(not top or len(top) < top_k for top in tops):
            raise self.client.fail(url, f": /v1/completions answered fewer than {top_k} top log-probs at some position")
        ranked = [sorted(top.items(), key=lambda kv: -float(kv[1]))[:top_k] for top in tops]
        return Scored(
            scored, None, [[int(n[len(TOKEN_ID) :]) for n, _ in top] for top in ranked],
            [[float(v) for _, v in top] for top in ranked],
        )  # fmt: skip
