"""Prompts with images from data: every way an image can be given, several per prompt, the chat template placing them,
and bad images failing with the file and row named, or skipped and counted."""

from __future__ import annotations

import io
import json
import os
import warnings

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from lightning_rl.data.checks import DataError
from lightning_rl.data.prompts import PromptDataModule
from tests.helpers import pictures
from tests.support.vlm import png_declaring


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def module(data, tokenizer, **kwargs):
    dm = PromptDataModule(
        train_data=data,
        val_data=None,
        tokenizer=tokenizer,
        chat_template=True,
        batch_size=kwargs.pop("batch_size", 2),
        **kwargs,
    )
    dm.setup("fit")
    return dm


def first_batch(dm):
    return next(iter(dm.train_dataloader()))["prompts"]


def test_paths_relative_to_the_data_file_and_several_images_per_prompt(tiny_vlm_path, tmp_path):
    (tmp_path / "img").mkdir()
    for name, picture in zip(["a.png", "b.jpg"], pictures((56, 56, (200, 0, 0)), (84, 28, (0, 0, 200)))):
        picture.save(tmp_path / "img" / name)
    data = write_jsonl(tmp_path / "train.jsonl", [
        {"prompt": "how many?", "image": "img/a.png", "answer": "1"},
        {"prompt": "both", "image": ["img/a.png", "img/b.jpg"], "answer": "2"},
        {"prompt": "none", "image": [], "answer": "0"},
    ])  # fmt: skip
    dm = module(data, tiny_vlm_path, batch_size=3, shuffle=False)
    prompts = first_batch(dm)
    assert [len(images) for images in prompts.images] == [1, 2, 0]
    assert "image" not in prompts.columns and prompts.columns["answer"] == ["1", "2", "0"]
    assert [sorted(t) for t in prompts.image_inputs] == [["image_grid_thw", "pixel_values"]] * 2 + [[]]
    assert prompts.image_inputs[1]["image_grid_thw"].tolist() == [[1, 4, 4], [1, 2, 6]]
    tokenizer = dm._tokenizer()
    placeholder = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    counts = (prompts.prompt_ids == placeholder).sum(-1).tolist()
    assert counts == [
        4,
        4 + 3,
        0,
    ]  # one token per 2x2 patches: the chat template placed each image, the processor expanded it
    text = tokenizer.decode(prompts.prompt_ids[1][prompts.prompt_mask[1].bool()])
    assert text.startswith("<|im_start|>user\n<|vision_start|>") and text.endswith(
        "both<|im_end|>\n<|im_start|>assistant\n"
    )


def test_bytes_pil_images_and_a_datasets_image_feature(tiny_vlm_path, tmp_path):
    red, blue = pictures((56, 56, (200, 0, 0)), (56, 56, (0, 0, 200)))
    buffer = io.BytesIO()
    blue.save(buffer, format="PNG")
    rows = [{"prompt": "a", "image": red}, {"prompt": "b", "image": red}]
    folder = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))  # a datasets Image feature, stored as PNG bytes
    assert isinstance(datasets.load_from_disk(str(folder)).features["image"], datasets.Image)
    from_bytes = tmp_path / "bytes.parquet"
    datasets.Dataset.from_dict({"prompt": ["a", "b"], "image": [buffer.getvalue()] * 2}).to_parquet(str(from_bytes))
    for source in (str(folder), str(from_bytes)):
        prompts = first_batch(module(source, tiny_vlm_path, shuffle=False))
        assert [im.size for images in prompts.images for im in images] == [(56, 56), (56, 56)]
        expected = red if source == str(folder) else blue
        assert np.array_equal(np.asarray(prompts.images[0][0].convert("RGB")), np.asarray(expected))


def bad_rows(tmp_path):
    (tmp_path / "ok.png").write_bytes(_png(pictures((56, 56, (0, 200, 0)))[0]))
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG not really")
    Image.fromarray(np.full((56, 56), 40000, dtype=np.uint16)).save(tmp_path / "deep.png")  # 16-bit grey
    return [
        {"prompt": "fine", "image": "ok.png"},
        {"prompt": "missing", "image": "gone.png"},
        {"prompt": "fine", "image": "ok.png"},
        {"prompt": "corrupt", "image": "corrupt.png"},
        {"prompt": "deep", "image": ["ok.png", "deep.png"]},
    ]


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    "row, needle",
    [
        (1, "gone.png' does not exist"),
        (3, "'corrupt.png' cannot be read as an image"),
        (4, "image 2 of 2 'deep.png' has mode 'I;16'"),
    ],
)
def test_a_bad_image_fails_naming_the_file_and_the_row(tiny_vlm_path, tmp_path, row, needle):
    rows = bad_rows(tmp_path)
    data = write_jsonl(tmp_path / "train.jsonl", [rows[0], rows[row]])
    with pytest.raises(DataError) as err:
        module(data, tiny_vlm_path)
    message = str(err.value)
    assert message.startswith(f"{data}, row 1 (line 2): ") and needle in message and "data.bad_images: skip" in message


