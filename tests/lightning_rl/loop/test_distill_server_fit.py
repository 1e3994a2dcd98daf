"""configs/distill.yaml with its teacher on a server (configs/teacher/*.yaml stacked on it), end to end on the shipped
student and teacher: the student learns (held-out accuracy rises) from a real vLLM server the run launches and stops,
and from the loopback SGLang server; a teacher server that is not there is one line naming its URL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from components.teacher import TINY_TEACHER_PATH
from lightning_rl.core.models import TINY_MODEL_PATH
from tests.lightning_rl.cli_runs import cli_args, run_cli, scalars

REPO = Path(__file__).resolve().parents[3]


def _fit_args(root, fragment: str, *extra: str) -> list[str]:
    """Three iterations of the preset's 128 samples, validated on 64 held-out prompts before and after."""
    return cli_args(
        root, TINY_MODEL_PATH, 3, "--config", str(REPO / fragment), "--data.batch_size=128", "--data.val_size=64",
        "--trainer.val_check_interval=3", *extra, config="configs/distill.yaml",
    )  # fmt: skip


def _learned(root) -> tuple[float, float]:
    written = scalars(root)
    accuracy = [v for _, v in written["val/reward"]]
    kl = [v for _, v in written["distill/reverse_kl"]]
    assert len(accuracy) == 2 and len(kl) == 3
    assert kl[-1] < kl[0] / 2  # the student's samples move towards the teacher's distribution
    return accuracy[0], accuracy[-1]


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.xdist_group("vllm")
def test_the_student_learns_from_a_vllm_teacher_the_run_launches_and_stops(tmp_path, caplog):
    from tests.fixtures.vllm_server import unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no real vLLM server: {reason}")
    cli = run_cli(
        "fit",
        _fit_args(
            tmp_path,
            "configs/teacher/vllm.yaml",
            "--model.teacher.init_args.servers.launch.kv_cache_memory_bytes=67108864",
        ),
    )
    teacher = cli.model.teacher
    assert type(teacher).__name__ == "VLLMTeacher" and teacher.top_k == 8
    assert teacher.connection.servers.launch == {
        "dtype": "float32",
        "enforce_eager": True,
        "kv_cache_memory_bytes": "67108864",
    }
    assert type(cli.model.loss_terms[0]).__name__ == "TeacherKL" and cli.model.loss_terms[0].variant == "topk"
    assert teacher.connection.server is None and not teacher.connection.open  # stopped when the fit ended
    # the console said what it started and when it answered
    said = [r.getMessage() for r in caplog.records]
    assert any(line.startswith(f"starting vLLM on the teacher ({TINY_TEACHER_PATH}) at http://") for line in said), said
    assert any(re.fullmatch(r"vLLM ready in \d+ s", line) for line in said), said
    before, after = _learned(tmp_path)
    assert before < 0.45 and after >= before + 0.3, (before, after)


@pytest.mark.slow
@pytest.mark.server
def test_the_student_learns_from_an_sglang_teacher(tmp_path):
    from tests.fixtures.sglang_server import FakeSGLangServer

    server = FakeSGLangServer(TINY_TEACHER_PATH).start()
    try:
        cli = run_cli(
            "fit",
            _fit_args(
                tmp_path, "configs/teacher/sglang.yaml", f"--model.teacher.init_args.servers.urls=[{server.url}]"
            ),
        )
    finally:
        server.stop()
    assert type(cli.model.teacher).__name__ == "SGLangTeacher"
    assert len(server.generate_calls) == 3 * 128 and all(c["top_logprobs_num"] == 8 for c in server.generate_calls)
    before, after = _learned(tmp_path)
    assert before < 0.45 and after >= before + 0.3, (before, after)


@pytest.mark.slow
def test_a_teacher_server_that_does_not_answer_is_one_line(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = cli_args(
        tmp_path, TINY_MODEL_PATH, 1, "--config", str(REPO / "configs/teacher/sglang.yaml"),
        f"--model.teacher.init_args.servers.urls=[http://127.0.0.1:{port}]", "--model.teacher.init_args.servers.max_retries=0",
        config="configs/distill.yaml",
    )  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "lightning_rl.cli", "fit", *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr
    (last,) = run.stderr.strip().splitlines()[-1:]
    assert last.startswith(f"error: SGLang server at http://127.0.0.1:{port}: GET /health_generate failed")
    assert last.endswith("Check model.teacher.init_args.servers.urls.")
