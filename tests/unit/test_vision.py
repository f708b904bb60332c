"""Image placeholders: expanded to their runs and keyed; a remote image cuts the hashing before it."""

from kvroute.router.contract.vision import VisionLayout, chat_text, place_images
from tests.support.vllm_keys import CASES

LAYOUT = VisionLayout(token="<image>", token_id=99, tokens_per_image=4)
IMAGE = CASES["one_image"]["images"][0]["data_uri"]


def test_images_render_as_placeholders_before_the_text_as_vllm_does_for_string_templates():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                         {"type": "image_url", "image_url": {"url": IMAGE}}]}]
    rendered, urls = chat_text(msgs, LAYOUT)
    assert rendered[0]["content"] == "<image>\nhi" and urls == [IMAGE]


def test_each_image_token_becomes_its_run_keyed_by_its_hash_and_offset():
    placed = place_images([5, 99, 6, 99, 7], [IMAGE, IMAGE], LAYOUT, "m")
    assert placed.ids == [5, 99, 99, 99, 99, 6, 99, 99, 99, 99, 7]
    assert [(k.offset, k.length) for k in placed.images] == [(1, 4), (6, 4)] and placed.hashable_tokens == -1


def test_a_remote_image_stops_the_keys_at_its_offset_and_says_why():
    placed = place_images([5, 99, 6, 99, 7], [IMAGE, "https://x.test/a.png"], LAYOUT, "m")
    assert len(placed.images) == 1 and placed.hashable_tokens == 6 and placed.unhashed == "remote_url"
    unplaced = place_images([5, 6], [IMAGE], LAYOUT, "m")  # no image token in the prompt
    assert unplaced.unhashed == "unplaced" and unplaced.hashable_tokens == 0
