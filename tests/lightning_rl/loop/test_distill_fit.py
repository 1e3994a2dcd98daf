"""configs/distill.yaml end to end on the shipped student and teacher: the teacher's metrics and per-token log-probs,
checkpoints that leave the teacher out and resume, and configs that cannot distill refused before any model loads."""

from __future__ import annotations

import pytest
import torch

from components.distill import TeacherKL
from lightning_rl.checkpoint import load_checkpoint
from lightning_rl.cli import main
from lightning_rl.core.contracts import Teacher, TeacherScores
from tests.lightning_rl.cli_runs import cli_args, run_cli, scalars, texts


def _distill_args(root, steps: int, *extra: str) -> list[str]:
    from lightning_rl.core.models import TINY_MODEL_PATH

    return cli_args(
        root, TINY_MODEL_PATH, steps, "--data.batch_size=8", "--data.val_size=16", *extra, config="configs/distill.yaml"
    )


@pytest.mark.slow
def test_distill_preset_trains_the_student_and_logs_the_teacher(tmp_path):
    cli = run_cli("fit", _distill_args(tmp_path, 2))
    module = cli.model
    written = scalars(tmp_path)
    kl = [v for _, v in written["distill/reverse_kl"]]
    teacher_mean = [v for _, v in written["distill/teacher_logprob_mean"]]
    assert len(kl) == 2 and all(v > 0 for v in kl)  # the shipped student still disagrees with the teacher
    assert all(v < 0 for v in teacher_mean)
    table = texts(tmp_path)["samples/text_summary"][0][1]
    assert "teacher logprobs" in table.splitlines()[0]
    # the samples table's teacher log-probs are the teacher's scores of the row's sampled tokens, 2 decimals
    assert any(cell.strip().startswith("-") for cell in table.splitlines()[2].split("|")[-2].split())
    # checkpoints leave the frozen teacher out (it is built again from its path) ...
    state = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert not any(k.startswith("teacher.") for k in state["state_dict"])
    assert any(k.startswith("teacher.") for k in module.state_dict())
    assert set(state["hf_export"]) == {"policy"}
    # ... and a run resumes from them
    resumed = run_cli("fit", _distill_args(tmp_path, 3, f"--ckpt_path={tmp_path}/checkpoints/last.ckpt"))
    assert resumed.trainer.global_step == 3
    assert load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["state_dict"].keys() == state["state_dict"].keys()


class TopKServer(Teacher):
    """A teacher that returns log-probs and its top k but not its whole distribution (what a server gives)."""

    top_k = 2

    def score(self, batch):
        zeros = torch.zeros(batch.response_ids.shape)
        return TeacherScores(zeros, torch.zeros(*zeros.shape, 2, dtype=torch.long), zeros[..., None].expand(-1, -1, 2))


def test_the_exact_kl_needs_a_teacher_in_this_process_and_says_so():
    from lightning_rl.loop.module import RLModule

    with pytest.raises(ValueError) as err:
        RLModule(teacher=TopKServer(), loss_terms=[TeacherKL(variant="exact")])
    assert "model.loss_terms[0] (TeacherKL) needs ['teacher_logits']" in str(err.value)
    assert "add a teacher in this process, which gives its whole distribution" in str(err.value)
    RLModule(teacher=TopKServer(), loss_terms=[TeacherKL(variant="topk")])  # the top-k variant is served


def test_distillation_without_a_teacher_is_one_clear_error(tmp_path, capsys):
    from lightning_rl.core.models import TINY_MODEL_PATH

    args = cli_args(tmp_path, TINY_MODEL_PATH, 1, "--model.teacher=null", config="configs/distill.yaml")
    with pytest.raises(SystemExit):
        main(["fit", *args])
    err = capsys.readouterr().err
    assert "model.loss_terms[0] (TeacherKL) needs ['teacher_logits']" in err and "components.teacher.HFTeacher" in err
