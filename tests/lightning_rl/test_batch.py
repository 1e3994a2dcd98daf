import torch

from lightning_rl.core.batch import RolloutBatch, terminal_rewards


def test_terminal_rewards_sit_on_the_last_valid_token():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    out = terminal_rewards(torch.tensor([2.0, -1.0, 5.0]), mask)
    assert out.tolist() == [[0.0, 0.0, 2.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


def test_cat_pads_responses_right_and_prompts_left():
    a = RolloutBatch(
        prompt_ids=torch.tensor([[5, 6]]), prompt_mask=torch.tensor([[1, 1]]), response_ids=torch.tensor([[7]]), response_mask=torch.tensor([[1]]), scores=torch.tensor([1.0])
    )
    b = RolloutBatch(
        prompt_ids=torch.tensor([[5, 6, 7]]),
        prompt_mask=torch.tensor([[1, 1, 1]]),
        response_ids=torch.tensor([[8, 9]]),
        response_mask=torch.tensor([[1, 1]]),
        scores=torch.tensor([0.0]),
    )
    c = RolloutBatch.cat([a, b])
    assert c.prompt_ids.tolist() == [[0, 5, 6], [5, 6, 7]]
    assert c.prompt_mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert c.response_ids.tolist() == [[7, 0], [8, 9]]
    assert c.response_mask.tolist() == [[1, 0], [1, 1]]
    assert c.scores.tolist() == [1.0, 0.0]


def test_select_split_and_loss_mask():
    batch = RolloutBatch(response_ids=torch.zeros(5, 2, dtype=torch.long), response_mask=torch.ones(5, 2, dtype=torch.long), sample_mask=torch.tensor([1.0, 0, 1, 1, 1]))
    assert [b.batch_size for b in batch.split(2)] == [2, 2, 1]
    assert batch.select(torch.tensor([True, False, True, False, False])).batch_size == 2
    assert batch.loss_mask.sum().item() == 8


def test_terminal_rewards_skip_trailing_environment_tokens():
    action_tokens = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]])
    out = terminal_rewards(torch.tensor([2.0, -1.0, 5.0]), action_tokens)
    assert out.tolist() == [[0.0, 2.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]


def test_action_mask_is_folded_into_the_loss_mask():
    batch = RolloutBatch(
        response_ids=torch.ones(2, 4, dtype=torch.long),
        response_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        action_mask=torch.tensor([[1, 0, 1, 1], [0, 1, 1, 1]]),
        sample_mask=torch.tensor([1.0, 0.0]),
    )
    assert batch.action_tokens.tolist() == [[1, 0, 1, 0], [0, 1, 1, 1]]
    assert batch.loss_mask.tolist() == [[1, 0, 1, 0], [0, 0, 0, 0]]
    assert batch.response_lengths.tolist() == [3, 4]  # a decode reads the whole row
    cat = RolloutBatch.cat([batch.select(slice(0, 1)), batch.select(slice(1, 2))])
    assert cat.action_mask.tolist() == batch.action_mask.tolist()
