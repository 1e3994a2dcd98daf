"""`ServerTeacher`: a teacher on inference servers that score given tokens: the student's prompt and sampled response
go in, the teacher's log-prob of each response token (and with ``top_k`` its k most likely tokens at each position)
come out. The servers, their retries, fan-out, health and launch are the server rollout's (`components.rollout.server`):
`SGLangTeacher` (``/generate`` with input log-probs), `VLLMTeacher` (prompt log-probs), `CompletionsTeacher` (any
OpenAI-compatible ``/v1/completions`` with ``echo`` and ``logprobs``).

Every engine returns the raw log-probs of given tokens, log_softmax(z): SGLang's input log-probs and vLLM's prompt
log-probs take no temperature. That is `HFTeacher`'s distribution at temperature 1; at another temperature
log_softmax(z / T) needs the whole distribution's normaliser, which a server does not return, so a server teacher
refuses any temperature but 1. The top k are the k most likely tokens of the same distribution, most likely first.
Every answer is checked before it reaches the loss (`components.teacher.answers`): one no model gives (NaN, +inf or a
positive log-prob, a top-k id twice or past the policy's vocabulary) fails naming the server.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from components.rollout.completions import CompletionsEngine
from components.rollout.server.connection import Connection
from components.rollout.server.engine import ScoringEngine
from components.rollout.server.healing import Healing
from components.rollout.server.samples import Scored, image_data
from components.rollout.server.settings import Servers
from components.rollout.sglang.engine import SGLangEngine
from components.rollout.vllm.engine import VLLMEngine
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Teacher, TeacherScores

from .answers import check_scored
from .hf import TINY_TEACHER_PATH
from .vocabulary import check_served_tokenizer

KEY = "model.teacher.init_args"


class ServerTeacher(Teacher):
    """log p_teacher(y_t | x, y_<t) of the student's sampled tokens, scored by a server (teacher forcing on the
    student's response, on-policy distillation, Agarwal et al. 2024, arXiv:2306.13649); the engine is a subclass's."""

    engine_type: ClassVar[type[ScoringEngine]]

    def __init__(
        self,
        servers: Servers = Servers(),
        tokenizer: str | None = None,
        top_k: int = 0,
        temperature: float = 1.0,
    ):
        """A teacher's weights never change: it takes ``servers:`` alone (no ``weights:`` or ``verify:``). The flat
        keys of earlier releases (``base_url``, ``timeout_s`` ...) are translated by the command line for one release,
        with a warning naming the new key; in Python pass a `Servers`.

        Args:
            servers: the servers serving the teacher (``urls``; rows are spread over them) or how to start one
                (``launch``: the engine's server with these arguments, as the engine's rollout does, stopped at the end;
                the checkpoint defaults to the built-in task's teacher), and how requests to them behave: `Servers`.
            tokenizer: the teacher's tokenizer (folder or hub id), compared with the policy's at setup. None: the
                launched checkpoint's, else the one the server names (``/model_info``, ``/v1/models``) when this machine
                can load it, else the server's ``/tokenize`` of a sample of the policy's tokens, each on its own.
            top_k: also return the teacher's k most likely tokens at each position (the top-k reverse KL); 0 = none.
            temperature: must be 1: a server returns raw log-probs of given tokens (see the module's docstring).
        """
        who = type(self).__name__
        if temperature != 1.0:
            raise ValueError(
                f"{who}: temperature {temperature}: a server returns raw log-probs of given tokens, log_softmax(z), and "
                "log_softmax(z / T) needs the normaliser of the whole distribution, which it does not return. Use "
                "temperature 1, or components.teacher.HFTeacher (in this process) for a tempered teacher"
            )
        if top_k < 0:
            raise ValueError(f"{who}: top_k must be >= 0, got {top_k}")
        servers.check(who)
        self.top_k, self.temperature, self.tokenizer_path = top_k, temperature, tokenizer
        self.connection = Connection(servers, self.engine_type, KEY, self._configure)
        self.connection.default_model = TINY_TEACHER_PATH
        self.healing = Healing(self.connection, who)
        self.vocabulary: int | None = None  # the policy's, set at setup: top-k ids must be below it

    def _configure(self, engine: ScoringEngine) -> None:
        """Engine settings before its servers are checked (a subclass's)."""

    @property
    def urls(self) -> list[str]:
        return self.connection.urls

    def describe(self) -> str:
        return f"scored by {self.connection.engine.name} at {', '.join(self.urls)}"

    def setup(self, tokenizer) -> None:
        """Connect (start the server if asked to), then refuse a teacher that reads the policy's token ids otherwise."""
        if self.connection.open:
            return
        self.vocabulary = len(tokenizer)
        self.connection.connect(type(self).__name__, release_memory=False)
        engine, url, launch = self.connection.engine, self.connection.urls[0], self.connection.servers.launch
        served = (launch.get(engine.model_key) or self.connection.default_model) if launch is not None else None
        try:
            check_served_tokenizer(tokenizer, engine, url, self.tokenizer_path or served, KEY)
        except BaseException:
            self.close()
            raise

    def _connected(self) -> Connection:
        if not self.connection.open:  # used again after close() (e.g. trainer.validate after trainer.fit)
            self.connection.connect(type(self).__name__, release_memory=False)
        return self.connection

    @torch.no_grad()
    def score(self, batch: RolloutBatch) -> TeacherScores:
        batch.require(self.requires, type(self).__name__)
        connection = self._connected()
        lengths = batch.response_mask.sum(-1).tolist()
        prompts, responses = batch.prompt_ids.cpu(), batch.response_ids.cpu()
        masks = batch.prompt_mask.cpu().bool()
        rows = [i for i, n in enumerate(lengths) if n > 0]
        jobs = []
        for i in rows:
            images = image_data(batch.images[i]) if batch.images is not None and batch.images[i] else None
            jobs.append((prompts[i][masks[i]].tolist(), responses[i, : int(lengths[i])].tolist(), images))
        while True:  # a launched teacher server that dies or hangs is restarted and the whole batch scored again
            try:
                answers = self._score(connection, jobs)
                break
            except Exception as failure:
                self.healing.recover(failure)
        return self._tensors(batch, rows, answers)

    def _score(self, connection: Connection, jobs: list) -> list[Scored]:
        self.healing.rejoin(wait=not self.healing.live_urls())  # a teacher's weights never change: nothing to push
        urls, engine = self.healing.live_urls(), connection.engine
        answers = connection.map(
            lambda url, job: engine.score(url, *job, None, self.top_k), jobs, urls, self.healing.watch
        )
        for j, ((_, response, _), answer) in enumerate(zip(jobs, answers)):  # every answer one a model can give
            check_scored(connection.client.error, urls[j % len(urls)], KEY, answer, len(response), self.top_k,
                         self.vocabulary)  # fmt: skip
        return answers

    def _tensors(self, batch: RolloutBatch, rows: list[int], answers: list[Scored]) -> TeacherScores:
        shape, k = batch.response_ids.shape, self.top_k
        logprobs = torch.zeros(shape, dtype=torch.float32)  # (B, R); 0 after each response's end
        ids = torch.zeros(*shape, k, dtype=torch.long)  # (B, R, K)
        top = torch.zeros(*shape, k, dtype=torch.float32)  # (B, R, K)
        for i, answer in zip(rows, answers):
            n = len(answer.logprobs)
            logprobs[i, :n] = torch.tensor(answer.logprobs, dtype=torch.float32)
            if k:
                ids[i, :n] = torch.tensor(answer.top_ids, dtype=torch.long)
                top[i, :n] = torch.tensor(answer.top_logprobs, dtype=torch.float32)
        device = batch.response_ids.device
        if not k:
            return TeacherScores(logprobs.to(device))
        return TeacherScores(logprobs.to(device), ids.to(device), top.to(device))

    def close(self) -> None:
        self.connection.close()


class SGLangTeacher(ServerTeacher):
    """log p_teacher(y_t | x, y_<t) = log_softmax(z_t)[y_t] and the top k, scored by SGLang servers (on-policy
    distillation, arXiv:2306.13649).

    ``/generate`` with ``max_new_tokens: 0``, ``return_logprob``, ``logprob_start_len`` and ``top_logprobs_num``.
    ``servers.launch`` starts ``python -m sglang.launch_server`` (its ``model_path`` defaults to the built-in task's
    teacher)."""

    engine_type = SGLangEngine


class VLLMTeacher(ServerTeacher):
    """log p_teacher(y_t | x, y_<t) = log_softmax(z_t)[y_t] and the top k, scored by vLLM servers (on-policy
    distillation, arXiv:2306.13649).

    Prompt log-probs (``prompt_logprobs: k``) on ``/inference/v1/generate``, which a server started with
    ``--enable-scale-out`` serves (``servers.launch`` adds it, as `VLLMRollout`'s does; its ``model`` defaults to the
    built-in task's teacher). vLLM's ``--max-logprobs`` (20 by default) caps ``top_k``."""

    engine_type = VLLMEngine


class CompletionsTeacher(ServerTeacher):
    """log p_teacher(y_t | x, y_<t) = log_softmax(z_t)[y_t] and the top k, scored by an OpenAI-compatible
    ``/v1/completions`` server (on-policy distillation, arXiv:2306.13649).

    The legacy scoring request (``echo``, ``logprobs``, ``max_tokens: 0``), which a plain vLLM OpenAI server answers;
    the top k needs token ids in the answer (vLLM's ``return_tokens_as_token_ids``). Started with its own command:
    ``servers.urls`` only."""

    engine_type = CompletionsEngine

    def __init__(self, servers: Servers = Servers(), model: str | None = None, **kwargs):
        """
        Args:
            servers: the running server(s) serving the teacher (``urls``; rows are spread over them): `Servers`.
            model: the served model requests name (None: the first the server lists at ``/v1/models``).
        """
        if servers.launch is not None:
            raise ValueError(
                "CompletionsTeacher: an OpenAI-compatible server is started with its own command; set servers.urls "
                "(VLLMTeacher and SGLangTeacher can launch their engine's server)"
            )
        super().__init__(servers=servers, **kwargs)
        self.model = model

    def _configure(self, engine: CompletionsEngine) -> None:
        engine.served_model = self.model
