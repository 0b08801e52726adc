"""api/chat_images.py without a server: what a chat request's image part may be, and each refusal a 400 naming it."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path

import pytest

from tunestudio.api.chat_images import MAX_IMAGE_BYTES, MAX_IMAGES, read_image, request_images
from tunestudio.api.errors import ApiError
from tunestudio.api.openai_chat import ChatMessage
from tunestudio.inference_protocol import ModelSpec
from tunestudio.paths import Roots

WHERE = "messages[0].content[0]"


def refused(url: str, folders: tuple[Path, ...] = ()) -> ApiError:
    with pytest.raises(ApiError) as caught:
        read_image(WHERE, url, folders)
    assert caught.value.status == 400 and caught.value.extra == {"field": WHERE}
    assert caught.value.message.startswith(WHERE)
    return caught.value


def test_a_data_url_s_bytes_and_a_file_inside_the_folders_are_read(tmp_path: Path) -> None:
    (tmp_path / "a b.png").write_bytes(b"\x89PNG picture")
    assert read_image(WHERE, "data:image/png;base64," + base64.b64encode(b"pixels").decode(), ()).data == b"pixels"
    assert read_image(WHERE, "data:;base64,cGl4", ()).data == b"pix"  # no media type: the worker decides
    for url in (str(tmp_path / "a b.png"), f"file://{tmp_path}/a%20b.png", f"file://localhost{tmp_path}/a b.png"):
        assert read_image(WHERE, url, (tmp_path,)).data == b"\x89PNG picture"


@pytest.mark.parametrize(("url", "code", "said"), [
    ("http://example.com/a.png", "image_url_not_fetched", "fetches nothing"),
    ("HTTPS://example.com/a.png", "image_url_not_fetched", "fetches nothing"),
    ("ftp://example.com/a.png", "invalid_image", "a data: URL"),
    ("relative/a.png", "invalid_image", "a data: URL"),
    ("data:image/png;base64,", "invalid_image", "empty"),
    ("data:image/png;base64,@@@@", "invalid_image", "base64 is not valid"),
    ("data:image/png;base64", "invalid_image", "base64-encoded"),
    ("data:application/pdf;base64,cGRm", "invalid_image", "not an image"),
    ("data:image/png;base64," + "A" * (MAX_IMAGE_BYTES * 4 // 3 + 8), "invalid_image", "over"),
    ("file://elsewhere/a.png", "invalid_image", "on this machine"),
])
def test_what_is_no_image_the_server_takes(url: str, code: str, said: str) -> None:
    error = refused(url)
    assert error.code == code and said in error.message


def test_paths_outside_the_folders_are_refused_alike_whether_they_exist_or_not(tmp_path: Path) -> None:
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    (outside / "real.png").write_bytes(b"x")
    (inside / "link.png").symlink_to(outside / "real.png")  # the resolved path is checked
    for url in (str(outside / "real.png"), str(outside / "none.png"), f"{inside}/../out/real.png",
                str(inside / "link.png"), "~nosuchuser/a.png"):
        assert refused(url, (inside,)).code == "path_not_allowed"


def test_what_inside_cannot_be_read_is_a_400_not_a_500(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")  # a read would wait for ever
    (tmp_path / "folder").mkdir()
    (tmp_path / "big.png").write_bytes(b"\0" * (MAX_IMAGE_BYTES + 1))
    cases = {str(tmp_path / "pipe"): "no file", str(tmp_path / "folder"): "no file",
             str(tmp_path / "missing.png"): "no file", str(tmp_path / ("n" * 5000)): "cannot be read",
             f"{tmp_path}/a\x00b.png": "not a path", str(tmp_path / "big.png"): "over"}
    for url, said in cases.items():
        error = refused(url, (tmp_path,))
        assert error.code == "invalid_image" and said in error.message, url


def spec(modality: str) -> ModelSpec:
    return ModelSpec("j", True, "m", "w", "full", "t", modality=modality)


def test_a_request_s_images_are_read_in_order_and_only_an_image_model_takes_them(tmp_path: Path) -> None:
    roots = Roots(tmp_path, (), ())
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [ChatMessage.model_validate(m) for m in [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "these two"}, part, part]}]]
    images = asyncio.run(request_images(messages, spec("image"), roots))
    assert [i.where for i in images] == ["messages[1].content[1]", "messages[1].content[2]"]
    assert asyncio.run(request_images(messages[:1], spec("text"), roots)) == ()  # text alone: nothing to read
    with pytest.raises(ApiError, match="reads no images") as caught:
        asyncio.run(request_images(messages, spec("text"), roots))
    assert caught.value.code == "image_not_supported" and caught.value.extra == {"field": "messages[1].content[1]"}
    many = [ChatMessage.model_validate({"role": "user", "content": [part] * (MAX_IMAGES + 1)})]
    with pytest.raises(ApiError, match=f"at most {MAX_IMAGES}"):
        asyncio.run(request_images(many, spec("image"), roots))


def test_a_turn_with_images_reaches_the_template_with_placeholders_in_place() -> None:
    turn = ChatMessage.model_validate({"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "data:,", "detail": "low"}},
        {"type": "text", "text": "b"}]})
    assert turn.plain()["content"] == [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]
    assert turn.text() == "ab"
    plain = ChatMessage.model_validate({"role": "user", "content": [{"type": "text", "text": "a"}]})
    assert plain.plain()["content"] == "a"  # without images a turn is as before: its text
