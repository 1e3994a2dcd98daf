"""The prompt ids `VisionProcessor` builds for Qwen2-VL against transformers' own `Qwen2VLProcessor` (the sampler and the
trainer share our ids, so only an independent processor can tell a wrong expansion, e.g. the image-token counts given
to the placeholders in the wrong order)."""

from __future__ import annotations

from tests.support.vlm import check_prompt_ids_match_transformers_own_processor


def test_two_images_of_different_sizes_get_the_ids_of_transformers_own_processor():
    assert check_prompt_ids_match_transformers_own_processor() == [6, 2]  # each image's tokens in its own place
