"""PPO-ptx end to end: the data module's second stream reaches the policy loss, and its position is resumable."""

import pytest

from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main
from tests.lightning_rl.cli_runs import cli_args

PTX = [
    "--model.ptx=components.ptx.PretrainMix",
    "--model.ptx.coef=0.5",
    "--data.ptx_data=builtin:arithmetic",
    "--data.ptx_columns=[prompt, answer]",
    "--data.ptx_batch_size=4",
]


def _fit(root, tiny_model_path, *extra):
    cli = main(
        [
            "--config",
            DEFAULT_TRAINER_CONFIG,
            *cli_args(root, tiny_model_path, 2, "--data.batch_size=4", "--model.kl.init_args.coef=0.04", *PTX, *extra),
        ],
        run=False,
    )
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


@pytest.mark.slow
def test_ptx_loss_is_mixed_in_and_its_stream_position_is_saved(tmp_path, tiny_model_path):
    cli = _fit(tmp_path / "ptx", tiny_model_path)
    nll = float(cli.trainer.callback_metrics["ptx/nll"])
    assert 0.0 < nll < 10.0  # the solved problems' NLL under the tiny policy
    assert cli.datamodule.state_dict()["ptx_position"] == {"epoch": 0, "batch": 2}  # one text batch per iteration
    # the same run with gamma 0 (same samples, same text, same RL loss): the ptx loss reached the gradient only if the
    # trained weights differ
    without = _fit(tmp_path / "gamma0", tiny_model_path, "--model.ptx.coef=0.0")
    ptx, plain = cli.model.policy.state_dict(), without.model.policy.state_dict()
    moved = max(float((ptx[k] - plain[k]).abs().max()) for k in ptx)
    assert moved > 5e-5, (
        moved
    )  # 2e-4 measured: two AdamW steps at lr 1e-4; exactly 0 if the ptx loss were not back-propagated


def test_ptx_without_text_is_a_clear_error(tmp_path, tiny_model_path):
    cli = main(["--config", DEFAULT_TRAINER_CONFIG, *cli_args(tmp_path, tiny_model_path, 1, *PTX[:2])], run=False)
    with pytest.raises(ValueError, match="data.ptx_data is not"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)


def test_rewind_sets_both_streams_back(tiny_model_path):
    from lightning_rl.data.prompts import PromptDataModule

    data = PromptDataModule(
        tokenizer=tiny_model_path,
        batch_size=2,
        ptx_data="builtin:arithmetic",
        ptx_columns=["prompt", "answer"],
        ptx_batch_size=2,
    )
    data.setup("fit")
    stream = iter(data.train_dataloader())
    next(stream)
    start = data.state_dict()  # an iteration starts here ...
    next(stream)  # ... reads prompts and text, then fails
    data.rewind(start)
    assert (
        data.state_dict() == start == {"position": {"epoch": 0, "batch": 1}, "ptx_position": {"epoch": 0, "batch": 1}}
    )