def test_bad_images_are_skipped_and_counted_when_asked(tiny_vlm_path, tmp_path):
    data = write_jsonl(tmp_path / "train.jsonl", bad_rows(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm = module(data, tiny_vlm_path, bad_images="skip")
    assert dm.bad_images == {data: 3} and len(dm.train_rows) == 2
    assert any("skipping 3 of 5 row(s)" in str(w.message) and "row 1 (line 2)" in str(w.message) for w in caught)
    assert [len(images) for images in first_batch(dm).images] == [1, 1]


def test_images_need_the_chat_template_and_are_never_truncated(tiny_vlm_path, tmp_path):
    pictures((56, 56, (0, 200, 0)))[0].save(tmp_path / "ok.png")
    data = write_jsonl(
        tmp_path / "train.jsonl", [{"prompt": "a", "image": "ok.png"}, {"prompt": "b", "image": "ok.png"}]
    )
    with pytest.raises(ValueError, match="data.chat_template: true"):
        PromptDataModule(train_data=data, val_data=None, tokenizer=tiny_vlm_path, batch_size=2).setup("fit")
    with pytest.raises(ValueError, match="cannot be truncated"):
        module(data, tiny_vlm_path, max_prompt_length=8, overlong_prompt="truncate")


def test_the_builtin_visual_task_has_a_held_out_split():
    from lightning_rl.data.tasks import count_shapes_rows

    train, test = count_shapes_rows("train", n_train=300), count_shapes_rows("test")
    assert {r["answer"] for r in test} == {"1", "2", "3", "4", "5"} and len(test) == 200
    seen = {r["image"].tobytes() for r in train}
    assert not any(r["image"].tobytes() in seen for r in test)
    again = count_shapes_rows("test")
    assert all(
        a["image"].tobytes() == b["image"].tobytes() and a["answer"] == b["answer"] for a, b in zip(test, again)
    )  # the same every run
    assert torch.tensor([int(r["answer"]) for r in test]).float().mean().item() == pytest.approx(3, abs=0.3)


def test_a_decompression_bomb_is_a_bad_image_named_and_skippable(tiny_vlm_path, tmp_path):
    """20000x20000 (PIL refuses it unread) and 12000x12000 (past data.max_image_pixels) name the file and the row, and
    data.bad_images: skip leaves their rows out."""
    (tmp_path / "bomb.png").write_bytes(png_declaring(20000, 20000))
    (tmp_path / "huge.png").write_bytes(png_declaring(12000, 12000))
    (tmp_path / "ok.png").write_bytes(_png(pictures((56, 56, (0, 200, 0)))[0]))
    rows = [
        {"prompt": "ok", "image": "ok.png"},
        {"prompt": "bomb", "image": "bomb.png"},
        {"prompt": "h", "image": "huge.png"},
    ]
    data = write_jsonl(tmp_path / "train.jsonl", rows[:2])
    with pytest.raises(DataError) as err:
        module(data, tiny_vlm_path)
    assert str(err.value).startswith(
        f"{data}, row 1 (line 2): image 'bomb.png' is larger than PIL decodes (Image size (400000000 pixels) exceeds limit"
    )
    data = write_jsonl(tmp_path / "huge.jsonl", [rows[0], rows[2]])
    with pytest.raises(DataError) as err:
        module(data, tiny_vlm_path, oversize_images="refuse")
    assert str(err.value).startswith(
        f"{data}, row 1 (line 2): image 'huge.png' is 12000x12000 = 144000000 pixels, more than data.max_image_pixels=16777216"
    )
    data = write_jsonl(tmp_path / "all.jsonl", rows)
    with pytest.warns(UserWarning, match=r"skipping 2 of 3 row\(s\)"):
        dm = module(data, tiny_vlm_path, oversize_images="refuse", bad_images="skip", batch_size=1)
    assert dm.bad_images == {data: 2} and [r["prompt"] for r in dm.train_rows] == ["ok"]


def test_an_image_past_max_image_pixels_is_shrunk_to_fit(tiny_vlm_path, tmp_path):
    wide = pictures((300, 100, (0, 0, 200)))[0]
    wide.save(tmp_path / "wide.jpg", quality=95)
    data = write_jsonl(
        tmp_path / "train.jsonl", [{"prompt": "a", "image": "wide.jpg"}, {"prompt": "b", "image": "wide.jpg"}]
    )
    with pytest.warns(UserWarning, match=r"1 image\(s\) of .* larger than data.max_image_pixels=7500 were shrunk"):
        dm = module(data, tiny_vlm_path, max_image_pixels=7500, shuffle=False)
    assert [im.size for images in first_batch(dm).images for im in images] == [(150, 50), (150, 50)]  # 7500 pixels, 3:1


def test_an_image_is_decoded_once_while_the_cache_holds_it(tiny_vlm_path, tmp_path, monkeypatch):
    from PIL import Image

    for name, colour in (("a.png", (200, 0, 0)), ("b.png", (0, 200, 0))):
        pictures((56, 56, colour))[0].save(tmp_path / name)
    data = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "a", "image": "a.png"}, {"prompt": "b", "image": "b.png"}])
    opened = []
    real_open = Image.open
    monkeypatch.setattr(
        Image, "open", lambda fp, *a, **k: (opened.append(os.path.basename(fp)), real_open(fp, *a, **k))[1]
    )
    for cache_mb, decodes in ((1, ["a.png", "b.png"]), (0, ["a.png", "b.png"] * 4)):
        opened.clear()
        batches = iter(module(data, tiny_vlm_path, shuffle=False, image_cache_mb=cache_mb).train_dataloader())
        for _ in range(3):  # the rows' images are decoded when the data loads, then per batch only without a cache
            next(batches)
        assert opened == decodes


def test_a_pil_image_past_the_limit_is_reduced_without_touching_the_rows_own():
    from lightning_rl.data.images import ImageColumn

    image = pictures((301, 99, (0, 0, 200)))[0]
    column = ImageColumn(None, "rows built in Python", "image", max_pixels=7500)
    (reduced,) = column.images(image)
    assert reduced.size == (101, 33) and image.size == (301, 99)  # the least whole factor that fits: 3 (2 gives 7550)
    assert column.resized == 1
