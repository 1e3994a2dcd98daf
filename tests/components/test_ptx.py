"""PPO-ptx: gamma * token-mean NLL of pretraining text, by hand and against cross-entropy; end to end through the CLI."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from components.ptx import PretrainMix


class FixedLogits(nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = nn.Parameter(logits)

    def forward(self, input_ids, attention_mask, position_ids, use_cache):
        return SimpleNamespace(logits=self.logits)


def test_nll_by_hand():
    # one left-padded row [pad, 1, 2]: the only predicted token is 2 from position 1, whose logits
    # [0, 0, ln 2] give p(2) = 2 / (1 + 1 + 2) = 0.5; the pad -> 1 pair does not count
    logits = torch.zeros(1, 3, 3)
    logits[0, 1] = torch.tensor([0.0, 0.0, math.log(2.0)])
    logits[0, 0] = torch.tensor([9.0, -9.0, -9.0])  # would be a huge NLL if the padded pair counted
    loss, metrics = PretrainMix(coef=0.5).loss(
        FixedLogits(logits), torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 1]])
    )
    assert loss.item() == pytest.approx(0.5 * math.log(2.0), rel=1e-6)
    assert metrics["ptx/nll"].item() == pytest.approx(math.log(2.0), rel=1e-6)


def test_matches_cross_entropy_on_random_text_and_has_its_gradient():
    torch.manual_seed(0)
    n, length, vocab = 3, 7, 11
    ids = torch.randint(0, vocab, (n, length))
    mask = torch.ones(n, length, dtype=torch.long)
    mask[0, :2] = 0  # left padding
    mask[2, :4] = 0
    model = FixedLogits(torch.randn(n, length, vocab))
    loss, _ = PretrainMix(coef=2.0).loss(model, ids, mask)
    loss.backward()
    # independent: cross-entropy over the (context, target) pairs that are both text
    logits, targets = model.logits[:, :-1], ids[:, 1:]
    keep = (mask[:, :-1] * mask[:, 1:]).bool()
    expected = 2.0 * nn.functional.cross_entropy(logits[keep], targets[keep])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert model.logits.grad[0, :2].abs().sum() == 0  # padding positions get no gradient


def test_coef_must_be_non_negative():
    with pytest.raises(ValueError, match="coef"):
        PretrainMix(coef=-1.0)


def _gpt2(vocab: int):
    """A random 1-layer GPT-2: learned absolute position embeddings, so wrong position ids change its output too."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()


@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_a_left_padded_row_scores_as_the_same_text_alone(model, tiny_model_path):
    """A real transformer, so that the mask and the position ids matter: each row's NLL must be its unpadded text's
    (a left-padded batch scored without the mask attends to the padding; with 0-based positions counted from the
    padding, absolute position embeddings see other positions)."""
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval() if model == "llama" else _gpt2(vocab=24)
    torch.manual_seed(1)
    rows = [torch.randint(1, policy.config.vocab_size, (n,)) for n in (3, 7, 5)]
    width = max(len(r) for r in rows)
    ids = torch.stack(
        [torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows]
    )  # left padding with id 0
    mask = torch.stack(
        [torch.cat([torch.zeros(width - len(r), dtype=torch.long), torch.ones(len(r), dtype=torch.long)]) for r in rows]
    )
    with torch.no_grad():
        loss, metrics = PretrainMix(coef=2.0).loss(policy, ids, mask)
        # independent: every row alone, unpadded, through a plain forward; the token mean over all rows' predicted tokens
        nll = [
            nn.functional.cross_entropy(policy(input_ids=r[None]).logits[0, :-1], r[1:], reduction="sum") for r in rows
        ]
    expected = sum(nll) / sum(len(r) - 1 for r in rows)
    assert metrics["ptx/nll"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert loss.item() == pytest.approx(2.0 * expected.item(), rel=1e-5)
